"""One learner of a mend job trained by torchtitan's Trainer (torchtitan
0.2.2: llama3's debug model, sharded over the learner's ranks by FSDP2), as
docs/groups.md's recipe writes it: torchtitan builds and shards the model,
mend joins the learners. Run by torchrun, one process a rank:

    torchrun --nproc_per_node R torchtitan_learner.py --learner I --lighthouse ADDR
             --assets DIR --out FILE [--steps N] [--period H] [torchtitan's --flags ...]
    python3 torchtitan_learner.py --make-assets DIR   # a tokenizer and each learner's text

On a machine without CUDA, torchtitan 0.2.2 still picks "cuda". Four
shims make its trainer run on the CPU over gloo (each is marked below); on
a GPU none applies (there, one GPU takes one NCCL rank: one rank a
learner). Each rank writes FILE with %r replaced by its rank: the
digest of its own shards after each round, by round id, the full model
after the final merge, and mend's stats."""
import argparse
import json
import os
import random
import sys
import types

from job_processes import digest, local


def make_assets(root, learners=2):
    """A byte-level BPE tokenizer of 300 tokens and a text corpus a learner
    (torchtitan's c4_test loader reads a folder of JSON lines)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    words = ["the", "a", "rack", "learner", "model", "shard", "round", "merge", "heal", "step", "token", "loss"]
    corpora = []
    for learner in range(1, learners + 1):
        rng = random.Random(learner)
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(40, 120))) for _ in range(200)]
        os.makedirs(os.path.join(root, f"text-{learner}"), exist_ok=True)
        with open(os.path.join(root, f"text-{learner}", "train.json"), "w") as f:
            f.writelines(json.dumps({"text": line}) + "\n" for line in lines)
        corpora += lines
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpora, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(os.path.join(root, "tokenizer"), exist_ok=True)
    tokenizer.save(os.path.join(root, "tokenizer", "tokenizer.json"))
    with open(os.path.join(root, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True}, f)


def run_torchtitan_on_the_cpu():
    """The shims, applied before torchtitan is imported."""
    import torch
    import torch._utils
    # 1. torchtitan.tools.utils takes "cuda" when torch finds no accelerator.
    torch._utils._get_available_device_type = lambda: "cpu"
    # 2. Its memory monitor asks the device module what only torch.cuda answers.
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name, answer in {"get_device_name": lambda *a: "cpu", "memory_stats": lambda *a: {},
                         "get_device_properties": lambda *a: types.SimpleNamespace(total_memory=memory),
                         "reset_peak_memory_stats": lambda *a: None, "empty_cache": lambda *a: None}.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, answer)
    # 3. After the first step it shortens its groups' timeouts behind a
    # barrier on CUDA device ids; on the CPU they keep their first timeout.
    import torchtitan.distributed.utils as dist_utils
    dist_utils.set_pg_timeouts = lambda timeout, parallel_dims: None


def full(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--make-assets", default="")
    parser.add_argument("--learner", type=int)
    parser.add_argument("--lighthouse")
    parser.add_argument("--assets")
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--period", type=int, default=5)
    args, titan_args = parser.parse_known_args()
    if args.make_assets:
        make_assets(args.make_assets)
        return

    import torch
    on_cpu = not torch.cuda.is_available()
    if on_cpu:
        run_torchtitan_on_the_cpu()
        torch.set_num_threads(1)
    import mend
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    init_logger()
    config = ConfigManager().parse_args([
        "--model.name", "llama3", "--model.flavor", "debugmodel",
        "--model.hf_assets_path", os.path.join(args.assets, "tokenizer"),
        "--training.dataset", "c4_test", "--training.dataset_path", os.path.join(args.assets, f"text-{args.learner}"),
        "--training.steps", str(args.steps), "--training.local_batch_size", "2", "--training.seq_len", "64",
        "--debug.seed", "7",  # the same start on every learner
        "--activation_checkpoint.mode", "none", "--compile.no-enable", "--metrics.log_freq", "5",
        "--job.dump_folder", os.path.dirname(os.path.abspath(args.out)),
        *(["--training.mixed_precision_param", "float32"] if on_cpu else []),
        *titan_args])
    trainer = Trainer(config)
    model = trainer.model_parts[0]  # one part: no pipeline parallelism
    if on_cpu:
        # 4. gloo has no PREMUL_SUM, which FSDP2 reduces with when torchtitan
        # sets its gradient divide factor: reduce with SUM, then scale.
        for module in model.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)

    runtime = mend.mend_init(model, mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2,
                                                    sync_period_steps=args.period, total_steps=args.steps,
                                                    concurrent_outer_step=False, quorum_timeout_ms=60000,
                                                    log_level="warn"),
                             f"learner-{args.learner}", optimizer=trainer.optimizers.optimizers[0])
    runtime.on_step_moved(lambda steps: setattr(trainer, "step", trainer.step + steps))  # a heal
    trainer.checkpointer.states["mend"] = runtime  # in torchtitan's DCP checkpoints, each rank its own

    rounds = {}
    train_step = trainer.train_step

    def train_step_then_look(*a, **k):
        train_step(*a, **k)
        last = runtime.stats()["last_round_id"]
        if last and last not in rounds:
            rounds[last] = digest([local(p) for p in model.parameters()])

    trainer.train_step = train_step_then_look
    trainer.train()
    stats = runtime.stats()
    mend.mend_shutdown(model)  # the final merge
    kinds = sorted({f"{type(p).__name__} {tuple(str(x) for x in getattr(p, 'placements', ()))}"
                    for p in model.parameters()})
    rank = torch.distributed.get_rank()
    with open(args.out.replace("%r", str(rank)), "w") as out:
        json.dump({"rounds": rounds, "kinds": kinds, "step": trainer.step,
                   "final": digest([full(p) for p in model.parameters()]),
                   "local_values": sum(local(p).numel() for p in model.parameters()),
                   "model_values": sum(p.numel() for p in model.parameters()),
                   "device": str(next(model.parameters()).device),
                   "stats": {k: stats[k] for k in ("rounds", "steps", "heals", "bytes_sent")}}, out)
    trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
