#!/usr/bin/python3
"""What healing the inner optimizer buys: the chaos harness with learners
of 2 ranks, once without and once with heal_inner_optimizer per seed, each
against its own fault-free run of the same job.

For every seed and setting it runs

    mend chaos --ranks-per-learner 2 --steps STEPS --seed SEED \\
               --set heal_inner_optimizer=false|true --work-dir WORK/seedS-healX

and reads its report: the faults injected (kills restart a group with a
fresh inner optimizer), the final eval loss, the fault-free run's, and the
difference. The faults come at seeded times in seconds, so a run's faults
depend on the machine's speed as well as the seed; and the fault-free run
itself moves between runs (concurrent rounds meet at times that differ), so
the table also gives each setting's mean against the mean of every
fault-free run. It prints a table and writes bench-results/heal_optimizer.csv.

    bench/heal_optimizer.py                      # seeds 1-3, 1000 steps (about 20 minutes)
    bench/heal_optimizer.py --seeds 1,2,3,4,5,6
    bench/heal_optimizer.py --tabulate WORK      # the table of runs already made in WORK
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from delay_sweep import write_csv  # this folder's (the script's own directory is on sys.path)

SETTINGS = ("false", "true")


def run(mend, work, seed, heal, steps):
    os.makedirs(work, exist_ok=True)
    argv = [mend, "chaos", "--ranks-per-learner", "2", "--steps", str(steps), "--seed", str(seed),
            "--set", f"heal_inner_optimizer={heal}", "--work-dir", os.path.join(work, f"seed{seed}-heal{heal}")]
    print(" ".join(argv), file=sys.stderr, flush=True)
    # Exit status 1 is a failed invariant (the loss bound among them): the report is still written.
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)


def row(work, seed, heal):
    path = os.path.join(work, f"seed{seed}-heal{heal}", "chaos-report.json")
    with open(path) as f:
        report = json.load(f)
    kinds = [fault["kind"] for fault in report["faults"]]
    loss, reference = report["eval_loss"], report["reference_eval_loss"]
    return {"seed": seed, "heal_inner_optimizer": heal, "faults": len(kinds), "kills": kinds.count("kill"),
            "eval_loss": loss, "fault_free_eval_loss": reference,
            "vs_fault_free_pct": 100 * (loss / reference - 1) if reference else float("nan"),
            "losses_finite": report["losses_finite"], "passed": report["passed"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mend", default="build/mend")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--work", default="bench-results/heal_optimizer")
    parser.add_argument("--tabulate", metavar="WORK", help="only tabulate the runs in WORK")
    parser.add_argument("--csv", default="bench-results/heal_optimizer.csv")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    work = args.tabulate or args.work
    if not args.tabulate:
        for seed in seeds:
            for heal in SETTINGS:
                run(args.mend, work, seed, heal, args.steps)
    rows = [row(work, seed, heal) for seed in seeds for heal in SETTINGS]
    print(f"{'seed':>4} {'heal_inner_optimizer':>20} {'faults':>6} {'kills':>5} {'eval loss':>9} "
          f"{'fault-free':>10} {'vs fault-free':>13}")
    for r in rows:
        print(f"{r['seed']:>4} {r['heal_inner_optimizer']:>20} {r['faults']:>6} {r['kills']:>5} "
              f"{r['eval_loss']:>9.4f} {r['fault_free_eval_loss']:>10.4f} {r['vs_fault_free_pct']:>+12.2f}%")
    references = [r["fault_free_eval_loss"] for r in rows]
    mean_reference = statistics.mean(references)
    print(f"fault-free runs: mean {mean_reference:.4f}, {min(references):.4f}-{max(references):.4f} "
          f"({100 * (max(references) / min(references) - 1):.2f}% apart)")
    for heal in SETTINGS:
        mine = [r for r in rows if r["heal_inner_optimizer"] == heal]
        losses = [r["eval_loss"] for r in mine]
        print(f"heal_inner_optimizer={heal}: mean eval loss {statistics.mean(losses):.4f} "
              f"({100 * (statistics.mean(losses) / mean_reference - 1):+.2f}% against the mean fault-free), "
              f"{sum(r['kills'] for r in mine)} kills in {sum(r['faults'] for r in mine)} faults, "
              f"{sum(r['vs_fault_free_pct'] <= 1 for r in mine)} of "
              f"{len(mine)} within 1% of their own fault-free run")
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
