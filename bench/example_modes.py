"""examples/train_gpt.py in every mode at equal tokens, side by side.

    /usr/bin/python3 bench/example_modes.py --steps 600 --sync-every 50 --seeds 1,2

Runs `torchrun --nproc_per_node 2 examples/train_gpt.py --mode M --seed S`
for M in mend, ddp, local, diloco-torch (same model, data, schedule and
held-out set; every process is one learner), then prints held-out loss,
tokens/s per learner and bytes sent per learner, and writes a CSV. mend runs
synchronous fp32 rounds, so it should match diloco-torch, the few-line
plain-PyTorch DiLoCo, within float noise.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "train_gpt.py")
MODES = ["mend", "diloco-torch", "ddp", "local"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--sync-every", type=int, default=50)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--csv", default="bench-results/example_modes.csv")
    p.add_argument("--example-args", default="",
                   help="more train_gpt.py options for every run, e.g. '--split contiguous'")
    args = p.parse_args()
    env = dict(os.environ)
    env.setdefault("MEND_JOB_TOKEN", "example-bench-token-0123456789")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for mode in args.modes.split(","):
                out = os.path.join(tmp, f"{mode}-{seed}.json")
                cmd = ["torchrun", "--redirects", "1", "--tee", "1", "--nproc_per_node", "2",
                       EXAMPLE, "--mode", mode, "--steps", str(args.steps), "--sync-every",
                       str(args.sync_every), "--seed", str(seed), "--json", out] + args.example_args.split()
                run = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if run.returncode != 0:
                    print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{mode} seed {seed} failed")
                results.append(json.load(open(out)))
                r = results[-1]
                print(f"  {mode:<13} seed {seed}: loss {r['held_out_loss']:.4f}, "
                      f"{r['tokens_per_s']:.0f} tokens/s, {r['bytes_sent'] / 1e6:.1f} MB, final merge "
                      f"{r.get('final_merge_seconds', 0.0):.2f} s (not in tokens/s)", flush=True)
    print(f"\nexamples/train_gpt.py, 2 learners (torchrun, 1 thread each), {args.steps} steps, "
          f"H = {args.sync_every}, seeds {args.seeds}\n")
    print(f"{'mode':<13} {'held-out loss':>14} {'per seed':>24} {'tokens/s':>9} {'MB sent':>9}")
    rows = []
    for mode in args.modes.split(","):
        rs = [r for r in results if r["mode"] == mode]
        losses = [r["held_out_loss"] for r in rs]
        row = [mode, statistics.mean(losses), " ".join(f"{l:.4f}" for l in losses),
               statistics.mean(r["tokens_per_s"] for r in rs),
               statistics.mean(r["bytes_sent"] for r in rs) / 1e6]
        rows.append(row)
        print(f"{row[0]:<13} {row[1]:>14.4f} {row[2]:>24} {row[3]:>9.0f} {row[4]:>9.1f}")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "seed", "steps", "sync_every", "held_out_loss", "tokens_per_s",
                    "bytes_sent", "final_merge_seconds"])
        for r in results:
            w.writerow([r["mode"], r["seed"], r["steps"], r["sync_every"], r["held_out_loss"],
                        r["tokens_per_s"], r["bytes_sent"], r.get("final_merge_seconds", 0.0)])
    print(f"\nCSV: {args.csv}")


if __name__ == "__main__":
    main()
