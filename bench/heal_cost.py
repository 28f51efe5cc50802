#!/usr/bin/python3
"""What a heal costs in memory and time, beside a steady round of the same job.

Two learner processes (this script's `learner` mode) train an MLP of about
--params parameters in float32 with AdamW, synchronous rounds (with
--concurrent, concurrent ones) every --period steps, through mend_init on a
lighthouse of their own:

* steady: both train the whole job; each one's peak RSS, and a round's
  bytes sent over its time (GB/s, from the learners' round diagnostics);
* heal: learner b is SIGKILLed after its second round and started again at
  once; its first round heals it from learner a (the global state and the
  outer momentum, 8 bytes a parameter). The restarted b's peak RSS and the
  survivor a's, and the heal's bytes over its transfer time (GB/s).

Every round is a Nesterov step (outer_warmup_steps = 0), as in a job past
its outer warm-up. Peak RSS is each process's own high-water mark
(ru_maxrss), in bytes a parameter. Targets (issue 66): the healed learner's
peak at most 4 bytes a parameter above a steady learner's, and a heal's
GB/s no less than a round's. Prints a table and writes bench-results/heal_cost.csv.

    bench/heal_cost.py                       # 100 M parameters, about 3 minutes
    bench/heal_cost.py --params 25e6
    bench/heal_cost.py --concurrent          # concurrent rounds (mend's default)

It measures the mend of the build tree (build/python, or $MEND_BUILD_DIR's),
not an installed copy, when that tree has one.
"""
import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

from delay_sweep import print_table, write_csv  # this folder's

# The build tree's package first, for this process and the learners it starts.
_BUILT = os.path.join(os.environ.get("MEND_BUILD_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                    "..", "build")), "python")
if os.path.isdir(os.path.join(_BUILT, "mend")):
    sys.path.insert(0, _BUILT)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_BUILT, os.environ.get("PYTHONPATH")) if p)

TOKEN = "heal-cost-bench-token-0123456789"


def mlp(params):
    import torch
    width = 2048
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks), width


def learner(args):
    import torch
    import mend
    model, width = mlp(args.params)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2, sync_period_steps=args.period,
                             total_steps=args.steps, concurrent_outer_step=args.concurrent, outer_warmup_steps=0,
                             heartbeat_ms=100,
                             heartbeat_timeout_ms=3000, grace_window_ms=30000, log_level="warn",
                             dataplane_host="127.0.0.1", diagnostics_dir=args.diagnostics)
    runtime = mend.mend_init(model, config, args.id, optimizer=optimizer)
    generator = torch.Generator().manual_seed(sum(map(ord, args.id)))
    while not runtime.finished:
        x = torch.randn(8, width, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        runtime.report_tokens(8)
        optimizer.step()
        if args.ready and runtime.stats()["rounds"] >= 2:
            open(args.ready, "w").close()
            while True:
                signal.pause()  # killed here (SIGKILL) by the driver
    mend.mend_shutdown(model)
    with open(args.out, "w") as f:
        json.dump({"id": args.id, "params": params, "stats": runtime.stats(),
                   "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)


def rounds_of(diagnostics, learner_id):
    path = os.path.join(diagnostics, f"{learner_id}.rounds.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(case, args, work):
    import mend
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    diagnostics = os.path.join(work, case, "diagnostics")
    os.makedirs(diagnostics, exist_ok=True)
    house = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=100,
                                            heartbeat_timeout_ms=3000, log_level="warn"))

    def start(learner_id, ready=""):
        out = os.path.join(work, case, f"{learner_id}.json")
        argv = [sys.executable, os.path.abspath(__file__), "learner", "--id", learner_id] + (
            ["--concurrent"] if args.concurrent else []) + ["--lighthouse",
                house.address, "--params", str(args.params), "--period", str(args.period), "--steps",
                str(args.steps), "--diagnostics", diagnostics, "--out", out, "--ready", ready]
        return subprocess.Popen(argv), out

    try:
        a, a_out = start("a")
        ready = os.path.join(work, case, "b.ready") if case == "heal" else ""
        b, b_out = start("b", ready)
        if case == "heal":
            deadline = time.monotonic() + 600
            while not os.path.exists(ready):
                if time.monotonic() > deadline or b.poll() is not None:
                    raise RuntimeError("learner b never reached its second round")
                time.sleep(0.05)
            b.send_signal(signal.SIGKILL)
            b.wait()
            b, b_out = start("b")
        for process in (a, b):
            if process.wait(timeout=1200) != 0:
                raise RuntimeError(f"a learner of the {case} run exited {process.returncode}")
    finally:
        house.shutdown()
    seen = {learner_id: json.load(open(path)) for learner_id, path in (("a", a_out), ("b", b_out))}
    rows = []
    for learner_id, result in seen.items():
        records = [r for r in rounds_of(diagnostics, learner_id) if r.get("ok")]
        healed = [r for r in records if r.get("healed")]
        plain = [r for r in records if not r.get("healed") and not r.get("final_merge") and r.get("round_seconds")]
        row = {"case": case, "learner": learner_id + (" (restarted)" if case == "heal" and learner_id == "b" else ""),
               "params": result["params"], "peak_rss_gib": result["peak_rss"] / 2**30,
               "bytes_per_param": result["peak_rss"] / result["params"],
               "round_gb_s": (sum(r["bytes_sent"] for r in plain) / sum(r["round_seconds"] for r in plain) / 1e9
                              if plain else float("nan")),
               "heal_gb": healed[0]["heal_bytes"] / 1e9 if healed else float("nan"),
               "heal_s": healed[0]["heal_seconds"] if healed else float("nan"),
               "heal_gb_s": (healed[0]["heal_bytes"] / healed[0]["heal_seconds"] / 1e9
                             if healed and healed[0]["heal_seconds"] > 0 else float("nan"))}
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "learner"])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--period", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrent", action="store_true", help="concurrent rounds (the default config), not synchronous")
    parser.add_argument("--csv", default="bench-results/heal_cost.csv")
    # learner mode
    parser.add_argument("--id")
    parser.add_argument("--lighthouse")
    parser.add_argument("--diagnostics")
    parser.add_argument("--out")
    parser.add_argument("--ready", default="")
    args = parser.parse_args()
    args.params = int(args.params)
    if args.mode == "learner":
        learner(args)
        return
    import mend
    print(f"mend from {os.path.dirname(mend.__file__)}")
    with tempfile.TemporaryDirectory() as work:
        rows = run("steady", args, work) + run("heal", args, work)
    print_table(rows, [("case", "case", ""), ("learner", "learner", ""), ("params", "parameters", ",d"),
                       ("peak_rss_gib", "peak RSS GiB", ".2f"), ("bytes_per_param", "bytes/param", ".1f"),
                       ("round_gb_s", "round GB/s", ".2f"), ("heal_gb", "heal GB", ".2f"),
                       ("heal_s", "heal s", ".2f"), ("heal_gb_s", "heal GB/s", ".2f")])
    steady = max(r["bytes_per_param"] for r in rows if r["case"] == "steady")
    healed = [r for r in rows if r["learner"] == "b (restarted)"][0]
    round_rate = min(r["round_gb_s"] for r in rows if r["case"] == "steady")
    print(f"\nthe restarted learner's peak: {healed['bytes_per_param'] - steady:+.1f} bytes a parameter against a "
          f"steady learner's (target <= +4); its heal at {healed['heal_gb_s']:.2f} GB/s against a round's "
          f"{round_rate:.2f} GB/s (target >=)")
    write_csv(args.csv, rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
