"""The numpy ARS noise generator matches the shared vectors bit for bit."""

import json
import pathlib

import numpy as np

from rlhub import ars_noise

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "testdata" / "ars_noise.json"


def load():
    return json.loads(VECTORS.read_text())


def test_philox_known_answers():
    for v in load()["philox4x32_10"]:
        out = ars_noise.philox4x32([v["ctr"]], v["key"])[0]
        assert [int(x) for x in out] == v["out"]


def test_normals_bit_identical_to_go():
    for v in load()["normals"]:
        z = ars_noise.normals(len(v["bits"]), v["seed"], v["tag"], v["index"])
        got = [f"{int(b):016x}" for b in z.view(np.uint64)]
        assert got == v["bits"], (v["seed"], v["tag"], v["index"])


def test_episode_seeds():
    for v in load()["episode_seeds"]:
        a, b = ars_noise.episode_seed(v["seed"], v["index"])
        assert [f"{a:016x}", f"{b:016x}"] == v["words"]


def test_normals_are_standard_and_deterministic():
    z = ars_noise.direction(1 << 16, 3, 11)
    assert abs(z.mean()) < 0.02 and abs(z.var() - 1) < 0.03
    np.testing.assert_array_equal(z[:10], ars_noise.direction(10, 3, 11))
    assert ars_noise.direction(4, 3, 12)[0] != z[0]
