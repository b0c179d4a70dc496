import numpy as np
import pytest
import safetensors.numpy as stn

import rlhub


def sample():
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": np.arange(3, dtype=np.float16),
        "steps": np.array(7, dtype=np.int64),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 5), dtype=np.float64),
        "ünï": np.ones(2, dtype=np.uint8),
    }


def test_bytes_identical_to_safetensors_library():
    d = sample()
    assert rlhub.save_bytes(d) == stn.save(d)
    # The reference keeps metadata in a hash map, so only a single key has a
    # deterministic byte order there; rlhub always sorts metadata keys.
    md = {"format": "pt"}
    assert rlhub.save_bytes(d, md) == stn.save(d, metadata=md)
    multi = rlhub.save_bytes(d, {"x": "1", "a": "2"})
    assert multi.index(b'"a":"2"') < multi.index(b'"x":"1"')
    assert stn.load(multi).keys() == d.keys()


def test_round_trip_values_and_zero_copy():
    d = sample()
    blob = rlhub.save_bytes(d)
    back = rlhub.load_bytes(blob)
    assert set(back) == set(d)
    for k in d:
        assert back[k].dtype == d[k].dtype and back[k].shape == d[k].shape
        np.testing.assert_array_equal(back[k], d[k])
    assert not back["w"].flags.writeable  # a view over the immutable blob


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b[:5], "too short"),
    (lambda b: (10**12).to_bytes(8, "little") + b[8:], "out of bounds"),
    (lambda b: b[:8] + b"[" + b[9:], "malformed"),
    (lambda b: b.replace(b"F32", b"F99"), "unknown dtype"),
    (lambda b: b[:-1], "do not fit|trailing"),
    (lambda b: b + b"\0", "trailing"),
])
def test_malformed_blobs_rejected(mutate, match):
    blob = rlhub.save_bytes({"a": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match=match):
        rlhub.load_bytes(mutate(blob))


def test_torch_round_trip_including_bf16():
    torch = pytest.importorskip("torch", reason="torch is optional; CI installs it")
    sd = {"w": torch.randn(4, 3), "h": torch.randn(5).to(torch.bfloat16), "i": torch.arange(4)}
    blob = rlhub.save_bytes(sd)
    back = rlhub.load_bytes(blob, framework="torch")
    for k, v in sd.items():
        assert back[k].dtype == v.dtype
        assert torch.equal(back[k], v)
    # torch and numpy inputs of the same values encode the same bytes
    assert rlhub.save_bytes({"w": sd["w"]}) == rlhub.save_bytes({"w": sd["w"].numpy()})


def test_torch_tensors_view_a_writable_blob_and_copy_the_rest():
    torch = pytest.importorskip("torch", reason="torch is optional; CI installs it")
    import warnings

    sd = {"w": torch.randn(4, 3), "h": torch.randn(5).to(torch.bfloat16), "i": torch.arange(4)}
    blob = rlhub.save_bytes(sd)
    # A writable blob (as a pull gives): views, no copy; a write shows in it.
    buf = np.frombuffer(bytearray(blob), np.uint8)
    back = rlhub.load_bytes(buf, framework="torch")
    lo, hi = buf.ctypes.data, buf.ctypes.data + len(buf)
    for k, v in sd.items():
        assert torch.equal(back[k], v)
        assert lo <= back[k].data_ptr() < hi, k
    back["w"][0, 0] = 1234.5
    assert rlhub.load_bytes(buf, framework="torch")["w"][0, 0] == 1234.5
    # Read-only bytes: copies, without torch's warning about them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ro = rlhub.load_bytes(blob, framework="torch")
    ro["w"][0, 0] = 1.0
    assert rlhub.load_bytes(blob, framework="torch")["w"][0, 0] == sd["w"][0, 0]
    # Unaligned (the blob one byte into its buffer): copied, and equal.
    shifted = np.empty(len(blob) + 1, np.uint8)
    shifted[1:] = np.frombuffer(blob, np.uint8)
    mis = rlhub.load_bytes(memoryview(shifted)[1:], framework="torch")
    for k, v in sd.items():
        assert torch.equal(mis[k], v)
        assert mis[k].data_ptr() % mis[k].element_size() == 0


def test_save_parts_reuses_the_header_only_while_names_and_shapes_match():
    from rlhub.tensors import load_bytes, save_bytes, save_parts

    a = {"w": np.ones((3, 4), np.float32), "b": np.zeros(4, np.float32)}
    h1, _ = save_parts(a)
    h2, _ = save_parts({"w": np.full((3, 4), 2, np.float32), "b": np.ones(4, np.float32)})
    assert h1 is h2  # encoded once
    h3, _ = save_parts({"w": np.ones((4, 3), np.float32), "b": np.zeros(4, np.float32)})
    h4, _ = save_parts({"w": np.ones((3, 4), np.float64), "b": np.zeros(4, np.float32)})
    h5, _ = save_parts(a, {"k": "v"})
    assert len({h1, h3, h4, h5}) == 4
    for d in ({"w": np.ones((4, 3), np.float32), "b": np.zeros(4, np.float32)},
              {"w": np.ones((3, 4), np.float64), "b": np.zeros(4, np.float32)}):
        got = load_bytes(save_bytes(d))
        assert all(got[k].shape == d[k].shape and got[k].dtype == d[k].dtype for k in d)


def test_crc32c_without_the_native_library_warns_once_and_stays_correct(monkeypatch):
    import warnings

    from rlhub import _crc32c

    monkeypatch.setattr(_crc32c, "_FAST", None)
    monkeypatch.setattr(_crc32c, "_warned", False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _crc32c.crc32c(b"123456789") == 0xE3069283
        assert _crc32c.crc32c(b"123456789") == 0xE3069283
    assert len([x for x in w if "google-crc32c" in str(x.message)]) == 1
