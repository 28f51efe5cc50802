"""mend at the product's headline shape: a Qwen-2.5-1.5B-shaped model, two
learners sharing one GPU, local against synchronous and concurrent rounds at
growing link latencies.

    python bench/gpu_delay_sweep.py                      # on a GPU: 1.5 B, H 40, 160 steps
    python bench/gpu_delay_sweep.py --delays 0,2000 --seeds 1
    python bench/gpu_delay_sweep.py --tiny --steps 24 --sync-every 8   # a check on a CPU
    python bench/gpu_delay_sweep.py --runs synchronous@2000#1,concurrent@2000#1+outer_warmup_steps=0 --eval-every 20

The model is transformers' Qwen2ForCausalLM at Qwen-2.5-1.5B's shape (randomly
initialised, bf16 on the GPU) when transformers is installed, else a
decoder of this file's own with the same widths and depth (--tiny: a few
million parameters, float32, for a CPU). Each (mode, delay, seed) starts two
learner processes on the one device (torch's CUDA device 0, or the CPU),
each training on its own stream of a synthetic language (a fixed random
Markov chain over 4096 tokens, so there is something to learn) with AdamW;
an embedded lighthouse in this process. Modes: local (no mend: the two train
apart), synchronous (concurrent_outer_step = false) and concurrent (the
defaults) at each `--delays` value of link_latency_ms; the rounds every
`--sync-every` steps, the final merge at the end. `--set KEY=VALUE` gives
the mend runs a setting; a `--runs` item's own `+KEY=VALUE` gives it to that
run alone (its loss is compared with the synchronous run of the same
settings).

Per row: tokens/s of both learners together and its ratio to local's of
the same seed, the held-out loss after the last step (after the final merge
with mend) and its change from synchronous at the same delay, the median
inner step outside boundaries and local's, the peak GPU memory (the larger
learner's), mend_init, the first round's step and the final merge
(mend_shutdown); with `--eval-every N` also the held-out loss every N steps
(the mean of the two learners' own models, outside the timed steps).
With --fsdp2 each learner's model is sharded by FSDP2 (fully_shard of every
block, then of the model, over the learner's own process group of one rank:
one GPU holds both learners, and NCCL takes one rank a GPU): mend then
works on FSDP2's local shards, as for a learner sharded over many ranks.
Prints a table and writes a CSV; exits 1 when a run failed.
Needs torch >= 2.0 (the model is built on its device, and the decoder
attends with scaled_dot_product_attention); Debian's torch 1.13 is refused
at the start.
"""
import argparse
import csv
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

TOKEN = "gpu-sweep-token-0123456789"
VOCAB_USED = 4096  # the synthetic language's tokens (of the model's vocabulary)


def make_model(tiny, device):
    import torch

    dtype = torch.float32 if tiny or device == "cpu" else torch.bfloat16
    shape = dict(vocab=151936, hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2)
    if tiny:
        shape = dict(vocab=VOCAB_USED, hidden=128, intermediate=344, layers=2, heads=4, kv_heads=2)
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                             intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                             num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                             max_position_embeddings=4096, tie_word_embeddings=True)
        with torch.device(device):  # initialised where it trains: no 6 GB of float32 on the host
            model = Qwen2ForCausalLM(config).to(dtype=dtype)
        kind = "transformers Qwen2ForCausalLM"

        def loss_of(tokens):
            return model(input_ids=tokens, labels=tokens).loss
    except ImportError:
        with torch.device(device):
            model = Decoder(**shape).to(dtype=dtype)
        kind = "bench Decoder (transformers not installed)"

        def loss_of(tokens):
            logits = model(tokens[:, :-1])
            return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
    return model, loss_of, kind


def Decoder(vocab, hidden, intermediate, layers, heads, kv_heads):
    """A pre-norm decoder of Qwen2's widths: embeddings tied to the head,
    causal attention (torch's scaled_dot_product_attention), a SiLU-gated MLP."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = torch.nn.RMSNorm(hidden) if hasattr(torch.nn, "RMSNorm") else torch.nn.LayerNorm(hidden)
            self.norm2 = torch.nn.RMSNorm(hidden) if hasattr(torch.nn, "RMSNorm") else torch.nn.LayerNorm(hidden)
            self.head_dim = hidden // heads
            self.q = torch.nn.Linear(hidden, hidden)
            self.kv = torch.nn.Linear(hidden, 2 * kv_heads * self.head_dim)
            self.o = torch.nn.Linear(hidden, hidden, bias=False)
            self.gate = torch.nn.Linear(hidden, 2 * intermediate, bias=False)
            self.down = torch.nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            h = self.norm1(x)
            q = self.q(h).view(b, t, heads, self.head_dim).transpose(1, 2)
            k, v = self.kv(h).view(b, t, 2, kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, hidden))
            g, u = self.gate(self.norm2(x)).chunk(2, dim=-1)
            return x + self.down(torch.nn.functional.silu(g) * u)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, hidden)
            torch.nn.init.normal_(self.embed.weight, std=0.02)  # tied to the head: small logits
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.norm = torch.nn.LayerNorm(hidden)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.t()

    return Model()


class Language:
    """A fixed random Markov chain over VOCAB_USED tokens (each token has 8
    likely successors): streams of it differ by seed, the chain does not.
    Drawn with Python's random on lists (a few milliseconds a batch: the
    chain is sequential, and small tensor operations would cost more)."""

    def __init__(self, device):
        chain = random.Random(12345)
        self.successors = [[chain.randrange(VOCAB_USED) for _ in range(8)] for _ in range(VOCAB_USED)]
        self.device = device

    def batch(self, generator, batch, length):
        import torch

        rows = []
        for _ in range(batch):
            token = generator.randrange(VOCAB_USED)
            row = [token]
            for pick in generator.choices(range(8), k=length - 1):
                token = self.successors[token][pick]
                row.append(token)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)


def shard_with_fsdp2(model, device, store_file):
    """--fsdp2: the model sharded by FSDP2 over this learner's own process
    group of one rank (its blocks, then the whole)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo" if device == "cpu" else "cpu:gloo,cuda:nccl", init_method=f"file://{store_file}",
                            rank=0, world_size=1)
    mesh = init_device_mesh(device, (1,))
    for module in list(model.modules()):
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def worker(args):
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    if device == "cpu":
        # Two learners share the processors with mend's threads: torch's
        # spinning intra-op threads would starve the rounds.
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial model on both learners
    model, loss_of, kind = make_model(args.tiny, device)
    if args.fsdp2:
        shard_with_fsdp2(model, device, args.out + ".store")
        kind += ", FSDP2"
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    language = Language(device)
    data = random.Random(1000 * args.seed + args.rank)
    runtime = None
    init_s = 0.0
    if args.mode != "local":
        import mend

        config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2, sync_period_steps=args.sync_every,
                                 concurrent_outer_step=args.mode == "concurrent", total_steps=args.steps,
                                 final_merge=True, link_latency_ms=args.delay, host_staging=args.host_staging,
                                 log_level="warn", **settings(args.set))
        t0 = time.perf_counter()
        runtime = mend.mend_init(model, config, f"gpu-{args.rank}", optimizer=optimizer)
        init_s = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, boundary = [], []
    tokens = 0
    curve, evaluating = {}, 0.0

    def held_out_loss():
        generator = random.Random(999_999)  # the same batches at every evaluation
        with torch.no_grad():
            return statistics.mean(loss_of(language.batch(generator, args.batch, args.seq)).item()
                                   for _ in range(args.eval_batches))

    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = language.batch(data, args.batch, args.seq)
        t0 = time.perf_counter()
        loss = loss_of(batch)
        loss.backward()
        if runtime is not None:
            runtime.report_tokens(batch.numel())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        (boundary if step % args.sync_every == 0 else steps).append(seconds)
        tokens += batch.numel()
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            t0 = time.perf_counter()  # not training: left out of train_s
            curve[step] = held_out_loss()
            evaluating += time.perf_counter() - t0
    train_s = time.perf_counter() - started - evaluating
    final_s = 0.0
    stats, phases = {}, {}
    if runtime is not None:
        import mend

        t0 = time.perf_counter()
        mend.mend_shutdown(model)
        final_s = time.perf_counter() - t0
        stats = runtime.stats()  # the final ones
        phases = runtime.round_phases()
    curve[args.steps] = held_out_loss()
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    digest = None
    with torch.no_grad():  # the parameters' bits, to compare mend's learners
        digest = hashlib.sha256() if runtime is not None else None
        for p in model.parameters() if digest is not None else ():
            p = p.to_local() if hasattr(p, "to_local") else p  # (--fsdp2: the shard's bits)
            bits = p.detach().view(torch.int16 if p.element_size() == 2 else torch.int32)
            digest.update(bits.cpu().numpy().tobytes())
        digest = digest.hexdigest() if digest is not None else None
    with open(args.out, "w") as f:
        json.dump({"rank": args.rank, "kind": kind, "device": device,
                   "parameters": sum(p.numel() for p in model.parameters()), "init_s": init_s,
                   "train_s": train_s, "tokens": tokens, "step_median_s": statistics.median(steps),
                   "first_boundary_s": boundary[0] if boundary else 0.0, "final_s": final_s,
                   "held_out_loss": curve[args.steps], "curve": curve, "peak_gpu_bytes": peak,
                   "rounds": stats.get("rounds", 0), "round_waits": stats.get("round_waits", 0),
                   "staging_s": stats.get("staging_seconds", 0.0), "deferred_steps": stats.get("deferred_steps", 0),
                   "staging_host_bytes": stats.get("staging_host_bytes", 0),
                   "round_phases": phases,
                   "digest": digest}, f)


def wait_all(procs, timeout):
    """Waits for the learners; the first to fail, or the deadline, stops the
    others at once (a learner left alone would train on through rounds that
    each wait out the quorum's timeout, spending the session's budget).
    Returns why the run failed, or ""."""
    deadline = time.monotonic() + timeout
    failure = ""
    while not failure and None in [p.poll() for p in procs]:  # (every one polled)
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed:
            failure = f"a learner exited with {failed[0]}"
        elif time.monotonic() > deadline:
            failure = f"not done in {timeout:g} s"
        else:
            time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    failed = [p.returncode for p in procs if p.returncode != 0]
    return failure or (f"a learner exited with {failed[0]}" if failed else "")


def run(args, mode, delay, seed, run_settings, lighthouse):
    """One (mode, delay, seed) with its mend settings: two learner processes;
    their results merged into a row, or a row that says why there is none."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{r}.json") for r in range(2)]
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)
        common = ["--mode", mode, "--delay", str(delay), "--seed", str(seed), "--steps", str(args.steps),
                  "--sync-every", str(args.sync_every), "--batch", str(args.batch), "--seq", str(args.seq),
                  "--lr", str(args.lr), "--eval-batches", str(args.eval_batches),
                  "--eval-every", str(args.eval_every), "--lighthouse", lighthouse]
        common += ["--tiny"] if args.tiny else []
        common += ["--cpu"] if args.cpu else []
        common += ["--fsdp2"] if args.fsdp2 else []
        common += ["--host-staging", args.host_staging]
        for setting in run_settings:
            common += ["--set", setting]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                                   "--out", outs[r]] + common, env=env) for r in range(2)]
        failure = wait_all(procs, args.run_timeout)
        if failure:
            print(f"gpu_delay_sweep: {mode} at {delay} ms, seed {seed}: {failure}", flush=True)
            return {"mode": mode, "delay_ms": delay, "seed": seed, "settings": " ".join(run_settings),
                    "error": failure}
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    phases = {}
    for r in results:
        for name, seconds in r.get("round_phases", {}).items():
            phases[name] = max(phases.get(name, 0.0), seconds)
    return {
        "mode": mode, "delay_ms": delay, "seed": seed,
        "tokens_per_s": sum(r["tokens"] / r["train_s"] for r in results),
        "held_out_loss": statistics.mean(r["held_out_loss"] for r in results),
        # The held-out loss at every --eval-every step (the mean of the two
        # learners' own models; after the final merge at the last step).
        "loss_curve": json.dumps({step: round(statistics.mean(r["curve"][step] for r in results), 4)
                                  for step in results[0]["curve"]}),
        "step_median_s": statistics.median(r["step_median_s"] for r in results),
        "peak_gpu_gib": max(r["peak_gpu_bytes"] for r in results) / 2**30,
        "init_s": max(r["init_s"] for r in results),
        "first_boundary_s": max(r["first_boundary_s"] for r in results),
        "final_merge_s": max(r["final_s"] for r in results),
        "rounds": max(r["rounds"] for r in results),
        "round_waits": sum(r["round_waits"] for r in results),
        "staging_s": max(r.get("staging_s", 0.0) for r in results),
        "deferred_steps": max(r.get("deferred_steps", 0) for r in results),
        # The host copies' memory of one learner (pinned for a GPU, as torch rounds it).
        "staging_host_gib": max(r.get("staging_host_bytes", 0) for r in results) / 2**30,
        "round_phases": json.dumps({k: round(v, 3) for k, v in sorted(phases.items())}),
        "identical": mode != "local" and all(r["digest"] == results[0]["digest"] for r in results),
        "kind": results[0]["kind"], "device": results[0]["device"], "parameters": results[0]["parameters"],
        "settings": " ".join(run_settings),
    }


def settings(items):
    """--set KEY=VALUE items as MendConfig keywords (checked there)."""
    keys = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"gpu_delay_sweep: --set {item!r}: expected KEY=VALUE")
        keys[key] = value
    return keys


def planned_runs(args):
    """(mode, delay, seed, settings) in the order they run: --runs as given
    (mode@delay#seed, each optionally followed by +KEY=VALUE settings of its
    own, comma-separated), else for each seed local and both modes at every
    delay. A mend run's settings are --set's, then its own; a local run has
    none."""
    if args.runs:
        runs = []
        for item in args.runs.split(","):
            run_spec, *own = item.split("+")
            rest, _, seed = run_spec.partition("#")
            mode, _, delay = rest.partition("@")
            if mode not in ("local", "synchronous", "concurrent"):
                raise SystemExit(f"gpu_delay_sweep: --runs item {item!r}: the mode is local, synchronous or concurrent")
            if own and mode == "local":
                raise SystemExit(f"gpu_delay_sweep: --runs item {item!r}: a local run has no mend settings")
            runs.append((mode, int(delay or 0), int(seed or 1), [] if mode == "local" else args.set + own))
        return runs
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        runs.append(("local", 0, seed, []))
        for delay in (int(d) for d in args.delays.split(",")):
            runs += [("synchronous", delay, seed, args.set), ("concurrent", delay, seed, args.set)]
    return runs


HEADER = (f"{'mode':<12} {'delay':>6} {'seed':>4} {'tokens/s':>10} {'of local':>8} {'loss':>7} {'vs sync':>8} "
          f"{'step s':>7} {'peak GiB':>8} {'init s':>7} {'1st bdry s':>10} {'final s':>8} {'waits':>5} {'same':>4}")


def row_text(r):
    if "error" in r:
        return f"{r['mode']:<12} {r['delay_ms']:>6} {r['seed']:>4}  failed: {r['error']}  {r['settings']}"
    vs_sync = "" if r.get("loss_vs_sync") is None else f"{100 * r['loss_vs_sync']:>+7.2f}%"
    of_local = "" if r.get("of_local") is None else f"{r['of_local']:>8.3f}"
    same = "-" if r["mode"] == "local" else "yes" if r["identical"] else "NO"
    return (f"{r['mode']:<12} {r['delay_ms']:>6} {r['seed']:>4} {r['tokens_per_s']:>10.0f} {of_local:>8} "
            f"{r['held_out_loss']:>7.4f} {vs_sync:>8} {r['step_median_s']:>7.3f} "
            f"{r['peak_gpu_gib']:>8.2f} {r['init_s']:>7.2f} {r['first_boundary_s']:>10.2f} "
            f"{r['final_merge_s']:>8.2f} {r['round_waits']:>5} {same:>4}"
            + (f"  {r['settings']}" if r["settings"] else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delays", default="0,500,1000,2000", help="link_latency_ms values, comma-separated")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--runs", default="", help="the runs in order instead, e.g. local#1,concurrent@2000#1,concurrent@2000#1+outer_apply=exact")
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--sync-every", type=int, default=40)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=0,
                   help="also the held-out loss every N steps (the CSV's loss_curve; not in tokens/s)")
    p.add_argument("--run-timeout", type=float, default=7200, help="seconds a run may take before it is stopped")
    p.add_argument("--tiny", action="store_true", help="a model of a few million parameters (a CPU check)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is")
    p.add_argument("--fsdp2", action="store_true",
                   help="each learner's model sharded by FSDP2 over a process group of its own (see above)")
    p.add_argument("--host-staging", default="auto", choices=["auto", "always"],
                   help="mend's host_staging (always: a CPU run goes through the staging a GPU's does)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a mend setting for every learner of the mend modes (repeatable)")
    p.add_argument("--csv", default="bench-results/gpu_delay_sweep.csv")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="local", help=argparse.SUPPRESS)
    p.add_argument("--delay", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import torch

    # The model is built on its device (torch.device as a context manager) and
    # attends with scaled_dot_product_attention: torch 2.0 and later.
    if int(torch.__version__.split(".")[0]) < 2:
        raise SystemExit(f"gpu_delay_sweep: needs torch >= 2.0 (this is {torch.__version__}): the model is "
                         "built on its device with torch.device as a context manager")
    import mend

    runs = planned_runs(args)
    for *_, run_settings in runs:  # a bad setting is refused before any run, naming the key
        mend.MendConfig(**settings(run_settings))
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 log_level="warn"), token=TOKEN)
    print(f"gpu delay sweep: 2 learners on one device, {args.batch} x {args.seq} tokens a step each, "
          f"H = {args.sync_every}, {args.steps} steps, {len(runs)} runs"
          f"{', settings ' + ' '.join(args.set) if args.set else ''}\n", flush=True)
    print(HEADER, flush=True)
    rows = []
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    def compare(row):
        # Against the local run and the synchronous one of its seed (and
        # delay and settings) among the rows so far.
        if "error" in row:
            return
        seed, delay = row["seed"], row["delay_ms"]
        local = next((r for r in rows if r["mode"] == "local" and r["seed"] == seed and "error" not in r), None)
        sync = next((r for r in rows if r["mode"] == "synchronous" and r["seed"] == seed
                     and r["delay_ms"] == delay and r["settings"] == row["settings"] and "error" not in r),
                    None)
        row["of_local"] = row["tokens_per_s"] / local["tokens_per_s"] if local else None
        row["loss_vs_sync"] = row["held_out_loss"] / sync["held_out_loss"] - 1 if sync else None

    def write_csv():
        fields = []
        for r in rows:
            fields += [k for k in r if k not in fields]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)

    for mode, delay, seed, run_settings in runs:
        row = run(args, mode, delay, seed, run_settings, lighthouse.address)
        compare(row)
        rows.append(row)
        print(row_text(row), flush=True)
        write_csv()  # after every run: a run cut short keeps the rows before it
    lighthouse.shutdown()
    # The comparisons again with every row there (a run before its local or
    # synchronous partner got none), into the CSV.
    for row in rows:
        compare(row)
    write_csv()
    done = [r for r in rows if "error" not in r]
    if done:
        print(f"\n{done[0]['kind']}, {done[0]['parameters'] / 1e9:.3f} B parameters on {done[0]['device']}")
    print(f"wrote {args.csv}")
    failed = len(rows) - len(done)
    if failed:
        raise SystemExit(f"gpu_delay_sweep: {failed} of {len(rows)} runs failed (their rows say why)")


if __name__ == "__main__":
    main()
