#!/usr/bin/python3
"""What takes the CPU from the training threads: for each mode and delay,
the share of each learner's training thread's time that it spent
preempted (runnable, not running), by the thread that ran instead.

It runs `mend demo --delay-ms D --sync-every H --steps N --modes MODE` for
each delay and mode, one at a time, and while the job is in steady state
records the kernel's context switches on every CPU for --seconds
(`perf record -e sched:sched_switch -a`). A training thread is the main
thread of a `mend train` process. From the trace it sums, per training
thread, the time from each switch away from it in the runnable state to its
next switch back, and charges that time to the thread that took the CPU:

  other mend threads   the learner's threads named `mend` other than the
                       training thread: each round's thread and its Gloo
                       device's event loop (both short-lived), the
                       heartbeat and the abort watch
  any other name       gRPC's threads (nexting_thread, grpc_global_tim,
                       ...), the kernel's, other processes'

Time counts from the kernel, not from a stopwatch around the steps, so the
machine's drift between runs does not enter it; the modes compare directly.
Voluntary waits (a step waiting for a round) are not preemptions and are
not counted here: delay_sweep.py's "outside steps" has them.

    bench/preemptions.py                            # streaming and local at 0 and 4000 ms
    bench/preemptions.py --delays 2000 --modes streaming --seconds 20

Needs a built tree (build/mend) and perf (linux-perf, which scripts/setup.sh installs), as root.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from delay_sweep import write_csv  # this folder's (the script's own directory is on sys.path)

SWITCH = re.compile(r"\s*(\d+)\s+\[\d+\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=(.*?) "
                    r"prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) "
                    r"next_pid=(\d+)")


def training_threads(work):
    """The pids of the `mend train` processes of the job in `work` (their
    main threads train)."""
    found = subprocess.run(["pgrep", "-f", f"mend train .*{re.escape(work)}/"],
                           capture_output=True, text=True).stdout.split()
    return set(found)


def attribute(trace_lines, mains):
    """(seconds traced, {taker: [seconds preempted, times]}) over `mains`."""
    preempted_at = {}
    taken = collections.defaultdict(lambda: [0.0, 0])
    first = last = None
    for line in trace_lines:
        m = SWITCH.match(line)
        if not m:
            continue
        t = float(m.group(2))
        first = t if first is None else first
        last = t
        prev, state, next_comm, nxt = m.group(4), m.group(5), m.group(6), m.group(7)
        if prev in mains and state.startswith("R"):
            if next_comm == "mend":
                taker = "other training thread" if nxt in mains else "other mend threads"
            else:
                taker = next_comm
            preempted_at[prev] = (t, taker)
        elif prev in mains:
            preempted_at.pop(prev, None)  # it blocked or slept: not a preemption
        if nxt in mains and nxt in preempted_at:
            since, taker = preempted_at.pop(nxt)
            taken[taker][0] += t - since
            taken[taker][1] += 1
    return (last - first) if first is not None else 0.0, taken


def measure(args, mode, delay, work_root):
    work = os.path.join(work_root, f"{mode}-{delay}")
    command = [args.mend, "demo", "--delay-ms", str(delay), "--sync-every", str(args.sync_every),
               "--steps", str(args.steps), "--modes", mode, "--work-dir", work]
    for setting in args.set:
        command += ["--set", setting]
    print("$", " ".join(command), flush=True)
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + args.warmup_s
        while time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
        mains = training_threads(work)
        if job.poll() is not None or len(mains) == 0:
            sys.exit(f"preemptions: the {mode} job at {delay} ms ended or has no learners "
                     f"after {args.warmup_s} s; give it more --steps")
        data = os.path.join(work_root, f"{mode}-{delay}.perf.data")
        subprocess.run(["perf", "record", "-q", "-e", "sched:sched_switch", "-a", "-o", data, "--",
                        "sleep", str(args.seconds)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        if job.poll() is not None:
            sys.exit(f"preemptions: the {mode} job at {delay} ms ended while traced; "
                     "give it more --steps")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "tid,cpu,time,event,trace"],
                                check=True, capture_output=True, text=True).stdout
    finally:
        job.wait()
    seconds, taken = attribute(script.splitlines(), mains)
    threads = len(mains)
    rows = []
    for taker, (off, times) in sorted(taken.items(), key=lambda kv: -kv[1][0]):
        rows.append({"mode": mode, "delay_ms": delay, "taker": taker,
                     "share": off / (seconds * threads), "per_s": times / (seconds * threads),
                     "mean_ms": 1000 * off / times})
    total = sum(r["share"] for r in rows)
    print(f"{mode} at {delay} ms: {threads} training threads, {seconds:.1f} s traced, "
          f"preempted {100 * total:.2f}% of the time, "
          f"{sum(r['per_s'] for r in rows):.0f} times a second each")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mend", default="build/mend")
    parser.add_argument("--delays", default="0,4000")
    parser.add_argument("--modes", default="streaming,local")
    parser.add_argument("--sync-every", type=int, default=100)
    parser.add_argument("--steps", type=int, default=800,
                        help="the job's length: it must outlast --warmup-s + --seconds")
    parser.add_argument("--warmup-s", type=float, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every learner")
    parser.add_argument("--csv", default="bench-results/preemptions.csv")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--top", type=int, default=5, help="takers shown per row")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("preemptions: needs perf (apt-get install linux-perf)")

    work_root = args.work_dir or tempfile.mkdtemp(prefix="mend-preemptions-")
    rows = []
    for delay in [int(d) for d in args.delays.split(",")]:
        for mode in args.modes.split(","):
            rows += measure(args, mode, delay, work_root)

    write_csv(args.csv, rows)

    print("\n| mode | delay | preempted (share of a training thread's time) | preemptions a second "
          "| by whom (share, times a second, ms each) |")
    print("|---|---|---|---|---|")
    for (mode, delay), group in groupby(rows):
        takers = "; ".join(f"{r['taker']} {100 * r['share']:.2f}%, {r['per_s']:.0f}/s, "
                           f"{r['mean_ms']:.3f} ms" for r in group[:args.top])
        print(f"| {mode} | {delay} ms | **{100 * sum(r['share'] for r in group):.2f}%** "
              f"| {sum(r['per_s'] for r in group):.0f} | {takers} |")
    print(f"\nCSV: {args.csv}; runs in {work_root}")


def groupby(rows):
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault((r["mode"], r["delay_ms"]), []).append(r)
    return groups.items()


if __name__ == "__main__":
    main()
