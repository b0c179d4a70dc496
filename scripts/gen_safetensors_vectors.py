#!/usr/bin/env python3
"""Write safetensors test vectors with the reference Python library.

Each vector is a pair under internal/safetensors/testdata/vectors/:
  NAME.safetensors  bytes written by safetensors (Rust core, via Python)
  NAME.json         what they must decode to: metadata and, per tensor in
                    file order, dtype, shape and values (floats as numbers,
                    "nan"/"inf"/"-inf" as strings; BF16 as its float value)
The Go test (internal/safetensors/vectors_test.go) decodes every .safetensors
file, checks it against the .json, and re-encodes it byte for byte (except
metadata_multi: the library writes several metadata keys in hash order).

Usage: python3 scripts/gen_safetensors_vectors.py   (numpy, safetensors==0.8.0)
Deterministic except for metadata_multi (see above).
"""
import json
import math
import os
import sys

import numpy as np
import safetensors
from safetensors import _safetensors_rust as rust
from safetensors.numpy import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                   "internal", "safetensors", "testdata", "vectors")


def jsonable(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


def bf16_bits(values):
    """Round float32 values to bfloat16 (nearest, ties to even) bit patterns."""
    b = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write(name, tensors, metadata=None, bf16=None):
    """tensors: dict name -> np.ndarray; bf16: dict name -> uint16 bit array."""
    bf16 = bf16 or {}
    if bf16:
        keep = []
        specs = {}
        for k, v in tensors.items():
            v = np.require(v, requirements="C")  # keeps 0-d arrays 0-d
            keep.append(v)
            specs[k] = rust.TensorSpec(dtype=v.dtype.name, shape=v.shape,
                                       data_ptr=v.ctypes.data, data_len=v.nbytes)
        for k, bits in bf16.items():
            bits = np.require(bits, requirements="C")
            keep.append(bits)
            specs[k] = rust.TensorSpec(dtype="bfloat16", shape=bits.shape,
                                       data_ptr=bits.ctypes.data, data_len=bits.nbytes)
        blob = bytes(rust.serialize(specs, metadata=metadata))
    else:
        blob = save(tensors, metadata=metadata)

    # The expected decoding, in file order (by data offset), from the header
    # the library wrote and the arrays we gave it.
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    md = header.pop("__metadata__", None)
    order = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    expect = {"metadata": md, "tensors": []}
    for k, info in order:
        if k in bf16:
            vals = bf16_values(bf16[k]).reshape(-1)
        else:
            vals = np.asarray(tensors[k]).reshape(-1)
        expect["tensors"].append({
            "name": k, "dtype": info["dtype"], "shape": info["shape"],
            "values": [jsonable(v) for v in vals],
        })
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(blob)
    with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(expect, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    if safetensors.__version__ != "0.8.0":
        print(f"warning: safetensors {safetensors.__version__}, vectors were made with 0.8.0",
              file=sys.stderr)
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261130)

    write("f32_basic", {"weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
                        "bias": np.array([-1.5, 0.0, 3.25], dtype=np.float32)})

    write("dtypes", {
        "f64": rng.standard_normal(5),
        "f32": rng.standard_normal((2, 2)).astype(np.float32),
        "f16": np.array([0, 1, -2, 65504, 6e-8, 1 / 3, np.inf, -np.inf, np.nan], dtype=np.float16),
        "i64": np.array([-(2**63), -1, 0, 1, 2**63 - 1], dtype=np.int64),
        "i32": np.array([-(2**31), 7, 2**31 - 1], dtype=np.int32),
        "i16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.arange(0, 256, 17, dtype=np.uint8),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([True, False, True, True], dtype=np.bool_),
    })

    write("scalars", {"step": np.array(12345, dtype=np.int64),
                      "lr": np.array(3e-4, dtype=np.float32),
                      "done": np.array(True)})

    write("zero_size", {"empty": np.zeros((0,), dtype=np.float32),
                        "empty3d": np.zeros((3, 0, 2), dtype=np.float16),
                        "x": np.ones((2,), dtype=np.float32)})

    write("only_empty", {"nothing": np.zeros((0, 4), dtype=np.float64)})

    # With one metadata key the bytes are deterministic. With several, the
    # Rust core writes them in HashMap order, which changes from run to run:
    # "metadata_multi" is therefore checked by decoding only.
    write("metadata", {"w": np.full((2, 2), 0.5, dtype=np.float32)},
          metadata={"format": "pt"})
    write("metadata_multi", {"w": np.full((2,), 0.25, dtype=np.float32)},
          metadata={"format": "pt", "version": "7", "z": "last", "a": "first",
                    "ünï": "cödé ✓", "quote\"back\\slash": "tab\tnl\n"})

    write("unicode_names", {
        "poids.é": np.array([1.0], dtype=np.float32),
        "重み": np.array([2.0], dtype=np.float32),
        "emoji 😀": np.array([3.0], dtype=np.float32),
        "a\"b\\c": np.array([4.0], dtype=np.float32),
        "ctl\t\n\x01\x1f\x7f": np.array([5.0], dtype=np.float32),
        "<html>&'/": np.array([6.0], dtype=np.float32),
        "\u2028\u2029": np.array([7.0], dtype=np.float32),
    })

    bits = bf16_bits(np.concatenate([rng.standard_normal(13).astype(np.float32),
                                     np.array([0, -0.0, 1, np.inf, -np.inf], dtype=np.float32)]))
    write("bf16", {"f32": np.array([1.0, 2.0], dtype=np.float32),
                   "f16": np.array([0.5], dtype=np.float16)},
          bf16={"grad": bits.reshape(2, 9), "scalar": bf16_bits([2.5]).reshape(())})

    kinds = [np.float32, np.float16, np.float64, np.int64, np.uint8, np.int32]
    many = {}
    for i in range(300):
        dt = kinds[i % len(kinds)]
        shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 3))))
        vals = rng.standard_normal(shape) * 100
        many[f"layers.{i}.p{i % 7}"] = np.asarray(vals, dtype=dt)
    write("many", many)


if __name__ == "__main__":
    main()
