"""DI-engine's LearnerAggregator merge rule, against the real hub.

``reference_merge`` is written from DI-engine's rule (its
``LearnerAggregator.merge_info``): the first learner's value decides --
None -> as is (the list of values); int/str/float -> the list of the
values; list/tuple -> concatenated; dict -> merged key by key recursively,
homogeneous keys taking the first learner's value; anything else -> a type
error. Three Python learners attached to a real ``rlhub serve`` return nested
info of every type; the hub's merge must equal the reference, integers
staying integers.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest

from rlhub import errors
from rlhub.aggregator import AggregatorClient
from rlhub.learner import Demand, Learner
from conftest import Hub
from test_learner import wait_attached

DI_HOMOGENEOUS = ["learner_step", "buffer_id", "task_id", "learner_done"]


def reference_merge(infos, homogeneous_keys=DI_HOMOGENEOUS):
    elem = infos[0]
    if elem is None:
        return infos
    if isinstance(elem, (int, str, float)):  # bool is an int, as in DI-engine
        return infos
    if isinstance(elem, (list, tuple)):
        return list(functools.reduce(lambda x, y: x + y, infos))
    if isinstance(elem, dict):
        out = {}
        for k in elem.keys():
            if k in homogeneous_keys:
                out[k] = elem[k]
            else:
                out[k] = reference_merge([e[k] for e in infos], homogeneous_keys)
        return out
    raise TypeError(f"not support type: {type(elem)}")


def plain(v):
    """The info as it travels: tuples are lists, numpy scalars Python's."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def same(a, b, path="info"):
    """Equality that also tells ints, floats and bools apart."""
    assert type(a) is type(b), f"{path}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def nested_info(i: int, step: int):
    """Learner i's info: every type, nested, homogeneous keys at two depths."""
    return {
        "learner_step": step + i,  # homogeneous: the first learner's wins
        "learner_done": i == 2,
        "task_id": f"t-{i}",
        "buffer_id": i,
        "count": 10 + i,  # int -> list of ints
        "big": (1 << 62) + i,  # beyond a double's 53-bit mantissa
        "loss": 0.5 * (i + 1),  # float -> list of floats
        "name": f"L{i}",
        "flag": i % 2 == 0,  # bool -> list of bools
        "nothing": None if i == 0 else i,  # first None: the values as they are
        "mixed": [1, "two", 3.0, None, True][i:i + 2],  # lists concatenate
        "pair": (i, float(i)),  # a tuple concatenates like a list
        "np": np.int64(7 * i),
        "npf": np.float32(0.25 * i),
        "arr": np.arange(i, dtype=np.int32),  # an array is a list
        "empty": [],
        "stats": {  # dicts merge recursively
            "n": i,
            "buffer_id": f"buf{i}",  # homogeneous inside a dict too
            "hist": [i] * i,
            "deep": {"x": float(i), "tags": ("a",) * (i + 1), "none": None, "learner_step": -i},
            "list_of_dicts": [{"k": i}],
        },
        "scalar_then_dict": i if i == 0 else {"i": i},  # first is an int: values as they are
    }


class NestedLearner(Learner):
    def __init__(self, addr, i, info=nested_info):
        super().__init__(addr, f"L{i}", resources={"gpu": "1"})
        self.i, self.info = i, info

    def on_demand(self, task_id):
        return Demand(4)

    def on_learn(self, task):
        return self.info(self.i, int(task.metadata["step"]))


@contextlib.contextmanager
def three_learners(addr, info=nested_info):
    """L0, L1, L2 attached in that order (the aggregator's learner order)."""
    with AggregatorClient(addr) as agg, contextlib.ExitStack() as stack:
        for i in range(3):
            stack.enter_context(NestedLearner(addr, i, info))
            wait_attached(agg, i + 1)
        yield agg


def batch(n):
    return {"x": np.arange(n, dtype=np.float32)}


def test_di_engine_merge_equals_reference_with_three_learners(hub):
    with three_learners(hub.addr) as agg:
        assert agg.resource() == {"gpu": 3}  # DI-engine's resource task
        task = agg.start("t").task_id
        agg.get_data_demand(task)
        for step in (0, 5):
            res = agg.learn(task, batch(12), metadata={"step": str(step)})
            order = [int(s.learner_id[1:]) for s in res.shares]
            assert order == [0, 1, 2] and all(s.rows == 4 for s in res.shares)
            infos = [plain(nested_info(i, step)) for i in order]  # row order
            want = reference_merge(infos)
            same(res.info, want)
            # Spot checks of the rule itself, so the test cannot pass with a
            # reference that agrees with a wrong hub.
            assert res.info["learner_step"] == step + order[0] and isinstance(res.info["learner_step"], int)
            assert res.info["big"] == [(1 << 62) + i for i in order]
            assert res.info["stats"]["buffer_id"] == f"buf{order[0]}"
            assert res.info["stats"]["deep"]["tags"] == ["a"] * sum(i + 1 for i in order)
            assert res.info["stats"]["deep"]["learner_step"] == -order[0]


def test_per_task_merge_options_and_strict_rule(hub):
    with three_learners(hub.addr) as agg:
        # Own homogeneous keys for this task: "count" single, "learner_step" a list.
        agg.start("own", homogeneous_keys=["count"])
        agg.get_data_demand("own")
        res = agg.learn("own", batch(12), metadata={"step": "1"})
        order = [int(s.learner_id[1:]) for s in res.shares]
        same(res.info, reference_merge([plain(nested_info(i, 1)) for i in order], ["count"]))
        assert res.info["count"] == 10 + order[0]
        # The strict rule refuses a homogeneous key differing across learners.
        agg.start("strict", merge="strict")
        agg.get_data_demand("strict")
        with pytest.raises(errors.InvalidArgument, match="homogeneous info key"):
            agg.learn("strict", batch(12), metadata={"step": "1"})
        with pytest.raises(errors.InvalidArgument, match="merge rule"):
            agg.start("bad", merge="bogus")


def test_serve_flag_sets_homogeneous_keys(rlhub_bin, tmp_path):
    h = Hub(rlhub_bin, tmp_path, extra=["--aggregator-homogeneous-keys", "name,count"])
    try:
        with three_learners(h.addr) as agg:
            agg.start("t")
            agg.get_data_demand("t")
            res = agg.learn("t", batch(12), metadata={"step": "2"})
            order = [int(s.learner_id[1:]) for s in res.shares]
            same(res.info, reference_merge([plain(nested_info(i, 2)) for i in order], ["name", "count"]))
            assert isinstance(res.info["learner_step"], list)
    finally:
        h.stop()


@pytest.mark.parametrize("first,other", [
    ({"d": {"k": 1}}, {"d": 2}),  # a dict, then not a dict
    ({"l": [1]}, {"l": 2}),  # a list, then not a list
    ({"d": {"k": 1}}, {"d": {}}),  # a key the first learner has is missing
])
def test_merge_errors_where_the_reference_raises(hub, first, other):
    def info(i, step):
        return first if i == 0 else other

    with pytest.raises((TypeError, KeyError)):
        reference_merge([first, other, other])
    with three_learners(hub.addr, info) as agg:
        agg.start("t")
        agg.get_data_demand("t")
        with pytest.raises(errors.InvalidArgument, match='learner "L1"'):
            agg.learn("t", batch(12), metadata={"step": "0"})
