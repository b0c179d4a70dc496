"""The Python README's example runs as written, against the real binary."""

from __future__ import annotations

import pathlib
import re

import torch

import rlhub

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(hub):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "python/README.md has no python example"
    code = "\n".join(blocks).replace("127.0.0.1:7470", hub.addr)
    net = torch.nn.Linear(4, 2)
    want = {k: v.clone() for k, v in net.state_dict().items()}
    scope = {"net": net}
    exec(compile(code, str(README), "exec"), scope)
    assert scope["v"].version == 1
    with rlhub.StoreClient(hub.addr) as sc:
        got = sc.pull("policy", framework="torch").tensors
    for k, v in want.items():
        assert torch.equal(got[k], v), k
        assert torch.equal(net.state_dict()[k], v), k
