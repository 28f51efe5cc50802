"""Train a small byte-level GPT on Debian's fortunes with plain PyTorch, and
replace the cross-learner exchange with mend, or compare it with DDP, local
training, and a few-line DiLoCo in plain torch.distributed.

    MEND_JOB_TOKEN=$(head -c 24 /dev/urandom | base64) \
      torchrun --nproc_per_node 2 examples/train_gpt.py --mode mend --steps 300

Every process of the torchrun is one learner. --mode:
  mend          mend_init(model, config) on an ordinary AdamW loop; rank 0 embeds a
                lighthouse unless --lighthouse HOST:PORT names one
  ddp           torch.nn.parallel.DistributedDataParallel over gloo (gradients
                averaged every step): what a user would run instead
  local         no exchange at all
  diloco-torch  DiLoCo (arXiv 2311.08105, Algorithm 1) in plain torch.distributed:
                every H steps average the pseudo-gradients, outer Nesterov after
                an outer warm-up of plain averaging (--outer-warmup-steps); an
                independent reference for mend's synchronous fp32 rounds
Rank 0 prints tokens/s, held-out loss and bytes sent, and writes --json.
"""
import argparse
import datetime
import glob
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

FORTUNES = "/usr/share/games/fortunes"


def corpus(rank: int, world: int, split: str):
    """This learner's training text and the held-out text, as `mend train` cuts
    them (src/train/corpus.cc): the English fortunes (Debian package fortunes)
    in file-name order, split at their "%" lines; every 20th fortune is
    held out; the rest are dealt round-robin to the learners (split "iid") or
    cut into contiguous parts, one per learner ("contiguous": each learner
    sees its own topics)."""
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if os.path.isfile(f) and not os.path.islink(f) and not f.endswith((".dat", ".u8")))
    if not files:
        raise SystemExit(f"no fortunes in {FORTUNES}: apt-get install fortunes")
    fortunes = []
    for name in files:
        lines = open(name, "rb").read().split(b"\n")
        current = b""
        for line in lines[:-1] if lines[-1] == b"" else lines:
            if line == b"%":
                if current:
                    fortunes.append(current + b"%\n")
                current = b""
            else:
                current += line + b"\n"
        if current:
            fortunes.append(current + b"%\n")
    held_out = [f for i, f in enumerate(fortunes) if i % 20 == 19]
    training = [f for i, f in enumerate(fortunes) if i % 20 != 19]
    if split == "iid":
        mine = training[rank::world]
    else:
        mine = training[rank * len(training) // world:(rank + 1) * len(training) // world]
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8).long()
    return as_tensor(mine), as_tensor(held_out)


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    """Pre-norm decoder: byte embedding, learned positions, blocks, head (no
    bias). The same layers, in the same order, as `mend train`'s model
    (src/train/model.cc)."""

    def __init__(self, dim=128, layers=2, heads=4, context=64):
        super().__init__()
        self.embed = torch.nn.Embedding(256, dim)
        self.position = torch.nn.Parameter(torch.zeros(context, dim))
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1))

    def init_(self, seed: int, style: str):
        """"mend": N(0, 0.02) weights, zero biases, unit norms, drawn in
        parameter order from one generator, as `mend train` draws them;
        "torch": PyTorch's layer defaults (positions N(0, 0.02))."""
        with torch.no_grad():
            if style == "torch":
                torch.manual_seed(seed)
                for module in self.modules():
                    if module is not self and hasattr(module, "reset_parameters"):
                        module.reset_parameters()
                torch.nn.init.normal_(self.position, std=0.02)
                return
            generator = torch.Generator().manual_seed(seed)
            for name, p_ in self.named_parameters():
                if name.startswith("ln") or ".ln" in name:
                    p_.fill_(0.0 if name.endswith("bias") else 1.0)
                elif name.endswith("bias"):
                    p_.zero_()
                else:
                    p_.normal_(0.0, 0.02, generator=generator)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed(tokens) + self.position[:t]
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["mend", "ddp", "local", "diloco-torch"], default="mend")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--sync-every", type=int, default=50, help="H: inner steps per round")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--outer-warmup-steps", type=int, default=150,
                   help="rounds at steps up to this average the parameters, outer momentum untouched "
                        "(mend's outer_warmup_steps)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--split", choices=["iid", "contiguous"], default="iid",
                   help="how the learners share the training fortunes (iid: round-robin)")
    p.add_argument("--init", choices=["mend", "torch"], default="mend",
                   help="initial parameters: as mend train draws them, or PyTorch's defaults")
    p.add_argument("--lighthouse", default="", help="HOST:PORT of a running lighthouse (mend mode)")
    p.add_argument("--eval-batches", type=int, default=32)
    p.add_argument("--json", default="", help="write the result here (rank 0)")
    p.add_argument("--save-params", default="", help="torch.save the final parameters here (rank 0)")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    shard, held_out = corpus(rank, world, args.split)

    model = GPT(args.dim, args.layers, args.heads, args.context)
    model.init_(args.seed, args.init)  # the same initial model on every rank
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank)
    n_params = sum(p.numel() for p in model.parameters())

    store = None
    if world > 1 and args.mode in ("ddp", "diloco-torch"):
        dist.init_process_group("gloo")
    elif world > 1:  # mend: torchrun's store only tells the learners the lighthouse address
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                              False, timeout=datetime.timedelta(seconds=120))
    trained = model
    runtime = lighthouse = None
    if args.mode == "ddp" and world > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    if args.mode == "mend":
        import mend
        address = args.lighthouse
        if not address and rank == 0:
            lighthouse = mend.Lighthouse(mend.MendConfig(
                bind="127.0.0.1:0", http="127.0.0.1:0", quorum_min_learners=world,
                log_level="warn"))
            address = lighthouse.address
            print(f"lighthouse {address}, status page http://{lighthouse.http_address}/", flush=True)
            if store:
                store.set("mend/lighthouse", address)
        elif not address:
            address = store.get("mend/lighthouse").decode()
        config = mend.MendConfig(
            lighthouse=address, quorum_min_learners=world, sync_period_steps=args.sync_every,
            outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
            outer_warmup_steps=args.outer_warmup_steps, total_steps=args.steps,
            concurrent_outer_step=False, token_weighted_merge=True, codec="fp32", log_level="warn")
        runtime = mend.mend_init(model, config, f"learner-{rank}", optimizer=optimizer)
    global_params = momentum = None
    if args.mode == "diloco-torch":
        for p_ in model.parameters():  # every learner starts from rank 0's parameters
            dist.broadcast(p_.data, 0)
        global_params = [p_.detach().clone() for p_ in model.parameters()]
        momentum = [torch.zeros_like(p_) for p_ in model.parameters()]

    bytes_sent = 0
    started = time.monotonic()
    steps_done = 0
    for step in range(args.steps):
        starts = torch.randint(0, len(shard) - args.context - 1, (args.batch,), generator=data)
        x = torch.stack([shard[s:s + args.context] for s in starts])
        y = torch.stack([shard[s + 1:s + args.context + 1] for s in starts])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss = F.cross_entropy(trained(x).reshape(-1, 256), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if args.mode == "ddp" and world > 1:
            bytes_sent += 2 * (world - 1) * n_params * 4 // world  # ring all-reduce
        optimizer.step()  # in mend mode mend's reducer runs right after it
        steps_done = step + 1
        if runtime is not None and runtime.finished:
            break  # (a restarted learner heals onto the job's step: it ends with the job)
        if args.mode == "diloco-torch" and (step + 1) % args.sync_every == 0:
            with torch.no_grad():
                for p_, g, m in zip(model.parameters(), global_params, momentum):
                    delta = g - p_.data
                    dist.all_reduce(delta)
                    delta /= world
                    if step + 1 <= args.outer_warmup_steps:  # outer warm-up: plain averaging
                        g.sub_(delta)
                    else:
                        m.mul_(args.outer_momentum).add_(delta)
                        g.sub_(args.outer_lr * (delta + args.outer_momentum * m))
                    p_.data.copy_(g)
                bytes_sent += 2 * (world - 1) * n_params * 4 // max(world, 1)
        if rank == 0 and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"{args.mode} step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
    elapsed = time.monotonic() - started
    final_merge_seconds = 0.0  # leaving: the final merge, when the last round was before the last step
    if runtime is not None:
        mend.mend_shutdown(model)
        final_merge_seconds = time.monotonic() - started - elapsed
        bytes_sent = runtime.stats()["bytes_sent"]

    model.eval()
    evaluation = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        losses = []
        for _ in range(args.eval_batches):
            starts = torch.randint(0, len(held_out) - args.context - 1, (args.batch,),
                                   generator=evaluation)
            x = torch.stack([held_out[s:s + args.context] for s in starts])
            y = torch.stack([held_out[s + 1:s + args.context + 1] for s in starts])
            losses.append(F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item())
    result = {"mode": args.mode, "learners": world, "rank": rank, "steps": args.steps,
              "sync_every": args.sync_every, "seed": args.seed, "parameters": n_params,
              "tokens_per_s": steps_done * args.batch * args.context / elapsed,
              "held_out_loss": sum(losses) / len(losses), "bytes_sent": bytes_sent,
              "seconds": elapsed, "final_merge_seconds": final_merge_seconds}
    if rank == 0 and args.save_params:
        torch.save({n: p_.detach().clone() for n, p_ in model.named_parameters()}, args.save_params)
    if rank == 0:
        print(f"{args.mode}: {result['tokens_per_s']:.0f} tokens/s per learner, held-out loss "
              f"{result['held_out_loss']:.4f}, {bytes_sent / 1e6:.1f} MB sent per learner", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if store is not None:  # the lighthouse in rank 0 outlives every learner's leave
        store.set(f"mend/done/{rank}", "1")
        if lighthouse is not None:
            store.wait([f"mend/done/{r}" for r in range(world)])
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if lighthouse is not None:
        lighthouse.shutdown()


if __name__ == "__main__":
    main()
