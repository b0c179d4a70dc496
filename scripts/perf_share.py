#!/usr/bin/env python3
"""Where a hub's CPU goes, per store push: perf samples by frame, per process.

For the replication-cost profiles (docs/benchlog/2026-12-02-s14-repl8.md):
record the hubs of a BenchmarkReplicationCost run, then compare the single
hub with the cluster primaries by what each spends per sample of its store
push (the work both do alike), so that runs of different rates compare.

    perf record -F 999 -g -o perf.data -p PID1,PID2,... -- sleep 100
    perf script -i perf.data -F pid,time,ip,sym > perf.txt
    scripts/perf_share.py perf.txt PID1 PID2 ...              # categories
    scripts/perf_share.py --serial perf.txt PID1 PID2 ...     # serial-push phase only
    scripts/perf_share.py --under 'replica.(*Source).ship' perf.txt PID

Each sample counts once, in the first category (in the order below) with
a frame anywhere in its stack. --serial keeps only each process's 100 ms
bins with store pushes and no pull reply or optimizer step (the
benchmark's one-client push loop). --under lists the frames below FRAME
(inclusive) in the samples that hold it.
"""
import argparse
import collections
import re

CATEGORIES = [
    ("page fault", "asm_exc_page_fault"),
    ("replica ship (units to standbys)", "replica.(*Source).ship"),
    ("replica readAcks", "replica.(*Source).readAcks"),
    ("replica scanLoop", "replica.(*Source).scanLoop"),
    ("store File.Push", "store.(*File).Push"),
    ("store push rpc, other", "storerpc.(*Service).push"),
    ("pull replies", "replySnapshot"),
    ("reducer", "internal/reducer."),
    ("grpc, other", "google.golang.org/grpc"),
    ("data plane, other", "wire/bulk"),
    ("etcd client", "go.etcd.io"),
    ("cluster node", "replica.(*Node)"),
    ("runtime.sysmon", "runtime.sysmon"),
    ("GC workers", "runtime.gcBgMarkWorker"),
    ("scheduler", "runtime.schedule"),
    ("other", ""),
]


def read(path, pids):
    """Yields (pid, time, frames leaf first) for the samples of pids."""
    pid, t, frames = None, 0.0, []
    with open(path) as f:
        for line in f:
            if not line.strip():
                if pid in pids:
                    yield pid, t, frames
                pid, frames = None, []
            elif not line.startswith("\t"):
                m = re.match(r"\s*(\d+)(?:/\d+)?\s+(?:([\d.]+):)?", line)
                pid, t = m.group(1), float(m.group(2) or 0)
            else:
                parts = line.strip().split(None, 1)
                frames.append(parts[-1])
    if pid in pids:
        yield pid, t, frames


def serial(samples):
    bins = collections.defaultdict(list)
    for t, fs in samples:
        bins[int(t * 10)].append(fs)
    keep = []
    for fss in bins.values():
        pushes = any(any("store.(*File).Push" in x for x in fs) for fs in fss)
        other = any(any("replySnapshot" in x or "optim." in x for x in fs) for fs in fss)
        if pushes and not other:
            keep.extend(fss)
    return keep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--norm", default="store.(*File).Push", help="frame to count per (default: the store push)")
    ap.add_argument("--serial", action="store_true", help="only the serial-push phase's bins")
    ap.add_argument("--under", help="list the frames under this one (inclusive shares)")
    ap.add_argument("perf_txt")
    ap.add_argument("pids", nargs="+")
    a = ap.parse_args()
    per = collections.defaultdict(list)
    for pid, t, fs in read(a.perf_txt, set(a.pids)):
        per[pid].append((t, fs))
    stacks = {p: (serial(per[p]) if a.serial else [fs for _, fs in per[p]]) for p in a.pids}
    norm = {p: max(1, sum(any(a.norm in x for x in fs) for fs in stacks[p])) for p in a.pids}
    if a.under:
        for p in a.pids:
            c, n = collections.Counter(), 0
            for fs in stacks[p]:
                idx = [i for i, x in enumerate(fs) if a.under in x]
                if idx:
                    n += 1
                    c.update(set(fs[: idx[-1] + 1]))
            print(f"{p}: {a.under} in {n} of {len(stacks[p])} samples, {n / norm[p]:.3f} per {a.norm} sample")
            for k, v in c.most_common(40):
                print(f"  {v / norm[p]:7.3f}  {k}")
        return
    print(f"{'per ' + a.norm + ' sample':40}" + "".join(f"{p:>18}" for p in a.pids))
    print(f"{'samples':40}" + "".join(f"{len(stacks[p]):>18}" for p in a.pids))
    print(f"{'all':40}" + "".join(f"{len(stacks[p]) / norm[p]:>18.3f}" for p in a.pids))
    counts = {p: collections.Counter() for p in a.pids}
    for p in a.pids:
        for fs in stacks[p]:
            for name, key in CATEGORIES:
                if any(key in x for x in fs):
                    counts[p][name] += 1
                    break
    for name, _ in CATEGORIES:
        row = "".join(f"{counts[p][name] / norm[p]:>10.3f} ({100 * counts[p][name] / max(1, len(stacks[p])):4.1f}%)" for p in a.pids)
        print(f"{name:40}{row}")


if __name__ == "__main__":
    main()
