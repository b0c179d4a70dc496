"""A shared-memory segment holding a version that is not valid safetensors
(damaged, or written by a foreign writer): the Python reader refuses it with
rlhub.InvalidArgument, whatever the header's JSON holds, and the message
stays short however long the names or values in it are."""

import json
import os
import struct
import time

import pytest

import rlhub
from rlhub import wsync as ws
from rlhub._crc32c import crc32c


@pytest.fixture
def shm_path():
    p = f"/dev/shm/rlhub-pytest-bad-{os.getpid()}-{time.monotonic_ns()}"
    yield p
    if os.path.exists(p):
        os.unlink(p)


def _segment_with(path: str, blob: bytes) -> None:
    """A 3-slot segment (one lease entry) of a live writer (by pid: this
    process) whose slot 0 holds ``blob`` as version 1, whole, CRC right."""
    cap = (len(blob) + 4095) // 4096 * 4096
    b = bytearray(4096 + 3 * (4096 + cap))
    struct.pack_into("<8sIIQQQ", b, 0, b"RLHUBWS1", 1, 3, cap, 4096 + cap, os.getpid())
    struct.pack_into("<QIII", b, 48, 1, 1, 1, 0)  # published 1, name length 1, 1 lease entry
    b[64:65] = b"m"
    struct.pack_into("<QQQQI", b, 4096, 2, 1, 1, len(blob), crc32c(blob))  # seq 2, v1, epoch 1
    b[8192:8192 + len(blob)] = blob
    with open(path, "wb") as f:
        f.write(b)


def _safetensors(header: dict, data: bytes) -> bytes:
    j = json.dumps(header).encode()
    return struct.pack("<Q", len(j)) + j + data


BAD_HEADERS = {
    "offsets not numbers": {"w": {"dtype": "F32", "shape": [1], "data_offsets": ["a", "b"]}},
    "shape not a list": {"w": {"dtype": "F32", "shape": 5, "data_offsets": [0, 4]}},
    "dtype not a string": {"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}},
    "shape of strings": {"w": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}},
}


@pytest.mark.parametrize("lease", [False, True], ids=["copying", "leasing"])
@pytest.mark.parametrize("why", sorted(BAD_HEADERS))
def test_shm_version_with_a_malformed_header_is_invalid_argument(shm_path, lease, why):
    _segment_with(shm_path, _safetensors(BAD_HEADERS[why], b"\0" * 4))
    with ws.ShmSource(shm_path, lease=lease) as src:
        assert src.leasing is lease
        with pytest.raises(rlhub.InvalidArgument, match="version 1"):
            src.get_if_newer(0)


@pytest.mark.parametrize("lease", [False, True], ids=["copying", "leasing"])
def test_shm_version_error_does_not_echo_a_huge_name(shm_path, lease):
    name = "x" * (1 << 20)
    _segment_with(shm_path, _safetensors({name: {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4))
    with ws.ShmSource(shm_path, lease=lease) as src:
        with pytest.raises(rlhub.InvalidArgument, match="unknown dtype") as ei:
            src.get_if_newer(0)
    assert len(str(ei.value)) < 1000, f"error of {len(str(ei.value))} characters"


@pytest.mark.parametrize("lease", [False, True], ids=["copying", "leasing"])
def test_a_fifo_at_the_segment_path_is_refused_at_once(shm_path, lease):
    """A FIFO at the segment's path is refused with InvalidArgument at
    once: opening it for reading waited in open(2), with no deadline, for
    a writer that never comes."""
    import threading

    os.mkfifo(shm_path, 0o600)
    out = []

    def open_it():
        try:
            ws.ShmSource(shm_path, lease=lease).close()
            out.append(None)
        except Exception as e:  # noqa: BLE001 - the test looks at which
            out.append(e)

    t = threading.Thread(target=open_it, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(shm_path, os.O_WRONLY | os.O_NONBLOCK))  # a writer's open ends the wait
        t.join(10)
        pytest.fail("opening a FIFO as a segment still waiting after 10 s")
    assert isinstance(out[0], rlhub.InvalidArgument) and "not a regular file" in str(out[0]), out
