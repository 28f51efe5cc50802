"""What host staging costs a round: the same job with a model's CPU float32
parameters used in place (host_staging = auto) and copied through host
buffers at every round boundary (host_staging = always).

    /usr/bin/python3 bench/staging_cost.py [--mib 64] [--blocks 6] [--fragments 4 --concurrent]

One learner in a job of one (quorum_min_learners = 1), an embedded
lighthouse, a model of 8 Linear layers holding --mib MiB of float32
parameters, plain SGD, a synchronous round every --period steps (with
--fragments P, a round of one fragment every period / P steps; with
--concurrent, rounds overlap the steps, taken up one step later). Blocks of
--steps steps alternate between the two settings; per block the mean time
of a step that starts or takes up a round and of one that does not, and the
staging seconds and bytes mend reports per round: a round stages its
fragment alone where it can (concurrent), every fragment where it cannot
know which beforehand (synchronous). Prints a table and writes a CSV. On this CPU-only
machine the copies are memcpy-like; on a GPU the same code copies between
the device and pinned host memory.
"""
import argparse
import csv
import os
import statistics
import time

import torch

import mend


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=64)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--period", type=int, default=5)
    p.add_argument("--fragments", type=int, default=1)
    p.add_argument("--concurrent", action="store_true")
    p.add_argument("--csv", default="bench-results/staging_cost.csv")
    args = p.parse_args()
    os.environ.setdefault("MEND_JOB_TOKEN", "bench-token-0123456789")
    torch.set_num_threads(1)
    width = int((args.mib * 2**20 / 4 / 8) ** 0.5)
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(8)])
    parameters = sum(q.numel() for q in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, width)
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                                 log_level="warn"))
    results = {s: {"round": [], "other": [], "staging": [], "bytes": []} for s in ("auto", "always")}
    for block in range(args.blocks):
        for staging in ("auto", "always"):
            config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1,
                                     sync_period_steps=args.period, fragments=args.fragments,
                                     concurrent_outer_step=args.concurrent, overlap_steps=1,
                                     host_staging=staging, log_level="warn")
            runtime = mend.mend_init(model, config, f"staging-{staging}-{block}", optimizer=optimizer)
            rounds, others = [], []
            before = runtime.stats()
            for step in range(1, args.steps + 1):
                t0 = time.perf_counter()
                loss = model(x).square().mean()
                runtime.report_tokens(x.shape[0])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seconds = time.perf_counter() - t0
                now = runtime.stats()
                moved = (now["rounds"], now["rounds_started"]) != (before["rounds"], before["rounds_started"])
                (rounds if moved else others).append(seconds)
                before = now
            stats = runtime.stats()
            mend.mend_shutdown(model)
            r = results[staging]
            r["round"].append(statistics.mean(rounds))
            r["other"].append(statistics.mean(others))
            r["staging"].append(stats["staging_seconds"] / max(1, stats["rounds"]))
            r["bytes"].append(stats.get("staging_bytes", 0) / max(1, stats["rounds"]))
    lighthouse.shutdown()
    rows = []
    for staging in ("auto", "always"):
        r = results[staging]
        rows.append((staging, statistics.median(r["round"]) * 1e3, statistics.median(r["other"]) * 1e3,
                     statistics.median(r["staging"]) * 1e3, statistics.median(r["bytes"]) / 2**20))
    extra = rows[1][1] - rows[0][1]
    mode = "concurrent" if args.concurrent else "synchronous"
    print(f"staging cost: {parameters} parameters ({parameters * 4 / 2**20:.1f} MiB fp32), H = {args.period}, "
          f"{args.fragments} fragment(s), {mode}, {args.blocks} blocks x {args.steps} steps, 1 thread\n")
    print(f"{'host_staging':<14} {'round step ms':>14} {'other step ms':>14} {'staging ms/round':>17} "
          f"{'staged MiB/round':>17}")
    for staging, round_ms, other_ms, staging_ms, mib in rows:
        print(f"{staging:<14} {round_ms:>14.1f} {other_ms:>14.1f} {staging_ms:>17.1f} {mib:>17.1f}")
    print(f"\nalways - auto, a round's step: {extra:+.1f} ms")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["host_staging", "round_step_ms", "other_step_ms", "staging_ms_per_round",
                    "staged_mib_per_round", "parameters", "fragments", "mode"])
        for row in rows:
            w.writerow([*row, parameters, args.fragments, mode])
    print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
