"""One learner process of a job trained by a framework's own loop, as a user
writes it from docs/python.md: the transformers Trainer with
mend.integrations.transformers.MendCallback, a plain Accelerate loop, or a
Lightning Trainer with mend.integrations.lightning.MendCallback. The model
is a tiny randomly initialised LlamaForCausalLM, the same for every
learner; the data are each learner's own, padded.

    trainer_job.py FRAMEWORK --learner I --lighthouse ADDR --out DIR --result FILE
                   [--steps N] [--period H] [--save-at S] [--resume]
                   [--min-learners K] [--ahead-at S --ahead-file F] [--start-after F]
                   [--schedule]

``--schedule``: a learning-rate schedule of the framework's own (the
Trainer's linear decay after 3 warm-up steps; Lightning: a LambdaLR of
interval "step"), else a constant rate.

A learner started late (``--start-after F``: it waits for the file F)
heals onto the job's step. The learner ahead (``--ahead-at S``) writes F
after its step S and waits until the late one's first join is pending, so
that its next round heals it.

Writes to FILE (torch.save): the parameters after each round (by mend
step), after the end (the final merge), mend's stats, the real tokens of
the training forwards (counted here, without mend) and what the
framework logged of mend's counters, the learning rate after each
optimizer step (by mend step) and the framework's own step count at the end.
"""
import argparse
import json
import os
import sys
import time
import warnings

import torch
import transformers

import mend

VOCAB, LENGTH, EXAMPLES, BATCH = 48, 12, 64, 4


def tiny_llama():
    torch.manual_seed(0)  # the same start for every learner
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


class Padded(torch.utils.data.Dataset):
    """Learner ``learner``'s examples: LENGTH ids, of which the first 3..LENGTH are real."""

    def __init__(self, learner, count=EXAMPLES):
        generator = torch.Generator().manual_seed(100 + learner)
        self.ids = torch.randint(0, VOCAB, (count, LENGTH), generator=generator)
        real = torch.randint(3, LENGTH + 1, (count,), generator=generator)
        self.mask = (torch.arange(LENGTH)[None, :] < real[:, None]).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].masked_fill(self.mask[i] == 0, -100)
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": labels}


class Watch:
    """Counts the real tokens of the model's training forwards (independently
    of mend) and keeps the parameters after each of mend's rounds."""

    def __init__(self, model, args):
        self.model, self.period, self.args = model, args.period, args
        self.tokens = 0
        self.trainer_steps = 0  # (optimizer steps the framework took)
        self.after_rounds = {}
        self.rates = {}  # the optimizer's learning rate after each step, by mend step
        self.global_step = None  # the framework's own count at the end
        model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def _forward(self, module, args, kwargs):
        if module.training:
            self.tokens += int(kwargs["attention_mask"].sum())

    def flat(self):
        return torch.cat([p.detach().reshape(-1).clone() for p in self.model.parameters()])

    def stepped(self):
        runtime = mend.get_runtime(self.model) or mend.get_runtime(getattr(self, "outer", self.model))
        steps = runtime.stats()["steps"]
        self.trainer_steps += 1
        self.rates[steps] = runtime._optimizer.param_groups[0]["lr"]
        if steps and steps % self.period == 0 and steps not in self.after_rounds:
            self.after_rounds[steps] = self.flat()
        if self.trainer_steps == self.args.ahead_at:
            wait_until_the_late_learner_joins(self.args)


def wait_until_the_late_learner_joins(args):
    """--ahead-at: tells the late learner to start, and waits until its first join is pending."""
    with open(args.ahead_file, "w") as f:
        f.write("ahead")
    late = f"learner-{1 - args.learner}"
    deadline = time.monotonic() + 120
    while not any(learner["id"] == late and learner["state"] == "waiting"
                  for learner in mend.status(args.lighthouse)["learners"]):
        assert time.monotonic() < deadline, f"{late}'s join was not pending within 120 s"
        time.sleep(0.02)


def wait_for_file(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no {path} within 120 s"
        time.sleep(0.02)


def mend_config(args):
    return mend.MendConfig(lighthouse=args.lighthouse, quorum_min_learners=args.min_learners,
                           sync_period_steps=args.period,
                           concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=3000,
                           quorum_timeout_ms=60000, log_level="warn", dataplane_host="127.0.0.1")


def with_transformers(args, model, watch):
    from mend.integrations.transformers import MendCallback

    class AfterStep(transformers.TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            watch.stepped()

    training = transformers.TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=BATCH, learning_rate=3e-3,
        lr_scheduler_type="linear" if args.schedule else "constant", warmup_steps=3 if args.schedule else 0,
        save_strategy="steps", save_steps=args.save_at, logging_steps=2,
        report_to="none", use_cpu=True, seed=11 + args.learner, disable_tqdm=True, dataloader_num_workers=0)
    callback = MendCallback(mend_config(args), f"learner-{args.learner}")
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Padded(args.learner),
                                   callbacks=[callback, AfterStep()])
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    watch.global_step = trainer.state.global_step
    logged = [entry for entry in trainer.state.log_history if "mend/rounds" in entry]
    return callback.runtime.stats(), logged


def with_accelerate(args, model, watch):
    import accelerate
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    loader = torch.utils.data.DataLoader(Padded(args.learner), batch_size=BATCH // 2, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    config = mend_config(args).replace(total_steps=args.steps)  # (the callbacks set it from the trainer)
    runtime = mend.mend_init(model, config, f"learner-{args.learner}", optimizer=optimizer)
    accelerator.register_for_checkpointing(runtime)
    done = 0
    if args.resume:
        accelerator.load_state(os.path.join(args.out, "saved"))
        done = runtime.stats()["steps"]
        loader = accelerator.skip_first_batches(loader, 2 * done)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        watch.stepped()
        if accelerator.sync_gradients and runtime.stats()["steps"] == args.save_at and not args.resume:
            accelerator.save_state(os.path.join(args.out, "saved"))
        if runtime.finished:
            break
    mend.mend_shutdown(model)
    return runtime.stats(), []


def with_lightning(args, model, watch):
    import pytorch_lightning as pl
    from mend.integrations.lightning import MendCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
            if not args.schedule:
                return optimizer
            decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": decay, "interval": "step"}}

        def on_train_batch_end(self, outputs, batch, batch_idx):
            watch.stepped()

    module = Module()
    watch.outer = module
    callback = MendCallback(mend_config(args), f"learner-{args.learner}")
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.save_at, save_top_k=-1,
                                               filename="{step}")
    logger = pl.loggers.CSVLogger(args.out, name="logs", version=0)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, callbacks=[callback, checkpoints],
                         logger=logger, log_every_n_steps=1, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader(Padded(args.learner, args.save_at * BATCH), batch_size=BATCH,
                                         shuffle=False)
    resume = os.path.join(args.out, f"step={args.save_at}.ckpt") if args.resume else None
    trainer.fit(module, loader, ckpt_path=resume)
    watch.global_step = trainer.global_step
    logger.save()
    with open(os.path.join(args.out, "logs", "version_0", "metrics.csv")) as f:
        header = f.readline().strip().split(",")
    return callback.runtime.stats(), [name for name in header if name.startswith("mend/")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["transformers", "accelerate", "lightning"])
    parser.add_argument("--learner", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--period", type=int, default=4)
    parser.add_argument("--save-at", type=int, default=6)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--min-learners", type=int, default=2)
    parser.add_argument("--ahead-at", type=int, default=0)
    parser.add_argument("--ahead-file", default="")
    parser.add_argument("--start-after", default="")
    parser.add_argument("--schedule", action="store_true")
    args = parser.parse_args()
    model = tiny_llama()
    watch = Watch(model, args)
    if args.start_after:
        wait_for_file(args.start_after)
    run = {"transformers": with_transformers, "accelerate": with_accelerate, "lightning": with_lightning}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats, logged = run[args.framework](args, model, watch)
    for warning in caught:  # (shown as they would have been)
        print(warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno),
              file=sys.stderr, end="")
    torch.save({"after_rounds": watch.after_rounds, "final": watch.flat(), "stats": dict(stats),
                "tokens": watch.tokens, "logged": logged, "trainer_steps": watch.trainer_steps,
                "rates": watch.rates, "global_step": watch.global_step,
                "mend_warnings": [str(w.message) for w in caught if str(w.message).startswith("mend:")]},
               args.result)
    print(json.dumps({"learner": args.learner, "stats": dict(stats)}), file=sys.stderr)


if __name__ == "__main__":
    main()
