#!/usr/bin/env python3
"""One Python pull against plain TCP of the same bytes, same run, reps interleaved.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    python3 scripts/bench_python_pull.py

For a 1,001,000- and a 25M-parameter float32 model (4 MB, 100 MB): a
Python TCP read of the same bytes with recv_into into a reused buffer
(the baseline), StoreClient.pull (data plane, fresh buffer),
StoreClient.pull_into (data plane, reused buffer + copy into the torch
tensor) and StoreClient(transport="grpc").pull, medians. Reported, never
asserted.
"""
import os, pathlib, sys, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python")); sys.path.insert(0, str(REPO / "scripts"))
import numpy as np, torch, socket, threading
from benchhub import Hub
import rlhub
for n in (1_001_000, 25_000_000):
  with Hub(str(REPO / "bin" / "rlhub")) as hub:
    sc = rlhub.StoreClient(hub.addr); g = rlhub.StoreClient(hub.addr, transport="grpc")
    sd = {"w": torch.ones(n)}
    sc.push("m", sd, version=1)
    tgt = {"w": torch.zeros(n)}
    nb = len(sc.pull("m").blob)
    data=np.ones(nb,np.uint8)
    ls=socket.socket(); ls.bind(("127.0.0.1",0)); ls.listen()
    def srv():
        c,_=ls.accept()
        while c.recv(1): c.sendall(data)
    threading.Thread(target=srv,daemon=True).start()
    cs=socket.create_connection(ls.getsockname()); mv=memoryview(np.empty(nb,np.uint8))
    def tcp():
        cs.sendall(b"x"); got=0
        while got<nb: got+=cs.recv_into(mv[got:])
    res={"tcp":[], "pull":[], "pull_into":[], "grpc pull":[]}
    reps = 40 if n < 2e6 else 8
    for _ in range(reps):
        for k,f in (("tcp",tcp),("pull",lambda: sc.pull("m")),("pull_into",lambda: sc.pull_into("m",tgt)),("grpc pull",lambda: g.pull("m"))):
            t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
    med={k: np.median(v) for k,v in res.items()}
    print(f"{nb/1e6:.1f} MB, load {os.getloadavg()[0]:.1f}: " + ", ".join(f"{k} {med[k]*1e3:.2f} ms ({nb/med[k]/1e9:.2f} GB/s, {med['tcp']/med[k]:.2f}x tcp rate)" for k in med))
