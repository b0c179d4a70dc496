#!/usr/bin/env python3
"""How long a Python data-plane pull in flight on a stopped primary takes
to be answered by the new one (issue 15, the client half).

    PYTHONPATH=python python3 scripts/bench_python_watch.py [--reps 8] [--bin bin/rlhub]

Each rep: one etcd and three `rlhub serve --etcd` hubs (1 s lease), a
StoreClient given etcd:// (timeout 60 s) with a data-plane connection to
the primary; the primary is SIGSTOPped (as a machine that stops
answering: connections open and silent) and the time from the stop to the
answer of the next pull is taken. The client's election watch ends the
pull held by the stopped primary and it is sent again to the new one;
without the watch it would wait out its 60 s timeout. Reported, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python" / "tests"))

import numpy as np  # noqa: E402

import rlhub  # noqa: E402
from rlhub import _channel  # noqa: E402
from etcdproc import sigstop, start_cluster  # noqa: E402


def one(binary: str) -> float:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rlhub-watch-"))
    etcd, hubs = start_cluster(binary, tmp, "watch")
    try:
        with rlhub.StoreClient(_channel.etcd_target(etcd.url, "watch"), timeout=60.0, retries=4) as store:
            store.push("m", {"w": np.zeros(1 << 18, np.float32)}, version=1, expect=0)
            store.pull("m")  # the data-plane connection to the primary
            lead = etcd.leader("watch")
            assert lead is not None
            sigstop(hubs[lead[0]].proc)
            t0 = time.monotonic()
            store.pull("m")
            return time.monotonic() - t0
    finally:
        for h in hubs.values():
            h.proc.send_signal(signal.SIGKILL)
            h.stop()
        etcd.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--bin", default=os.environ.get("RLHUB_BIN", str(REPO / "bin" / "rlhub")))
    args = ap.parse_args()
    got = [one(args.bin) for _ in range(args.reps)]
    print(f"stop → in-flight pull answered by the new primary, 1 s lease, {len(got)} reps: "
          f"p50 {statistics.median(got):.2f} s, max {max(got):.2f} s (each: {', '.join(f'{x:.2f}' for x in got)}); "
          f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
