"""One learner of a mend job trained by the transformers Trainer with FSDP2
through Accelerate (``fsdp_config={"fsdp_version": 2}``) and
mend.integrations.transformers.MendCallback, as a user writes it: one
torchrun per learner, every rank of it a rank of the Trainer.

    torchrun --nproc_per_node R trainer_fsdp2.py --learner I --lighthouse ADDR --out DIR
             [--steps N] [--period H] [--save-at S] [--resume]

The model is trainer_job.py's tiny LlamaForCausalLM, the same on every
learner; the data are each learner's own (and the Trainer's sampler gives
each rank its part). Checkpoints are the FSDP2 way: the Trainer saves the
model and optimizer sharded (``state_dict_type`` SHARDED_STATE_DICT, DCP),
and the callback saves mend's outer state beside them, each rank its own.

On the CPU, Accelerate applies FSDP to GPU process groups only (its
AcceleratorState keeps ``fsdp_plugin`` for MULTI_GPU and the like, not for
MULTI_CPU). Without a GPU this script lets it apply FSDP on a gloo process
group as well: the one shim, ``_fsdp_on_cpu``. The rest is Accelerate's
FSDP2 path as it runs on GPUs.

Each rank writes DIR/result-<rank>.json: the digest of its own shards
after each of mend's rounds, by round id, the gathered model's digest at
the end, its parameters' kinds, mend's stats and the Trainer's step.
"""
import argparse
import json
import os

import torch
import transformers

from job_processes import digest, local
from trainer_job import BATCH, Padded, tiny_llama


def _fsdp_on_cpu():
    """The CPU shim: Accelerate's FSDP on a MULTI_CPU (gloo) process group."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType
    accelerate_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        accelerate_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learner", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--period", type=int, default=3)
    parser.add_argument("--save-at", type=int, default=6)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        _fsdp_on_cpu()

    import mend
    from mend.integrations.transformers import MendCallback

    model = tiny_llama()
    rounds = {}

    class AfterStep(transformers.TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            stats = callback.runtime.stats()
            if stats["last_round_id"] and stats["last_round_id"] not in rounds:
                rounds[stats["last_round_id"]] = digest([local(p) for p in model.parameters()])

    config = mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2, sync_period_steps=args.period,
                             concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=5000,
                             quorum_timeout_ms=60000, log_level="warn", dataplane_host="127.0.0.1")
    callback = MendCallback(config, f"learner-{args.learner}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    training = transformers.TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=BATCH, learning_rate=3e-3,
        lr_scheduler_type="constant", save_strategy="steps", save_steps=args.save_at, logging_steps=2,
        report_to="none", use_cpu=not on_gpu, seed=11 + args.learner, disable_tqdm=True, dataloader_num_workers=0,
        fsdp=True, fsdp_config={"fsdp_version": 2, "state_dict_type": "SHARDED_STATE_DICT",
                                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    trainer = transformers.Trainer(model=model, args=training,
                                   train_dataset=Padded(args.learner, world * BATCH * args.steps),
                                   callbacks=[callback, AfterStep()])
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    stats = callback.runtime.stats()
    kinds = sorted({f"{type(p).__name__} {tuple(str(x) for x in getattr(p, 'placements', ()))}"
                    for p in model.parameters()})
    gathered = digest([p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()])
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    with open(os.path.join(args.out, f"result-{rank}.json"), "w") as out:
        json.dump({"rounds": rounds, "final": gathered, "kinds": kinds, "global_step": trainer.state.global_step,
                   "device": str(local(next(model.parameters())).device),
                   "local_values": sum(local(p).numel() for p in model.parameters()),
                   "model_values": sum(p.numel() for p in model.parameters()),
                   "saved": sorted(os.listdir(args.out)),
                   "stats": {k: stats[k] for k in ("rounds", "steps", "heals", "bytes_sent", "group_state_bytes_sent")}},
                  out)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
