#!/usr/bin/env python3
"""The transformers Trainer with mend's callback on a GPU, as users run it:
bf16 autocast (``TrainingArguments(bf16=True)``) and a ``torch.compile``d
model (``torch_compile=True``), two learner processes sharing the device,
against the same two Trainers without mend (local), side by side in one run.

    python bench/gpu_trainer.py                        # on a GPU: a 0.1 B Llama, 120 steps, H 40
    python bench/gpu_trainer.py --cpu --tiny --steps 12 --period 4 --no-compile   # a check on a CPU

Per mode: tokens/s of both learners together after the first --warmup
steps (compilation) and against local's, each
learner's loss over its last logging window, the peak GPU memory (the
larger learner's), mend's rounds and whether the two learners' final models
are bit-identical (mend: after the final merge). On a CPU (--cpu) the two
processes share its cores and contend for them, so its tokens/s say
nothing; the CPU run checks that the path works. Prints a table and writes
bench-results/gpu_trainer.csv. It needs torch 2.x with transformers and
accelerate; carry the wheel from scripts/wheel.sh to the GPU machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from delay_sweep import print_table, write_csv  # this folder's (the script's own directory is on sys.path)

TOKEN = "gpu-trainer-bench-token-0123456789"


def learner(args):
    """One learner process: a Trainer, with MendCallback unless --mode local."""
    import torch
    import transformers

    torch.manual_seed(0)  # every learner starts from the same model
    widths = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4) \
        if args.tiny else dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12)
    config = transformers.LlamaConfig(vocab_size=args.vocab, max_position_embeddings=args.length,
                                      num_key_value_heads=widths["num_attention_heads"], **widths)
    model = transformers.LlamaForCausalLM(config)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            generator = torch.Generator().manual_seed(100 + args.learner)
            self.ids = torch.randint(0, args.vocab, (args.steps * args.batch, args.length), generator=generator)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}

    training = transformers.TrainingArguments(
        output_dir=os.path.join(args.work, f"{args.mode}-{args.learner}"), max_steps=args.steps,
        per_device_train_batch_size=args.batch, learning_rate=3e-4, lr_scheduler_type="constant",
        bf16=args.bf16, torch_compile=args.compile, use_cpu=args.cpu, logging_steps=max(1, args.steps // 4),
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=args.learner)
    callbacks = []
    if args.mode == "mend":
        from mend import MendConfig
        from mend.integrations.transformers import MendCallback
        callbacks.append(MendCallback(MendConfig(lighthouse=args.lighthouse, quorum_min_learners=2,
                                                 sync_period_steps=args.period, log_level="warn",
                                                 dataplane_host="127.0.0.1"), f"learner-{args.learner}"))
    marks = {}

    class Clock(transformers.TrainerCallback):  # the steps after the warm-up (compilation, first round)
        def on_step_end(self, training_args, state, control, **kwargs):
            if state.global_step in (args.warmup, args.steps):
                if torch.cuda.is_available() and not args.cpu:
                    torch.cuda.synchronize()
                marks[state.global_step] = time.monotonic()

    trainer = transformers.Trainer(model=model, args=training, train_dataset=Tokens(),
                                   callbacks=callbacks + [Clock()])
    if torch.cuda.is_available() and not args.cpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    seconds = marks[args.steps] - marks[args.warmup]
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    final = torch.cat([p.detach().float().reshape(-1).cpu() for p in model.parameters()])
    torch.save(final, os.path.join(args.work, f"{args.mode}-{args.learner}.pt"))
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() and not args.cpu else 0.0
    stats = callbacks[0].runtime.stats() if callbacks else {}
    print("RESULT " + json.dumps({"seconds": seconds, "tokens": (args.steps - args.warmup) * args.batch * args.length,
                                  "loss": losses[-1] if losses else float("nan"), "peak_gib": peak,
                                  "rounds": stats.get("rounds", 0), "skipped_steps": stats.get("skipped_steps", 0),
                                  "device": torch.cuda.get_device_name(0) if peak else "cpu"}), flush=True)


def run_mode(args, mode, lighthouse):
    processes = []
    for i in range(2):
        argv = [sys.executable, os.path.abspath(__file__), "--role", "learner", "--mode", mode, "--learner", str(i),
                "--lighthouse", lighthouse or "", "--work", args.work] + args.passed
        processes.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, MEND_JOB_TOKEN=TOKEN)))
    results = []
    for i, p in enumerate(processes):
        out = p.communicate(timeout=args.timeout)[0].decode(errors="replace")
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            sys.exit(f"{mode} learner {i} failed ({p.returncode}):\n{out[-4000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    import torch
    finals = [torch.load(os.path.join(args.work, f"{mode}-{i}.pt")) for i in range(2)]
    tokens = sum(r["tokens"] for r in results)
    return {"mode": mode, "device": results[0]["device"], "tokens_per_s": tokens / max(r["seconds"] for r in results),
            "loss_0": results[0]["loss"], "loss_1": results[1]["loss"],
            "peak_gib": max(r["peak_gib"] for r in results), "rounds": results[0]["rounds"],
            "skipped_steps": sum(r["skipped_steps"] for r in results),
            "identical": bool(torch.equal(finals[0], finals[1]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", default="bench", choices=["bench", "learner"])
    parser.add_argument("--mode", default="mend", choices=["local", "mend"])
    parser.add_argument("--learner", type=int, default=0)
    parser.add_argument("--lighthouse", default="")
    parser.add_argument("--work", default="")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--period", type=int, default=40, help="H")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of tokens/s (compilation)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer width-64 model (a check on a CPU)")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--csv", default="bench-results/gpu_trainer.csv")
    args = parser.parse_args()
    if args.role == "learner":
        return learner(args)
    args.passed = [f"--steps={args.steps}", f"--period={args.period}", f"--batch={args.batch}",
                   f"--warmup={args.warmup}",
                   f"--length={args.length}", f"--vocab={args.vocab}"] + \
        (["--tiny"] if args.tiny else []) + (["--cpu"] if args.cpu else []) + \
        ([] if args.compile else ["--no-compile"]) + ([] if args.bf16 else ["--no-bf16"])
    import mend
    rows = []
    with tempfile.TemporaryDirectory() as work:
        args.work = work
        rows.append(run_mode(args, "local", None))
        os.environ["MEND_JOB_TOKEN"] = TOKEN
        with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                             log_level="warn")) as lighthouse:
            rows.append(run_mode(args, "mend", lighthouse.address))
    for r in rows:
        r["of_local"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(f"{rows[0]['device']}; Trainer bf16={args.bf16} torch_compile={args.compile}; {args.steps} steps, "
          f"H={args.period}, 2 learners x {args.batch} x {args.length} tokens a step")
    print_table(rows, [("mode", "mode", ""), ("tokens_per_s", "tokens/s", ".0f"), ("of_local", "of local", ".3f"),
                       ("loss_0", "loss 0", ".3f"), ("loss_1", "loss 1", ".3f"), ("peak_gib", "peak GiB", ".2f"),
                       ("rounds", "rounds", ""), ("identical", "identical", "")])
    write_csv(args.csv, rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
