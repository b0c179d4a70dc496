#!/usr/bin/env python3
"""Where the time goes per gradient, Python client vs Go client, one hub.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    N=300 REPS=3 python3 scripts/bench_push_budget.py

2 learners (Python: GradClient + StoreClient.pull_into; Go: `rlhub
bench-loop`) push a 1,001,000-parameter gradient to one `rlhub serve` with
--reduce-batch-size 2 (SGD, sum), push only and push + pull loop,
interleaved rep by rep. Per mode and client: gradients/s from the learners'
own clocks (first push to last answer, so process start-up and exit are
not counted), the p50 of one iteration, the learner's user and system CPU
per push (getrusage; Go's includes its start-up), and the hub's CPU per
gradient (/proc/PID/stat over the run). SHOW=1 prints each Python
learner's tail. Reported, never asserted (Linux only: /proc).
"""
import json, os, pathlib, resource, statistics, subprocess, sys, time
REPO = str(pathlib.Path(__file__).resolve().parents[1])
sys.path.insert(0, REPO + "/python"); sys.path.insert(0, REPO + "/scripts")
N = int(os.environ.get("N", "300")); REPS = int(os.environ.get("REPS", "3"))
TICK = os.sysconf("SC_CLK_TCK")

def learner(hub, model, cid, mode):
    import torch, rlhub
    from rlhub.grads import GradClient
    torch.set_num_threads(1)
    m = torch.nn.Linear(1000, 1000)
    grads = {"weight": torch.full((1000, 1000), 1e-6), "bias": torch.full((1000,), 1e-6)}
    gc = GradClient(hub, client_id=cid); sc = rlhub.StoreClient(hub)
    base = sc.pull_into(model, m)
    for _ in range(3):
        gc.push(model, base, grads)
    print("ready", flush=True); sys.stdin.readline()
    lat = []; att = []
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter(); ns0 = time.time_ns()
    for _ in range(N):
        ts = time.perf_counter()
        rc = gc.push(model, base, grads)
        att.append(rc.attempts)
        if mode == "loop":
            v = sc.pull_into(model, m, if_newer_than=base)
            if v is not None:
                base = v
        lat.append((time.perf_counter() - ts) * 1e3)
    wall = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"start": ns0, "end": time.time_ns(), "p50": statistics.median(lat), "rate": N / wall, "user": (r1.ru_utime - r0.ru_utime) / N * 1e3,
                      "sys": (r1.ru_stime - r0.ru_stime) / N * 1e3,
                      "p90": sorted(lat)[int(N*0.9)], "max": max(lat), "mean": statistics.mean(lat), "retried": sum(a > 1 for a in att), "attempts": sum(att)}), flush=True)

def hub_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "learner":
        learner(*sys.argv[2:6]); sys.exit()
    from benchhub import Hub, add_loop_models
    hub = Hub(REPO + "/bin/rlhub", "--reduce-batch-size", "2", "--max-wait", "1s")
    res = {}
    try:
        add_loop_models(hub.addr)
        loads = []
        for rep in range(REPS):
            for mode in ("push", "loop"):
                for kind in (("py", "go") if rep % 2 == 0 else ("go", "py")):
                    at = time.time_ns()
                    if kind == "py":
                        cmds = [[sys.executable, __file__, "learner", hub.addr, "py", f"p{i}-{at}", mode] for i in range(2)]
                    else:
                        cmds = [[REPO + "/bin/rlhub", "bench-loop", "--hub", hub.addr, "--model", "go", "--mode", mode,
                                 "--iters", str(N), "--id", f"g{i}-{at}", "--ready"] for i in range(2)]
                    ps = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for c in cmds]
                    for p in ps:
                        assert p.stdout.readline().strip() == "ready"
                    h0 = hub_cpu(hub.proc.pid); c0 = resource.getrusage(resource.RUSAGE_CHILDREN); t0 = time.perf_counter()
                    for p in ps:
                        p.stdin.write("go\n"); p.stdin.flush()
                    outs = [p.communicate()[0] for p in ps]
                    wall = time.perf_counter() - t0; h1 = hub_cpu(hub.proc.pid); c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    n = 2 * N
                    row = {"rate": n / wall, "hub_cpu": (h1 - h0) / n * 1e3}
                    if kind == "py":
                        js = [json.loads(o.strip().splitlines()[-1]) for o in outs]
                        if os.environ.get("SHOW"): print(mode, js, flush=True)
                        row["rate"] = n / ((max(j["end"] for j in js) - min(j["start"] for j in js)) / 1e9)
                        row.update(p50=statistics.median(j["p50"] for j in js), user=statistics.mean(j["user"] for j in js),
                                   sys=statistics.mean(j["sys"] for j in js))
                    else:
                        lat = []; ends = []; starts = []
                        for o in outs:
                            for l in o.splitlines():
                                if l.startswith("{"):
                                    r = json.loads(l); lat.append((r["end"] - r["push_start"]) / 1e6)
                                    starts.append(r["push_start"]); ends.append(r["end"])
                        row["rate"] = n / ((max(ends) - min(starts)) / 1e9)
                        if os.environ.get("SHOW"):
                            sl = sorted(lat); print(mode, "go p50 %.2f p90 %.2f max %.2f mean %.2f" % (sl[len(sl)//2], sl[int(len(sl)*0.9)], sl[-1], statistics.mean(sl)), flush=True)
                        # Go's CPU includes its start-up and 1 untimed iteration (a few ms over 600 pushes).
                        row.update(p50=statistics.median(lat), user=(c1.ru_utime - c0.ru_utime) / n * 1e3,
                                   sys=(c1.ru_stime - c0.ru_stime) / n * 1e3)
                    res.setdefault((kind, mode), []).append(row)
            loads.append(os.getloadavg()[0])
    finally:
        hub.stop()
    print(f"{time.strftime('%H:%M', time.gmtime())} UTC, {REPS} reps × {N} pushes per learner, 2 learners, load per rep {', '.join(f'{x:.1f}' for x in loads)}")
    print("| mode | client | gradients/s (learners' own clocks) | p50 ms per iteration | learner user CPU ms | learner sys CPU ms | hub CPU ms per gradient |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("push", "loop"):
        for kind in ("py", "go"):
            rs = res[(kind, mode)]
            med = lambda k: statistics.median(r[k] for r in rs)
            print(f"| {mode} | {kind} | {med('rate'):.0f} | {med('p50'):.2f} | {med('user'):.2f} | {med('sys'):.2f} | {med('hub_cpu'):.2f} |")
    for mode in ("push", "loop"):
        rs = [p["rate"] / g["rate"] for p, g in zip(res[("py", mode)], res[("go", mode)])]
        print(f"{mode}: Python ÷ Go gradients/s per rep: {', '.join(f'{x:.2f}' for x in rs)} (median {statistics.median(rs):.2f})")
