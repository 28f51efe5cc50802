"""mend at the product's headline shape: a Qwen-2.5-1.5B-shaped model, two
learners sharing one GPU, local against synchronous and concurrent rounds at
growing link latencies.

    python bench/gpu_delay_sweep.py                      # on a GPU: 1.5 B, H 40, 160 steps
    python bench/gpu_delay_sweep.py --delays 0,2000 --seeds 1
    python bench/gpu_delay_sweep.py --tiny --steps 24 --sync-every 8   # a check on a CPU

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
`--sync-every` steps, the final merge at the end.

Per row: tokens/s of both learners together and its ratio to local's of
the same seed, the held-out loss after the last step (after the final merge
with mend) and its change from synchronous at the same delay, the median
inner step outside boundaries and local's, the peak GPU memory (the larger
learner's), mend_init, the first round's step and the final merge
(mend_shutdown). Prints a table and writes a CSV.
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
        model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype)
        kind = "transformers Qwen2ForCausalLM"

        def loss_of(tokens):
            return model(input_ids=tokens, labels=tokens).loss
    except ImportError:
        model = Decoder(**shape).to(device=device, dtype=dtype)
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
    likely successors): streams of it differ by seed, the chain does not."""

    def __init__(self, device):
        import torch

        g = torch.Generator().manual_seed(12345)
        self.successors = torch.randint(0, VOCAB_USED, (VOCAB_USED, 8), generator=g)
        self.device = device

    def batch(self, generator, batch, length):
        import torch

        tokens = torch.empty(batch, length, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB_USED, (batch,), generator=generator)
        for t in range(1, length):
            pick = torch.randint(0, 8, (batch,), generator=generator)
            tokens[:, t] = self.successors[tokens[:, t - 1], pick]
        return tokens.to(self.device)


def worker(args):
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    if device == "cpu":
        # Two learners share the processors with mend's threads: torch's
        # spinning intra-op threads would starve the rounds.
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial model on both learners
    model, loss_of, kind = make_model(args.tiny, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    language = Language(device)
    data = torch.Generator().manual_seed(1000 * args.seed + args.rank)
    held_out = torch.Generator().manual_seed(999_999)
    runtime = None
    init_s = 0.0
    if args.mode != "local":
        import mend

        config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2, sync_period_steps=args.sync_every,
                                 concurrent_outer_step=args.mode == "concurrent", total_steps=args.steps,
                                 final_merge=True, link_latency_ms=args.delay, log_level="warn")
        t0 = time.perf_counter()
        runtime = mend.mend_init(model, config, f"gpu-{args.rank}", optimizer=optimizer)
        init_s = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, boundary = [], []
    tokens = 0
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
    train_s = time.perf_counter() - started
    final_s = 0.0
    stats = {}
    if runtime is not None:
        import mend

        t0 = time.perf_counter()
        stats = runtime.stats()
        mend.mend_shutdown(model)
        final_s = time.perf_counter() - t0
    with torch.no_grad():
        losses = [loss_of(language.batch(held_out, args.batch, args.seq)).item() for _ in range(args.eval_batches)]
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    with open(args.out, "w") as f:
        json.dump({"rank": args.rank, "kind": kind, "device": device,
                   "parameters": sum(p.numel() for p in model.parameters()), "init_s": init_s,
                   "train_s": train_s, "tokens": tokens, "step_median_s": statistics.median(steps),
                   "first_boundary_s": boundary[0] if boundary else 0.0, "final_s": final_s,
                   "held_out_loss": statistics.mean(losses), "peak_gpu_bytes": peak,
                   "rounds": stats.get("rounds", 0), "round_waits": stats.get("round_waits", 0)}, f)


def run(args, mode, delay, seed, lighthouse):
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{r}.json") for r in range(2)]
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)
        common = ["--mode", mode, "--delay", str(delay), "--seed", str(seed), "--steps", str(args.steps),
                  "--sync-every", str(args.sync_every), "--batch", str(args.batch), "--seq", str(args.seq),
                  "--lr", str(args.lr), "--eval-batches", str(args.eval_batches), "--lighthouse", lighthouse]
        common += ["--tiny"] if args.tiny else []
        common += ["--cpu"] if args.cpu else []
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                                   "--out", outs[r]] + common, env=env) for r in range(2)]
        for p in procs:
            if p.wait(timeout=7200) != 0:
                raise SystemExit(f"gpu_delay_sweep: a learner of {mode} at {delay} ms failed ({p.returncode})")
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    return {
        "mode": mode, "delay_ms": delay, "seed": seed,
        "tokens_per_s": sum(r["tokens"] / r["train_s"] for r in results),
        "held_out_loss": statistics.mean(r["held_out_loss"] for r in results),
        "step_median_s": statistics.median(r["step_median_s"] for r in results),
        "peak_gpu_gib": max(r["peak_gpu_bytes"] for r in results) / 2**30,
        "init_s": max(r["init_s"] for r in results),
        "first_boundary_s": max(r["first_boundary_s"] for r in results),
        "final_merge_s": max(r["final_s"] for r in results),
        "round_waits": sum(r["round_waits"] for r in results),
        "kind": results[0]["kind"], "device": results[0]["device"], "parameters": results[0]["parameters"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delays", default="0,500,1000,2000", help="link_latency_ms values, comma-separated")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--sync-every", type=int, default=40)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--tiny", action="store_true", help="a model of a few million parameters (a CPU check)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is")
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
    import mend

    os.environ["MEND_JOB_TOKEN"] = TOKEN
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 log_level="warn"), token=TOKEN)
    delays = [int(d) for d in args.delays.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for seed in seeds:
        local = run(args, "local", 0, seed, lighthouse.address)
        local["of_local"] = 1.0
        local["loss_vs_sync"] = 0.0
        rows.append(local)
        for delay in delays:
            sync = None
            for mode in ("synchronous", "concurrent"):
                row = run(args, mode, delay, seed, lighthouse.address)
                row["of_local"] = row["tokens_per_s"] / local["tokens_per_s"]
                if mode == "synchronous":
                    sync = row
                row["loss_vs_sync"] = row["held_out_loss"] / sync["held_out_loss"] - 1
                rows.append(row)
    lighthouse.shutdown()
    first = rows[0]
    print(f"gpu delay sweep: {first['kind']}, {first['parameters'] / 1e9:.3f} B parameters on {first['device']}, "
          f"2 learners on one device, {args.batch} x {args.seq} tokens a step each, H = {args.sync_every}, "
          f"{args.steps} steps, seeds {args.seeds}\n")
    print(f"{'mode':<12} {'delay':>6} {'seed':>4} {'tokens/s':>10} {'of local':>8} {'loss':>7} {'vs sync':>8} "
          f"{'step s':>7} {'peak GiB':>8} {'init s':>7} {'1st bdry s':>10} {'final s':>8} {'waits':>5}")
    for r in rows:
        print(f"{r['mode']:<12} {r['delay_ms']:>6} {r['seed']:>4} {r['tokens_per_s']:>10.0f} {r['of_local']:>8.3f} "
              f"{r['held_out_loss']:>7.4f} {100 * r['loss_vs_sync']:>+7.2f}% {r['step_median_s']:>7.3f} "
              f"{r['peak_gpu_gib']:>8.2f} {r['init_s']:>7.2f} {r['first_boundary_s']:>10.2f} "
              f"{r['final_merge_s']:>8.2f} {r['round_waits']:>5}")
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main()
