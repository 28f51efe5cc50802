"""Sharded learners on a GPU machine: two learners (each a torchrun of
--ranks ranks, a GPU a rank) whose model is FSDP2-sharded on CUDA, with a
bf16 MixedPrecisionPolicy, and with CPUOffloadPolicy (the shards on the
host, used in place), each against the same learners in DDP, side by side
in one run. Fixed inner steps (an elementwise rule, tests/python/
sharded_learner.py --mode fixed) make every layout's rounds comparable bit
for bit; a run of real AdamW training (--mode train) checks that each
rank's shards agree across the learners after every round.

    python3 bench/gpu_sharded_check.py [--device cuda|cpu] [--ranks 1] [--csv FILE]

On one GPU, --ranks 1 (NCCL takes one process a GPU): FSDP2 over one rank
still makes DTensor parameters, and its offload policy moves them to the
host. --device cpu runs the same here (no offload layout). Prints a table
and writes a CSV; exits 1 when a layout's model differs from DDP's."""
import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LEARNER = os.path.join(HERE, "..", "tests", "python", "sharded_learner.py")
TOKEN = "gpu-sharded-check-token-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(layout, mode, args, work):
    import mend
    out = os.path.join(work, f"{layout}-{mode}")
    os.makedirs(out)
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1")
    begun = time.perf_counter()
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, log_level="warn"),
                         token=TOKEN) as lighthouse:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
             "--master_addr", "127.0.0.1", "--master_port", str(free_port()), LEARNER,
             "--lighthouse", lighthouse.address, "--learner", str(learner), "--layout", layout, "--mode", mode,
             "--device", args.device, "--steps", str(args.steps), "--out", os.path.join(out, f"l{learner}-%r.json")],
            env=env, stdout=open(os.path.join(out, f"learner-{learner}.log"), "w"), stderr=subprocess.STDOUT)
            for learner in (1, 2)]
        codes = [proc.wait(timeout=args.run_timeout) for proc in procs]
    seconds = time.perf_counter() - begun
    if codes != [0, 0]:
        tail = open(os.path.join(out, "learner-1.log")).read()[-2000:]
        return {"error": f"exit codes {codes}: {tail}", "seconds": seconds}
    results = {(l, r): json.load(open(os.path.join(out, f"l{l}-{r}.json"))) for l in (1, 2) for r in range(args.ranks)}
    return {"results": results, "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="", help="cuda or cpu (default: cuda where there is one)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--run-timeout", type=int, default=300)
    parser.add_argument("--csv", default="bench-results/gpu_sharded_check.csv")
    args = parser.parse_args()
    if not args.device:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    layouts = ["fsdp2", "fsdp2-mp"] + (["fsdp2-offload"] if args.device == "cuda" else [])
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as work:
        reference = run("ddp", "fixed", args, work)
        if "error" in reference:
            raise SystemExit(f"gpu_sharded_check: the DDP reference failed: {reference['error']}")
        ddp = reference["results"][1, 0]
        rows.append({"layout": "ddp", "mode": "fixed", "ok": True, "seconds": reference["seconds"],
                     "rounds": ddp["stats"]["rounds"], "bytes_sent": ddp["stats"]["bytes_sent"],
                     "devices": " ".join(ddp["devices"]), "kinds": "", "note": "the reference"})
        for layout, mode in [(layout, "fixed") for layout in layouts] + [("fsdp2", "train")]:
            got = run(layout, mode, args, work)
            if "error" in got:
                rows.append({"layout": layout, "mode": mode, "ok": False, "seconds": got["seconds"], "rounds": 0,
                             "bytes_sent": 0, "devices": "", "kinds": "", "note": got["error"][-300:]})
                failed = True
                continue
            results = got["results"]
            first = results[1, 0]
            if mode == "fixed":
                ok = all(r["model"] == ddp["model"] for r in results.values())
                note = "every value as DDP's" if ok else "differs from DDP's"
            else:
                ok = all(r["rounds"] == results[1, r["rank"]]["rounds"] for r in results.values())
                note = "each rank's shards agree after every round" if ok else "shards differ across learners"
            failed |= not ok
            rows.append({"layout": layout, "mode": mode, "ok": ok, "seconds": got["seconds"],
                         "rounds": first["stats"]["rounds"], "bytes_sent": first["stats"]["bytes_sent"],
                         "devices": " ".join(first["devices"]), "kinds": " ".join(sorted(set(first["kinds"].values()))),
                         "note": note})
    print(f"sharded learners: 2 learners of {args.ranks} rank(s) on {args.device}, {args.steps} steps, "
          "a synchronous round every 5\n")
    print(f"{'layout':<14} {'mode':<6} {'ok':<4} {'s':>6} {'rounds':>6} {'bytes':>9} {'shards on':<10} note")
    for r in rows:
        print(f"{r['layout']:<14} {r['mode']:<6} {str(r['ok']):<4} {r['seconds']:>6.1f} {r['rounds']:>6} "
              f"{r['bytes_sent']:>9} {r['devices']:<10} {r['note']}")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nwrote {args.csv}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
