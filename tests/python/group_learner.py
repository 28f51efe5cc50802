"""One rank of a multi-rank learner, as a user would write it under torchrun:
a process group over gloo, the model in DistributedDataParallel, AdamW,
mend_init / train / mend_shutdown. mend makes every rank of the torchrun one
rank of the learner. Writes, per round, a digest of the whole model this
rank holds, and the loss before and after."""
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist

from job_processes import digest
from learner import TinyLM, batch
from mend import MendConfig, mend_init, mend_shutdown


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--learner", type=int, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--out", required=True, help="the result file; %%r becomes the rank")
    parser.add_argument("--die-at-step", type=int, default=0,
                        help="rank 1 exits at this step in the torchrun's first attempt (it is restarted)")
    parser.add_argument("--save-at", type=int, default=0,
                        help="every rank calls save_checkpoint(--save-path) after this step (collective)")
    parser.add_argument("--save-path", default="")
    parser.add_argument("--host-staging", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # torchrun's store (its agent's, at MASTER_PORT) outlives a restart, and
    # torch 2.x's gloo rendezvous may then read the address a rank of the
    # dead attempt left there: each attempt's group gets keys of its own.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{restart}/", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    torch.manual_seed(1)  # the same initial model everywhere
    model = TinyLM()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=0.02)
    config = MendConfig(lighthouse=args.lighthouse, sync_period_steps=args.period,
                        concurrent_outer_step=False, quorum_min_learners=2,
                        quorum_timeout_ms=20000, host_staging=args.host_staging, log_level="warn")
    # Learner 1 names itself; learner 2 takes group rank 0's HOST-PID (passed on at mend_init).
    runtime = mend_init(ddp, config, f"learner-{args.learner}" if args.learner == 1 else None)
    data = torch.Generator().manual_seed(100 * args.learner + rank)  # every rank its own batches
    eval_data = torch.Generator().manual_seed(999)
    ex, ey = batch(eval_data, 512)

    def held_out():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(ex), ey).item()

    first_loss = held_out()
    rounds = []
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    step = 0
    while runtime.stats()["steps"] < args.steps:  # the job's step: a heal moves it
        step += 1
        if args.die_at_step and attempt == 0 and rank == 1 and step == args.die_at_step:
            os._exit(3)  # a host lost: torchrun restarts the whole group
        x, y = batch(data)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # mend's reducer runs here
        if args.save_at and step == args.save_at:
            runtime.save_checkpoint(args.save_path)
        stats = runtime.stats()
        if len(rounds) < stats["rounds"]:
            rounds.append({"round": stats["last_round_id"], "digest": digest(model.parameters())})
    stats = runtime.stats()
    mend_shutdown(ddp)
    with open(args.out.replace("%r", str(rank)), "w") as f:
        json.dump({"attempt": attempt, "rank": rank, "world": dist.get_world_size(), "learner_id": runtime.learner_id,
                   "group_size": runtime.config.group_size, "group_rank": runtime.config.group_rank,
                   "group_store": runtime.config.group_store,
                   "rounds": rounds, "first_loss": first_loss, "last_loss": held_out(),
                   "bytes_sent": stats["bytes_sent"]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
