#!/usr/bin/python3
"""The delay sweep: how much of local training's speed the overlapped
(streaming) mode keeps as the latency per collective grows.

For each delay it runs `mend demo --delay-ms D --sync-every H --steps N
--modes streaming,local` (local measured side by side, in the same run),
reads each learner's result file and round records, prints a table and
writes a CSV: tokens/s of both modes and their ratio, streaming's held-out
loss (and its change from the sweep's first delay), the final merge's time,
both modes' inner-step times and the share of their training time outside
the inner steps (the reducer and its waits: what the overlap itself costs),
streaming's median step time with none of a learner's rounds in flight and
with one (from the same run, so free of the machine's drift between runs),
how much slower streaming's slowest learner stepped than its fastest and the
largest share of a learner's time outside its steps (a round waits for its
last member, so the faster learner waits once their lag outgrows the slack
between a round's time and its fragment's period), the tau and rounds in
flight chosen, and how many rounds a step waited for.

    bench/delay_sweep.py                           # 0 500 1000 2000 4000 ms, H 100, 1200 steps
    bench/delay_sweep.py --repeat 3                # three runs of it (the modes' order
                                                   # alternating), and their medians
    bench/delay_sweep.py --delays 8000 --steps 600 --set rounds_in_flight=1
    bench/delay_sweep.py --noise 5 --csv bench-results/delay_sweep_noise.csv
                                                   # local against itself, 5 times

Needs a built tree (build/mend).
"""
import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile


def learners(run_dir):
    results = []
    for path in sorted(glob.glob(os.path.join(run_dir, "learner-*.result.json"))):
        with open(path) as f:
            results.append(json.load(f))
    return results


def rounds(run_dir):
    records = []
    for path in sorted(glob.glob(os.path.join(run_dir, "diagnostics", "*.rounds.jsonl"))):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return [r for r in records if not r.get("final_merge")]


def steps_by_flight(run_dir):
    """Each learner's inner-step times (steps.jsonl) split by whether one of
    its own rounds was in flight during the step (rounds.jsonl: a round runs
    from t_ms - seconds to t_ms): the median of each, over all learners. The
    two come from the same run, so the machine's drift between runs does not
    enter their ratio: what a round in flight costs the steps themselves."""
    quiet, busy = [], []
    for path in sorted(glob.glob(os.path.join(run_dir, "diagnostics", "*.steps.jsonl"))):
        with open(path) as f:
            steps = [json.loads(line) for line in f if line.strip()]
        with open(path.replace(".steps.jsonl", ".rounds.jsonl")) as f:
            spans = [(r["t_ms"] - 1000 * r["seconds"], r["t_ms"])
                     for r in (json.loads(line) for line in f if line.strip())
                     if not r.get("final_merge")]
        for s in steps[2:]:  # the first steps warm up
            middle = s["t_ms"] - s["step_ms"] / 2
            (busy if any(a <= middle <= b for a, b in spans) else quiet).append(s["step_ms"])
    median = lambda v: statistics.median(v) if v else float("nan")
    return median(quiet), median(busy), len(busy) / max(1, len(quiet) + len(busy))


def run_dir(work, mode):
    found = [d for d in glob.glob(os.path.join(work, "*-*")) if os.path.isdir(d)]
    # mend demo numbers its modes' folders: 1-diloco (streaming), 2-local.
    wanted = "diloco" if mode == "streaming" else mode
    found = [d for d in found if d.endswith("-" + wanted)]
    if len(found) != 1:
        sys.exit(f"delay_sweep: no single {mode} run in {work}: {found}")
    return found[0]


def measure(args, delay, work, order):
    """One `mend demo` run at `delay` in `work` (or the one already there with
    --reuse), its modes in `order`: its row."""
    command = [args.mend, "demo", "--delay-ms", str(delay), "--sync-every", str(args.sync_every),
               "--steps", str(args.steps), "--modes", order, "--work-dir", work]
    for setting in args.set:
        command += ["--set", setting]
    print("$", " ".join(command), flush=True)
    if not args.reuse:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    streaming_dir = run_dir(work, "streaming")
    streaming, local = learners(streaming_dir), learners(run_dir(work, "local"))
    records = rounds(streaming_dir)
    taus = [r["tau"] for r in records if r.get("ok")]
    row = {
        "delay_ms": delay,
        "first": order.split(",")[0],
        "streaming_tokens_per_s": round(sum(r["tokens_per_s"] for r in streaming)),
        "local_tokens_per_s": round(sum(r["tokens_per_s"] for r in local)),
        "streaming_eval_loss": statistics.mean(r["eval_loss"] for r in streaming),
        "local_eval_loss": statistics.mean(r["eval_loss"] for r in local),
        "final_merge_s": max(r.get("final_merge_seconds", 0.0) for r in streaming),
        "inner_step_ms": statistics.mean(r["inner_step_ms"] for r in streaming),
        "local_inner_step_ms": statistics.mean(r["inner_step_ms"] for r in local),
        # How much slower the slowest learner's inner steps were than the
        # fastest's: in a round every member waits for the last to reach
        # the boundary, so the faster learner waits for the slower once
        # their lag outgrows the slack between a round's time and its
        # fragment's period. Local training has no such coupling.
        "streaming_learner_spread": max(r["inner_step_ms"] for r in streaming)
                                    / min(r["inner_step_ms"] for r in streaming) - 1,
        "streaming_most_outside": max(1 - r["compute_fraction"] for r in streaming),
        # The share of the training time outside the inner steps (the
        # reducer's steps and any wait for a round), each mode's own:
        # what the overlap costs, apart from how fast the steps computed.
        "streaming_outside_steps": 1 - statistics.mean(r["compute_fraction"] for r in streaming),
        "local_outside_steps": 1 - statistics.mean(r["compute_fraction"] for r in local),
        "round_s_median": statistics.median(r["round_seconds"] for r in records) if records else 0,
        "tau_median": statistics.median(taus) if taus else 0,
        "most_in_flight": max((r.get("in_flight", 1) for r in records), default=0),
        "rounds_waited": sum(1 for r in records if r.get("waited")),
        "rounds": len(records),
    }
    quiet, busy, busy_share = steps_by_flight(streaming_dir)
    row["step_ms_no_round"] = quiet
    row["step_ms_round_in_flight"] = busy
    row["steps_with_round_in_flight"] = busy_share
    row["ratio"] = row["streaming_tokens_per_s"] / row["local_tokens_per_s"]
    return row


def write_csv(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)


def print_table(rows, columns):
    """``columns``: (key, heading, format spec); right-aligned to the wider of the two."""
    cells = [[format(r[key], spec) for key, _, spec in columns] for r in rows]
    widths = [max([len(heading)] + [len(c[i]) for c in cells]) for i, (_, heading, _) in enumerate(columns)]
    print(" ".join(heading.rjust(w) for (_, heading, _), w in zip(columns, widths)))
    for c in cells:
        print(" ".join(text.rjust(w) for text, w in zip(c, widths)))


def noise(args, work_root):
    """Local training against itself, `--modes local,local` as often as
    --noise says: how far the tokens/s ratio of two runs of the same thing,
    one after the other, moves on this machine (what one streaming/local
    row can resolve)."""
    rows = []
    for run in range(1, args.noise + 1):
        work = os.path.join(work_root, "noise", f"run-{run}")
        command = [args.mend, "demo", "--delay-ms", "0", "--steps", str(args.steps), "--modes",
                   "local,local", "--work-dir", work]
        print("$", " ".join(command), flush=True)
        if not args.reuse:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        found = sorted(d for d in glob.glob(os.path.join(work, "*-local")) if os.path.isdir(d))
        if len(found) != 2:
            sys.exit(f"delay_sweep: not two local runs in {work}: {found}")
        first, second = learners(found[0]), learners(found[1])
        rows.append({
            "run": run,
            "first_tokens_per_s": round(sum(r["tokens_per_s"] for r in first)),
            "second_tokens_per_s": round(sum(r["tokens_per_s"] for r in second)),
            "first_inner_step_ms": statistics.mean(r["inner_step_ms"] for r in first),
            "second_inner_step_ms": statistics.mean(r["inner_step_ms"] for r in second),
        })
        rows[-1]["ratio"] = rows[-1]["first_tokens_per_s"] / rows[-1]["second_tokens_per_s"]
    print(f"\nLocal against itself ({args.steps} steps), one run after the other:")
    print("| run | first tok/s | second tok/s | first / second | step ms (first / second) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['first_tokens_per_s']:,} | {r['second_tokens_per_s']:,} "
              f"| **{r['ratio']:.3f}** | {r['first_inner_step_ms']:.1f} / {r['second_inner_step_ms']:.1f} |")
    ratios = [r["ratio"] for r in rows]
    if len(ratios) > 1:
        print(f"\nfirst / second: median {statistics.median(ratios):.3f}, from {min(ratios):.3f} to "
              f"{max(ratios):.3f}, standard deviation {statistics.stdev(ratios):.3f}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mend", default="build/mend")
    parser.add_argument("--delays", default="0,500,1000,2000,4000")
    parser.add_argument("--sync-every", type=int, default=100)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every learner")
    parser.add_argument("--csv", default="bench-results/delay_sweep.csv")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs already in --work-dir (delay-D, or delay-D/run-K with "
                             "--repeat) instead of running them")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of the whole sweep; with more than one, the table ends with the "
                             "median of the runs at each delay (the ratio moves by a few percent "
                             "between runs on a small shared machine)")
    parser.add_argument("--noise", type=int, default=0,
                        help="instead of the sweep: local training against itself this many "
                             "times (--modes local,local), the spread one row cannot resolve")
    args = parser.parse_args()

    work_root = args.work_dir or tempfile.mkdtemp(prefix="mend-delay-sweep-")
    if args.noise > 0:
        write_csv(args.csv, noise(args, work_root))
        print(f"\nCSV: {args.csv}; runs in {work_root}")
        return
    delays = [int(d) for d in args.delays.split(",")]
    runs = []
    for run in range(1, args.repeat + 1):
        # The two modes run one after the other, and this machine's speed
        # drifts by a few percent over minutes: the repeats alternate which
        # runs first, so a drift does not favour one mode in every run.
        order = "streaming,local" if run % 2 == 1 else "local,streaming"
        rows = []
        for delay in delays:
            work = os.path.join(work_root, f"delay-{delay}")
            if args.repeat > 1:
                work = os.path.join(work, f"run-{run}")
            rows.append(measure(args, delay, work, order))
        base = rows[0]["streaming_eval_loss"]
        for row in rows:
            row["run"] = run
            row["loss_vs_first"] = row["streaming_eval_loss"] / base - 1
        runs.append(rows)
    rows = [row for rows_of_run in runs for row in rows_of_run]
    write_csv(args.csv, rows)

    print(f"\nH = {args.sync_every}, {args.steps} steps, settings {args.set or 'the defaults'}")
    print("| run | first | delay | streaming tok/s | local tok/s | streaming / local | streaming loss | vs first "
          "| final merge s | step ms (streaming / local) | outside steps (streaming / local) "
          "| learners' step spread, most outside | "
          "step ms, no round / round in flight (share) | round s | tau | in flight "
          "| waited / rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['first']} | {r['delay_ms']} ms | {r['streaming_tokens_per_s']:,} "
              f"| {r['local_tokens_per_s']:,} | **{r['ratio']:.3f}** | {r['streaming_eval_loss']:.4f} "
              f"| {100 * r['loss_vs_first']:+.2f}% | {r['final_merge_s']:.1f} "
              f"| {r['inner_step_ms']:.1f} / {r['local_inner_step_ms']:.1f} "
              f"| {100 * r['streaming_outside_steps']:.1f}% / {100 * r['local_outside_steps']:.1f}% "
              f"| {100 * r['streaming_learner_spread']:.1f}%, "
              f"{100 * r['streaming_most_outside']:.1f}% "
              f"| {r['step_ms_no_round']:.1f} / {r['step_ms_round_in_flight']:.1f} "
              f"({100 * r['steps_with_round_in_flight']:.0f}%) "
              f"| {r['round_s_median']:.2f} | {r['tau_median']:g} | {r['most_in_flight']} "
              f"| {r['rounds_waited']} / {r['rounds']} |")
    if len(runs) > 1:
        print(f"\nThe median of the {len(runs)} runs at each delay:")
        print("| delay | streaming / local | loss vs first |")
        print("|---|---|---|")
        for i, delay in enumerate(delays):
            ratio = statistics.median(rows_of_run[i]["ratio"] for rows_of_run in runs)
            loss = statistics.median(rows_of_run[i]["loss_vs_first"] for rows_of_run in runs)
            print(f"| {delay} ms | **{ratio:.3f}** | {100 * loss:+.2f}% |")
    print(f"\nCSV: {args.csv}; runs in {work_root}")


if __name__ == "__main__":
    main()
