"""One rank of a learner whose model is sharded over its ranks, as a user
writes it under torchrun: a gloo process group, the model sharded with
FSDP2's fully_shard, tensor parallelism (parallelize_module) or both on a
2-D mesh (or kept whole in DDP, to compare), then mend_init / train /
mend_shutdown.

--mode train: AdamW on real batches, mend after every optimizer step.
--mode fixed: manual=True, and each inner step changes every value by a
  fixed elementwise rule, so that the rounds' results can be compared
  exactly across layouts.

--die-at-step N: rank 1 exits at its step N in torchrun's first attempt
  (torchrun --max-restarts restarts the learner, which heals rank by rank);
  the loop then runs until the job's step (a heal moves it) reaches --steps.
--save DIR: after the last step, torch.distributed.checkpoint saves the
  model and mend's runtime (a Stateful) into DIR; --load DIR: right after
  mend_init, it loads them from DIR (saved with any number of ranks), and
  the steps go on from --start-step.

Writes, for this rank: after each round, a digest of its own pieces and of
the whole model (gathered for the check only: DTensor.full_tensor()), and at
the end the whole model and the learner's stats."""
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist

from job_processes import digest, local
from mend import MendConfig, mend_init, mend_shutdown


def build(layout, world, device="cpu"):
    """The model as `layout` shards it over the learner's `world` ranks, on
    `device` ("cpu", or "cuda": a GPU a rank)."""
    torch.manual_seed(1)  # the same initial model on every rank and learner
    # In the middle a LayerNorm, which tensor parallelism leaves whole on
    # every rank (a large replicated piece: 512 of the 6,663 values); or
    # (fsdp2-bn) a BatchNorm, whose running statistics are buffers, whole on
    # every rank. The last layer's 7 rows do not divide among 2 ranks:
    # FSDP2 pads its shards.
    middle = torch.nn.BatchNorm1d(256) if layout == "fsdp2-bn" else torch.nn.LayerNorm(256)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), middle, torch.nn.Linear(256, 7)).to(device)
    if layout == "ddp":
        return model, torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    # (The LayerNorm normalizes whole rows: the first layer's output is gathered for it.)
    plan = {"0": ColwiseParallel(output_layouts=Replicate()), "2": RowwiseParallel(input_layouts=Replicate())}
    if layout in ("fsdp2", "fsdp2-mp", "fsdp2-offload", "fsdp2-bn"):
        # fsdp2-mp: bf16 compute on gathered copies; mend keeps to the fp32
        # shards. fsdp2-offload (a GPU's): the shards live on the host.
        policy = {}
        if layout == "fsdp2-mp":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
        if layout == "fsdp2-offload":
            from torch.distributed.fsdp import CPUOffloadPolicy
            policy = {"offload_policy": CPUOffloadPolicy()}
        mesh = init_device_mesh(device, (world,), mesh_dim_names=("dp",))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, **policy)
        fully_shard(model, mesh=mesh, **policy)
    elif layout == "tp":
        mesh = init_device_mesh(device, (world,), mesh_dim_names=("tp",))
        # (The LayerNorm between, and RowwiseParallel's bias, stay whole: Replicate() pieces.)
        parallelize_module(model, mesh, plan)
    elif layout == "2d":
        mesh = init_device_mesh(device, (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], plan)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    else:
        raise SystemExit(f"unknown layout {layout}")
    return model, model


def whole(tensor):
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).cpu()


def perturb(tensor, learner, step):
    """A fixed inner step, elementwise and exactly rounded (a multiply, then
    an add), so that a value ends the same wherever a layout puts it."""
    tensor.mul_(1.0 - 0.01 * learner).add_(0.001 * ((step % 7) - 3) * (learner + 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--learner", type=int, required=True)
    parser.add_argument("--layout", default="fsdp2")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--start-step", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, a MendConfig keyword (an int, "
                        "true/false, or text)")
    parser.add_argument("--die-at-step", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU a rank, NCCL beside gloo)")
    parser.add_argument("--save", default="")
    parser.add_argument("--load", default="")
    parser.add_argument("--out", required=True, help="the result file; %%r becomes the rank")
    args = parser.parse_args()
    torch.set_num_threads(1)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    # (torchrun's store outlives a restart: each attempt's group keys its own.)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo" if args.device == "cpu" else "cpu:gloo,cuda:nccl",
                            store=dist.PrefixStore(f"sharded-{attempt}/", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, wrapped = build(args.layout, world, args.device)
    settings = dict(sync_period_steps=args.period, concurrent_outer_step=False)
    for item in args.set:
        key, value = item.split("=", 1)
        settings[key] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    config = MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2, quorum_timeout_ms=30000,
                        log_level="warn", **settings)
    fixed = args.mode == "fixed"
    optimizer = None if fixed else torch.optim.AdamW(model.parameters(), lr=0.01)
    names = [name for name, _ in model.named_parameters()]
    runtime = mend_init(wrapped, config, f"learner-{args.learner}", manual=fixed)
    if args.load:
        import torch.distributed.checkpoint as dcp
        state = {"model": model.state_dict(), "mend": runtime}
        dcp.load(state, checkpoint_id=args.load)
        model.load_state_dict(state["model"])
        assert runtime.stats()["steps"] == args.start_step, runtime.stats()
        # A copy of a sharded state (as torch.save and torch.load would make
        # it) is refused: only DCP's load in place brings each rank its own.
        copied = {key: {name: t.clone() for name, t in value.items()} if isinstance(value, dict) else value
                  for key, value in runtime.state_dict().items()}
        try:
            runtime.load_state_dict(copied)
            raise AssertionError("a copied sharded state was loaded")
        except ValueError as error:
            assert "must be loaded with torch.distributed.checkpoint" in str(error), error
    data = torch.Generator().manual_seed(100 * args.learner + rank)
    rounds = []
    last_round = 0
    step = args.start_step
    while (runtime.stats()["steps"] if args.die_at_step else step) < args.steps:
        step += 1
        if args.die_at_step and attempt == 0 and rank == 1 and step == args.die_at_step:
            os._exit(3)  # a host lost: torchrun restarts the whole learner
        if fixed:
            with torch.no_grad():
                for p in model.parameters():
                    perturb(local(p), args.learner, step)
            runtime.step(16)
        else:
            x = torch.randn(16, 16, generator=data).to(args.device)
            loss = (wrapped(x) - x[:, :7].sin()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # mend's reducer runs here
        stats = runtime.stats()
        if stats["last_round_id"] != last_round:
            last_round = stats["last_round_id"]
            full = [whole(p.detach()) for p in model.parameters()]  # (collective: every rank)
            rounds.append({"round": last_round, "step": stats["steps"],
                           "own": digest([local(p) for p in model.parameters()]), "whole": digest(full)})
            if any(True for _ in model.buffers()):
                rounds[-1]["buffers"] = digest(list(model.buffers()))
            if settings.get("desloc"):  # (the first moments are averaged every round: the same everywhere)
                rounds[-1]["exp_avg"] = digest([local(optimizer.state[p]["exp_avg"]) for p in model.parameters()])
    if args.save:
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": model.state_dict(), "mend": runtime}, checkpoint_id=args.save)
    mend_shutdown(wrapped)
    stats = runtime.stats()
    full = {name: whole(p.detach()).tolist() for name, p in zip(names, model.parameters())}
    kinds = {name: f"{type(p).__name__} {p.dtype}" for name, p in zip(names, model.parameters())}
    with open(args.out.replace("%r", str(rank)), "w") as out:
        json.dump({"rank": rank, "attempt": attempt, "rounds": rounds, "model": full, "kinds": kinds,
                   "local_values": sum(local(p).numel() for p in model.parameters()),
                   "devices": sorted({str(local(p).device) for p in model.parameters()}),
                   "stats": {k: stats[k] for k in ("rounds", "bytes_sent", "group_bytes_sent", "group_state_bytes_sent",
                                                     "steps", "heals")}}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
