"""One learner of a mend job trained by Lightning's ModelParallelStrategy
(FSDP2 over the learner's ranks on the CPU, gloo) with
mend.integrations.lightning.MendCallback, as a user writes it: the module
shards itself in configure_model; Lightning starts the learner's ranks.

    lightning_sharded.py --learner I --lighthouse ADDR --out FILE [--steps N] [--period H]
                         [--save DIR] [--resume DIR]

--save DIR: ModelCheckpoint saves at half the steps into DIR (the
strategy's DCP folders; Lightning keeps callback states from rank 0 only).

Each rank writes FILE with %r replaced by its rank: the digest of its own
shards after each round, by round id, and mend's stats."""
import argparse
import json

import torch

import pytorch_lightning as pl
from pytorch_lightning.strategies import ModelParallelStrategy

from job_processes import digest
from mend import MendConfig
from mend.integrations.lightning import MendCallback


class Sharded(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)  # the same start on every learner
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
        self.rounds = {}

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, index):
        x = batch[0]
        return (self.net(x) - x[:, :4].sin()).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs, batch, index):
        stats = self.trainer.callbacks[0].runtime.stats()
        if stats["last_round_id"] and stats["last_round_id"] not in self.rounds:
            self.rounds[stats["last_round_id"]] = digest([p.to_local() for p in self.parameters()])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learner", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--save", default="")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(100 + args.learner)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(400, 8, generator=generator)),
                                       batch_size=8)
    callback = MendCallback(MendConfig(lighthouse=args.lighthouse, sync_period_steps=args.period,
                                       concurrent_outer_step=False, quorum_min_learners=2,
                                       quorum_timeout_ms=30000, log_level="warn"),
                            f"learner-{args.learner}", log_stats=False)
    saving = [pl.callbacks.ModelCheckpoint(dirpath=args.save, every_n_train_steps=args.steps // 2, save_top_k=-1,
                                           filename="{step}")] if args.save else []
    trainer = pl.Trainer(accelerator="cpu", devices=2,
                         strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                         max_steps=args.steps, callbacks=[callback, *saving], logger=False,
                         enable_checkpointing=bool(saving),
                         enable_progress_bar=False, enable_model_summary=False)
    module = Sharded()
    trainer.fit(module, data, ckpt_path=args.resume or None)
    stats = callback.runtime.stats()
    kinds = sorted({f"{type(p).__name__} {tuple(str(x) for x in p.placements)}" for p in module.parameters()})
    with open(args.out.replace("%r", str(trainer.global_rank)), "w") as out:
        json.dump({"rounds": module.rounds, "kinds": kinds, "global_step": trainer.global_step,
                   "model": {name: p.full_tensor().tolist() for name, p in module.named_parameters()},
                   "stats": {k: stats[k] for k in ("rounds", "steps", "bytes_sent", "group_bytes_sent")}}, out)
    # Lightning leaves its process group to the script: a gloo group not
    # destroyed before the interpreter exits may end it with "terminate
    # called without an active exception" (torch's Gloo threads; seen here
    # once, on a loaded machine).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
