"""What a round costs at the size of real models, against torch.distributed's
gloo all-reduce of the same tensors in the same processes.

    /usr/bin/python3 bench/round_scale.py [--sizes 25,100,250] [--rounds 6]

For each size (millions of parameters): two learner processes (--learners), each a
mend.Learner over float32 numpy buffers of 64 MiB tensors (no torch model),
an embedded lighthouse in this process; synchronous, fp32, a round every
second step (so that the final merge at shutdown is a round of its own), no
link emulation, no outer warm-up (every round an outer Nesterov step, as
past a job's first rounds; --outer-warmup-steps). Each process times
Learner creation (mend_init's part), the first round, the later rounds,
the final merge, and its peak resident memory over the parameters (the
buffers' own 4 bytes included; the interpreter's and torch's own memory,
measured before the buffers, left out). Then, in the
same processes, torch.distributed over gloo all-reduces the same tensors
(one all_reduce per tensor, as DDP's buckets would), `--rounds` times.
Both are also timed in CPU seconds (the two processes' together, every
thread, user and system): on a host whose cores the learners fill, a round
cannot be shorter than its CPU time over the cores.

A round's time is split into its phases as mend reports them
(Learner.round_phases(): seconds summed over the phase's work, on every
thread that did it, so phases that overlap the transfer can add up to more
than the round). `made`: learner 0's rounds whose pseudo-gradient was made
as the merge reached each piece (Learner.stats()["rounds_made_in_merge"]),
of all its rounds. Prints a table and writes a CSV.

    /usr/bin/python3 bench/round_scale.py --encryption both [--sizes 100,250]

With --encryption both each size runs twice, side by side: with the data
plane in the clear (dataplane_encrypt = false) and secure (AES-256-GCM,
mend's default with a job token), and a last table gives secure / plain.

    /usr/bin/python3 bench/round_scale.py --ranks 2 [--sizes 100,250]

With --ranks R each learner is a group of R rank processes, and each size
runs twice, side by side: "replicated", every rank holding the whole model
(DDP's layout: rank r exchanges slice r and the ranks all-gather after a
round), and "sharded", rank r holding 1/R of every tensor as its own
(FSDP2's Shard(0): each rank exchanges its shards, nothing is gathered).
Per layout: the round's time, the bytes a rank sent across racks and inside
its learner, and its peak resident memory per value it holds. The gloo
reference then all-reduces each rank's own values with the same rank of
the other learners (HSDP's replicate-dimension all-reduce), in the same
processes.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TENSOR_VALUES = 16 << 20  # 64 MiB of float32
TOKEN = "bench-token-0123456789"


def rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds():
    # The process's CPU time, every thread's, user and system.
    t = os.times()
    return t.user + t.system


def reset_peak():
    # Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def model_tensors(count, seed):
    """`count` float32 values, normally distributed from `seed`, as 64 MiB tensors."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    left = count
    while left > 0:
        n = min(TENSOR_VALUES, left)
        a = np.empty(n, np.float32)
        rng.standard_normal(n, dtype=np.float32, out=a)
        arrays.append(a)
        left -= n
    return arrays


def group_worker(args):
    """One rank of a learner of --ranks ranks (see the module's doc)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import mend

    torch.set_num_threads(1)
    ranks, learners = args.ranks, args.learners
    learner, group_rank = divmod(args.rank, ranks)
    sharded = args.layout == "sharded"
    count = int(args.size * 1e6)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=learners * ranks, timeout=__import__("datetime").timedelta(seconds=600))
    # The same group rank of every learner: the reference's all-reduce.
    peers = [dist.new_group([l * ranks + r for l in range(learners)]) for r in range(ranks)]
    baseline = rss_bytes("VmRSS")
    reset_peak()
    arrays = model_tensors(count, seed=1)  # the same model on every learner and rank
    if sharded:  # rank r's Shard(0) of each tensor (the last ranks' may be shorter)
        arrays = [a[group_rank * -(-a.size // ranks):(group_rank + 1) * -(-a.size // ranks)].copy()
                  for a in arrays]
    local = sum(a.size for a in arrays)
    steps = 2 * args.rounds + 1
    config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=learners, sync_period_steps=2,
                             concurrent_outer_step=False, total_steps=steps, final_merge=True,
                             collective_timeout_ms=600_000, quorum_timeout_ms=600_000,
                             heartbeat_timeout_ms=600_000, log_level="warn", codec=args.codec,
                             outer_warmup_steps=args.outer_warmup_steps, group_size=ranks,
                             group_rank=group_rank, group_store=f"127.0.0.1:{args.group_ports[learner]}",
                             dataplane_encrypt=bool(args.encrypt))
    store = mend.GroupStore(config, TOKEN, config.group_store) if group_rank == 0 else None
    dist.barrier()  # (every learner's store is serving)
    entries = [(f"t{i}", a.ctypes.data, a.size, (a.size,)) for i, a in enumerate(arrays)]
    keys = [group_rank + 1 if sharded else 0] * len(arrays)
    t0 = time.perf_counter()
    handle = mend.Learner._from_addresses(config, entries, f"scale-{learner}", TOKEN, 0, arrays,
                                          replica_keys=keys)
    init_s = time.perf_counter() - t0
    rounds = []
    for step in range(1, steps + 1):
        arrays[0][:1024] += np.float32(1e-3 * (learner + 1))  # a little training between rounds
        t0 = time.perf_counter()
        handle.step(1)
        if step % 2 == 0:
            rounds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    handle.shutdown()
    final_s = time.perf_counter() - t0
    stats = handle.stats()
    peak = rss_bytes("VmHWM")
    tensors = [torch.from_numpy(a) for a in arrays]
    gloo = []
    for _ in range(args.rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for t in tensors:
            dist.all_reduce(t, group=peers[group_rank])
        gloo.append(time.perf_counter() - t0)
    dist.barrier()  # (the stores stop once every rank is done)
    if store is not None:
        store.stop()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"rank": args.rank, "learner": learner, "group_rank": group_rank, "local": local,
                   "init": init_s, "rounds": rounds, "final": final_s, "gloo": gloo,
                   "rss_per_local_value": (peak - baseline) / local, "stats": stats}, f)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(arguments, what):
    """Worker processes (this file with --worker and each one's
    `arguments`, which give its --out), waited for; their results."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"w{w}.json") for w in range(len(arguments))]
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--out", out] + a, env=env)
                 for a, out in zip(arguments, outs)]
        for p in procs:
            if p.wait(timeout=3600) != 0:
                raise SystemExit(f"round_scale: a worker of the {what} run failed ({p.returncode})")
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    return results


def run_group_size(size, layout, args, lighthouse_address):
    port = free_port()
    group_ports = ",".join(str(free_port()) for _ in range(args.learners))
    return run_workers([["--rank", str(w), "--size", str(size), "--rounds", str(args.rounds), "--lighthouse",
                         lighthouse_address, "--port", str(port), "--learners", str(args.learners),
                         "--ranks", str(args.ranks), "--layout", layout, "--group-ports", group_ports,
                         "--codec", args.codec, "--outer-warmup-steps", str(args.outer_warmup_steps),
                         "--encrypt", str(int(args.encryption == "on"))]
                        for w in range(args.learners * args.ranks)], f"{size} M {layout}")


def main_groups(args, sizes, lighthouse):
    rows = []
    for size in sizes:
        for layout in ("replicated", "sharded"):
            results = run_group_size(size, layout, args, lighthouse.address)
            later = statistics.median(max(r["rounds"][i] for r in results) for i in range(1, args.rounds))
            gloo = statistics.median(max(r["gloo"][i] for r in results) for i in range(1, args.rounds))
            rows.append({"parameters_m": size, "layout": layout, "learners": args.learners, "ranks": args.ranks,
                         "values_per_rank_m": max(r["local"] for r in results) / 1e6,
                         "init_s": max(r["init"] for r in results),
                         "first_round_s": max(r["rounds"][0] for r in results), "later_round_s": later,
                         "final_merge_s": max(r["final"] for r in results), "gloo_allreduce_s": gloo,
                         "later_over_gloo": later / gloo,
                         # A round's (the job's over its rounds, the final merge's included).
                         "cross_rack_bytes_per_rank": max(r["stats"]["bytes_sent"] / r["stats"]["rounds"]
                                                          for r in results),
                         "group_bytes_per_rank": max(r["stats"]["group_bytes_sent"] / r["stats"]["rounds"]
                                                     for r in results),
                         "rss_bytes_per_local_value": max(r["rss_per_local_value"] for r in results),
                         "rounds": results[0]["stats"]["rounds"], "codec": args.codec,
                         "encrypted": args.encryption == "on"})
    print(f"round scale: {args.learners} learners of {args.ranks} ranks (processes), {args.codec}, "
          f"data plane {'secure' if args.encryption == 'on' else 'in the clear'}, synchronous, "
          "outer Nesterov rounds; gloo = torch.distributed all_reduce of each rank's own values with the same "
          "rank of the other learners, in the same processes\n")
    print(f"{'params':>7} {'layout':<10} {'M/rank':>7} {'first':>7} {'later':>7} {'final':>7} {'gloo':>7} "
          f"{'later/gloo':>10} {'MB out/rank':>11} {'MB group/rank':>13} {'B/value':>8}")
    print("(MB a round; B/value: a rank's peak RSS over the values it holds)")
    for r in rows:
        print(f"{r['parameters_m']:>6.0f}M {r['layout']:<10} {r['values_per_rank_m']:>7.1f} {r['first_round_s']:>7.2f} "
              f"{r['later_round_s']:>7.2f} {r['final_merge_s']:>7.2f} {r['gloo_allreduce_s']:>7.2f} "
              f"{r['later_over_gloo']:>10.2f} {r['cross_rack_bytes_per_rank'] / 1e6:>11.1f} "
              f"{r['group_bytes_per_rank'] / 1e6:>13.1f} {r['rss_bytes_per_local_value']:>8.1f}")
    print("\nsharded / replicated, same size, same run:")
    print(f"{'params':>7} {'later round':>11} {'MB out/rank':>11} {'MB group/rank':>13} {'memory/rank':>11}")
    for size in sizes:
        rep, sh = [next(r for r in rows if r["parameters_m"] == size and r["layout"] == k)
                   for k in ("replicated", "sharded")]
        memory = (sh["rss_bytes_per_local_value"] * sh["values_per_rank_m"]) / \
            (rep["rss_bytes_per_local_value"] * rep["values_per_rank_m"])
        group = sh["group_bytes_per_rank"] / rep["group_bytes_per_rank"] if rep["group_bytes_per_rank"] else 0
        print(f"{size:>6.0f}M {sh['later_round_s'] / rep['later_round_s']:>11.3f} "
              f"{sh['cross_rack_bytes_per_rank'] / rep['cross_rack_bytes_per_rank']:>11.3f} {group:>13.4f} "
              f"{memory:>11.3f}")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {args.csv}")


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist

    import mend

    if args.ranks > 1:
        return group_worker(args)
    torch.set_num_threads(1)
    rank = args.rank
    count = int(args.size * 1e6)
    # The reference's process group first (idle until the end): its barrier
    # starts the learners together, once each made its buffers.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.learners,
                            timeout=__import__("datetime").timedelta(seconds=600))
    baseline = rss_bytes("VmRSS")
    reset_peak()
    # The same initial model on every learner (one seed or checkpoint, as a job
    # starts), unless --distinct-init: the first round then heals learner 1.
    arrays = model_tensors(count, seed=rank + 1 if args.distinct_init else 1)
    steps = 2 * args.rounds + 1
    config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=args.learners,
                             sync_period_steps=2,
                             concurrent_outer_step=False, total_steps=steps, final_merge=True,
                             collective_timeout_ms=600_000, quorum_timeout_ms=600_000,
                             heartbeat_timeout_ms=600_000, log_level="warn",
                             link_latency_ms=args.link_latency_ms, codec=args.codec,
                             outer_warmup_steps=args.outer_warmup_steps, dataplane_encrypt=bool(args.encrypt),
                             **({"round_threads": args.round_threads} if args.round_threads >= 0 else {}))
    dist.barrier()
    t0 = time.perf_counter()
    learner = mend.Learner(config, [(f"t{i}", a) for i, a in enumerate(arrays)], f"scale-{rank}", token=TOKEN)
    init_s = time.perf_counter() - t0
    has_phases = hasattr(learner, "round_phases")
    rounds, phases, round_cpu = [], [], []
    for step in range(1, steps + 1):
        arrays[0][:1024] += np.float32(1e-3 * (rank + 1))  # a little training between rounds
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000)  # an inner step's compute, elsewhere (a GPU)
        before = learner.round_phases() if has_phases else {}
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        learner.step(1)
        seconds = time.perf_counter() - t0
        if step % 2 == 0:
            rounds.append(seconds)
            round_cpu.append(cpu_seconds() - c0)
            after = learner.round_phases() if has_phases else {}
            phases.append({k: after[k] - before.get(k, 0.0) for k in after})
    t0 = time.perf_counter()
    learner.shutdown()
    final_s = time.perf_counter() - t0
    stats = learner.stats()
    peak = rss_bytes("VmHWM")
    assert stats["final_rounds"] == 1 if "final_rounds" in stats else True
    # The reference: gloo all-reduce of the same tensors, between the same processes.
    tensors = [torch.from_numpy(a) for a in arrays]
    gloo, gloo_cpu = [], []
    for _ in range(args.rounds):
        dist.barrier()
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        for t in tensors:
            dist.all_reduce(t)
        gloo.append(time.perf_counter() - t0)
        gloo_cpu.append(cpu_seconds() - c0)
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"rank": rank, "init": init_s, "rounds": rounds, "final": final_s, "phases": phases,
                   "gloo": gloo, "round_cpu": round_cpu, "gloo_cpu": gloo_cpu,
                   "rss_per_param": (peak - baseline) / count, "stats": stats}, f)


def run_size(size, args, lighthouse_address, encrypt):
    port = free_port()
    return run_workers([["--rank", str(r), "--size", str(size), "--rounds", str(args.rounds), "--lighthouse",
                         lighthouse_address, "--port", str(port), "--round-threads", str(args.round_threads),
                         "--learners", str(args.learners), "--encrypt", str(int(encrypt))]
                        + (["--distinct-init"] if args.distinct_init else [])
                        + ["--step-ms", str(args.step_ms), "--codec", args.codec,
                           "--link-latency-ms", str(args.link_latency_ms),
                           "--outer-warmup-steps", str(args.outer_warmup_steps)]
                        for r in range(args.learners)], f"{size} M")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="25,100,250", help="millions of parameters, comma-separated")
    p.add_argument("--rounds", type=int, default=6, help="rounds per size (the first included)")
    p.add_argument("--learners", type=int, default=2, help="learner processes (at least 2)")
    p.add_argument("--round-threads", type=int, default=-1, help="round_threads (default: mend's default)")
    p.add_argument("--step-ms", type=float, default=0,
                   help="each inner step also waits this long, as if a GPU computed it (default 0: "
                        "the rounds follow each other with nothing between)")
    p.add_argument("--distinct-init", action="store_true",
                   help="learners start from different values (the first round heals)")
    p.add_argument("--link-latency-ms", type=int, default=0,
                   help="link_latency_ms: each collective of a round takes at least this long (a far "
                        "link, emulated); the gloo reference has none")
    p.add_argument("--codec", default="fp32", choices=["fp32", "bf16", "int8", "int4", "topk"],
                   help="the merge's codec (default fp32; the gloo reference is fp32 always)")
    p.add_argument("--outer-warmup-steps", type=int, default=0,
                   help="outer_warmup_steps (default 0: every round takes the outer Nesterov step with "
                        "its momentum, as a job's rounds past the warm-up do; mend's default, 150, "
                        "would make every round of this short job an average, which leaves the "
                        "momentum alone)")
    p.add_argument("--ranks", type=int, default=1,
                   help="ranks per learner (default 1); more: each size runs replicated (DDP) and sharded "
                        "(FSDP2) side by side")
    p.add_argument("--encryption", default="on", choices=["on", "off", "both"],
                   help="the data plane: secure (on, mend's default with a job token), in the clear (off), "
                        "or both, each size twice side by side (default on)")
    p.add_argument("--csv", default="")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--size", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--layout", default="sharded", help=argparse.SUPPRESS)
    p.add_argument("--group-ports", default="", help=argparse.SUPPRESS)
    p.add_argument("--encrypt", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.group_ports = [int(port) for port in args.group_ports.split(",") if port]
        return worker(args)
    if args.ranks < 1:
        raise SystemExit("round_scale: --ranks must be at least 1")
    if not args.csv:
        args.csv = "bench-results/round_scale.csv" if args.ranks == 1 else "bench-results/round_scale_groups.csv"
    if args.learners < 2:
        raise SystemExit("round_scale: --learners must be at least 2")
    try:
        sizes = [float(s) for s in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"round_scale: --sizes {args.sizes!r}: millions of parameters, comma-separated (e.g. 25,100)")
    if any(not 0 < s <= 100_000 for s in sizes):
        raise SystemExit(f"round_scale: --sizes {args.sizes!r}: each size must be in (0, 100000] millions")
    if args.rounds < 3:
        raise SystemExit("round_scale: --rounds must be at least 3 (a first round and later ones)")
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    import mend

    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=args.learners,
                                                 heartbeat_timeout_ms=600_000, log_level="warn"), token=TOKEN)
    if args.ranks > 1:
        if args.encryption == "both":
            raise SystemExit("round_scale: --encryption both runs with --ranks 1 only; with --ranks "
                             f"{args.ranks} give on or off")
        main_groups(args, sizes, lighthouse)
        lighthouse.shutdown()
        return
    rows, phase_rows = [], []
    phase_names = []
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.encryption]
    for size, encrypt in [(size, encrypt) for size in sizes for encrypt in modes]:
        results = run_size(size, args, lighthouse.address, encrypt)
        # Per size: the slower learner's time of each event (a round ends when every one has it).
        init = max(r["init"] for r in results)
        first = max(r["rounds"][0] for r in results)
        later = statistics.median(max(r["rounds"][i] for r in results) for i in range(1, args.rounds))
        final = max(r["final"] for r in results)
        gloo = statistics.median(max(r["gloo"][i] for r in results) for i in range(1, args.rounds))
        rss = max(r["rss_per_param"] for r in results)
        # CPU seconds of the processes together (every thread, user and system) per
        # later round and per all-reduce: what the two share of the host.
        cpu = statistics.median(sum(r["round_cpu"][i] for r in results) for i in range(1, args.rounds))
        gloo_cpu = statistics.median(sum(r["gloo_cpu"][i] for r in results) for i in range(1, args.rounds))
        gib = size * 1e6 * 4 / 2**30
        rows.append({"parameters_m": size, "encrypted": encrypt, "init_s": init, "init_s_per_gib": init / gib, "first_round_s": first,
                     "later_round_s": later, "final_merge_s": final, "gloo_allreduce_s": gloo,
                     "later_over_gloo": later / gloo, "first_over_later": first / later,
                     "final_over_later": final / later, "rss_bytes_per_param": rss,
                     "later_round_cpu_s": cpu, "gloo_allreduce_cpu_s": gloo_cpu,
                     "link_latency_ms": args.link_latency_ms, "step_ms": args.step_ms, "codec": args.codec,
                     "learners": args.learners, "outer_warmup_steps": args.outer_warmup_steps,
                     # Learner 0's rounds (the final merge's included), and those whose
                     # pseudo-gradient was made in the merge (-1: a package without the count).
                     "rounds": results[0]["stats"]["rounds"],
                     "rounds_made_in_merge": results[0]["stats"].get("rounds_made_in_merge", -1)})
        if results[0]["phases"]:
            phase_names = list(results[0]["phases"][0].keys())
            for name in phase_names:
                phase_rows.append((size, encrypt, name, results[0]["phases"][0][name],
                                   statistics.median(ph[name] for ph in results[0]["phases"][1:])))
    lighthouse.shutdown()
    link = (f"link_latency_ms = {args.link_latency_ms} (emulated; not in the gloo reference)"
            if args.link_latency_ms else "no link emulation")
    outer = ("outer Nesterov rounds" if args.outer_warmup_steps == 0 else
             f"outer_warmup_steps = {args.outer_warmup_steps} (rounds up to it average)")
    print(f"round scale: {args.learners} learners (processes), {args.codec}, synchronous, {outer}, {link}; "
          "gloo = torch.distributed all_reduce of the same tensors in the same processes\n")
    head = (f"{'params':>7} {'secure':>6} {'init s':>7} {'s/GiB':>6} {'first':>7} {'later':>7} {'final':>7} {'gloo':>7} "
            f"{'later/gloo':>10} {'first/later':>11} {'final/later':>11} {'B/param':>8} {'cpu s':>6} {'gloo cpu':>8} "
            f"{'made':>6}")
    print(head)
    for r in rows:
        print(f"{r['parameters_m']:>6.0f}M {'yes' if r['encrypted'] else 'no':>6} {r['init_s']:>7.2f} {r['init_s_per_gib']:>6.2f} {r['first_round_s']:>7.2f} "
              f"{r['later_round_s']:>7.2f} {r['final_merge_s']:>7.2f} {r['gloo_allreduce_s']:>7.2f} "
              f"{r['later_over_gloo']:>10.2f} {r['first_over_later']:>11.2f} {r['final_over_later']:>11.2f} "
              f"{r['rss_bytes_per_param']:>8.1f} {r['later_round_cpu_s']:>6.2f} {r['gloo_allreduce_cpu_s']:>8.2f} "
              f"{str(r['rounds_made_in_merge']) + '/' + str(r['rounds']):>6}")
    if phase_rows:
        print("\nphases of learner 0's rounds, seconds (summed over threads):")
        print(f"{'params':>7} {'secure':>6} {'phase':<16} {'first':>8} {'later':>8}")
        for size, encrypt, name, first, later in phase_rows:
            print(f"{size:>6.0f}M {'yes' if encrypt else 'no':>6} {name:<16} {first:>8.3f} {later:>8.3f}")
        print("(snapshot: the copy-in and the pseudo-gradient, one fused pass, or made inside the merge as it "
              "reaches each piece (still counted here); reduce: decode and merge; outer_step: "
              "the outer step and the parameters' update, in place; no copy-in or copy-out of the numpy "
              "buffers, which the round reads and writes in place; join and agree_or_heal: the quorum and, "
              "in a job's first round, the members' state comparison)")
    if len(modes) == 2:
        print("\nsecure / plain, same size, same run (target: a later round at most 1.10x):")
        print(f"{'params':>7} {'later':>7} {'first':>7} {'final':>7} {'cpu':>7}")
        for size in sizes:
            plain, secure = [next(r for r in rows if r["parameters_m"] == size and r["encrypted"] == e)
                             for e in (False, True)]
            print(f"{size:>6.0f}M {secure['later_round_s'] / plain['later_round_s']:>7.3f} "
                  f"{secure['first_round_s'] / plain['first_round_s']:>7.3f} "
                  f"{secure['final_merge_s'] / plain['final_merge_s']:>7.3f} "
                  f"{secure['later_round_cpu_s'] / plain['later_round_cpu_s']:>7.3f}")
        print("(later, first, final: the rounds' times; cpu: both processes' CPU seconds in a later round)")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    if phase_rows:
        with open(os.path.splitext(args.csv)[0] + "_phases.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["parameters_m", "encrypted", "phase", "first_round_s", "later_round_s"])
            w.writerows(phase_rows)
    print(f"\nwrote {args.csv}" + (f" and {os.path.splitext(args.csv)[0]}_phases.csv" if phase_rows else ""))


if __name__ == "__main__":
    main()
