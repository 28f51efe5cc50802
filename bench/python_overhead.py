"""The cost of mend's Python path on inner steps with no round.

    MEND_JOB_TOKEN=bench-token-0123456789 /usr/bin/python3 bench/python_overhead.py

One process, an embedded lighthouse, the GPT of examples/train_gpt.py.
Blocks of steps alternate between plain training (AdamW), the same loop
while a learner runtime exists but is never called (the cost of its
background threads on a 2-core machine), and the loop with mend_init
(sync_period_steps far beyond the run, so no step starts or applies a
round); per block the median step time. Also times Runtime.step() alone,
the Python path's own cost per step. Prints a table and writes a CSV.
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_gpt import GPT  # noqa: E402

import mend  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    p.add_argument("--csv", default="bench-results/python_overhead.csv")
    args = p.parse_args()
    os.environ.setdefault("MEND_JOB_TOKEN", "bench-token-0123456789")
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 256, (16, 64))
    y = torch.randint(0, 256, (16, 64))

    def block():
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="",
                                                 quorum_min_learners=1, log_level="warn"))
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1,
                             sync_period_steps=1_000_000, log_level="warn")
    block()  # warm-up
    plain, attached, with_mend = [], [], []
    token = os.environ["MEND_JOB_TOKEN"]
    for _ in range(args.blocks):
        plain.append(block())
        # A learner's runtime exists (its agent heartbeats in the background)
        # but the loop never calls it: the cost of mend's threads alone.
        idle = mend.Learner(config, [(n, p.detach().numpy()) for n, p in model.named_parameters()], "idle",
                            token=token)
        attached.append(block())
        idle.shutdown()
        del idle
        runtime = mend.mend_init(model, config, "overhead", optimizer=optimizer)
        with_mend.append(block())
        mend.mend_shutdown(model)
    # Runtime.step() alone (the reducer's bookkeeping, the Python wrapper).
    runtime = mend.mend_init(model, config, "overhead-step")
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        runtime.step(1024)
    step_alone = (time.perf_counter() - t0) / n
    mend.mend_shutdown(model)
    lighthouse.shutdown()

    p_med, a_med, m_med = (statistics.median(v) for v in (plain, attached, with_mend))
    rows = [("plain inner step (median of block medians)", p_med * 1e6, ""),
            ("runtime alive, never called (its threads)", a_med * 1e6,
             f"{100 * (a_med - p_med) / p_med:+.2f}%"),
            ("with mend_init, no round", m_med * 1e6, f"{100 * (m_med - p_med) / p_med:+.2f}%"),
            ("Runtime.step() alone (the Python path)", step_alone * 1e6,
             f"{100 * step_alone / p_med:.2f}%")]
    print(f"python overhead: GPT {sum(p.numel() for p in model.parameters())} parameters, "
          f"batch 16x64, {args.blocks} blocks x {args.steps} steps, 1 thread\n")
    print(f"{'what':<45} {'µs':>10} {'of a step':>10}")
    for what, us, share in rows:
        print(f"{what:<45} {us:>10.1f} {share:>10}")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["what", "microseconds", "share_of_step"])
        w.writerows(rows)
    print(f"\nCSV: {args.csv}")


if __name__ == "__main__":
    main()
