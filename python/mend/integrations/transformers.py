"""mend in a HuggingFace transformers ``Trainer``::

    from mend import MendConfig
    from mend.integrations.transformers import MendCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[MendCallback(MendConfig(lighthouse="10.0.0.1:29510"))])
    trainer.train()          # or trainer.train(resume_from_checkpoint=True)

When training begins the callback makes the Trainer's process a learner of
the job (``mend_init`` on the Trainer's model and optimizer: Accelerate's
optimizer is unwrapped, and its GradScaler is watched for skipped steps).
Tokens are counted from the model's forward calls (the attention mask's
sum: padding is not a token). The job's length (``total_steps``) is the
Trainer's ``max_steps`` unless the config sets it, so training ends with
the final merge. When a heal moves the learner onto the job's step, the
Trainer's ``global_step`` (and so its logging, saving and evaluation
intervals) and its learning-rate scheduler move with it. Each checkpoint the Trainer saves gets mend's
outer state (``mend_state.pt``; a sharded model's, FSDP2's or tensor
parallelism's, each rank's own in ``mend_state/`` through
torch.distributed.checkpoint), and a run resumed from that checkpoint
resumes mend too; the Trainer's logs get mend's counters as ``mend/...``;
the final merge runs when training ends, so every learner ends with the
same model. Under torchrun each rank of the Trainer is a rank of one
learner (see mend_init).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
from transformers import TrainerCallback

from mend._config import MendConfig
from mend.integrations._common import Attachment

STATE_FILE = "mend_state.pt"  # in each checkpoint-N folder
STATE_DIR = "mend_state"      # ... a sharded model's: each rank's own (torch.distributed.checkpoint)


def _move_global_step(state: Any, steps: int) -> None:
    """A heal moved the job's step (inside ``optimizer.step()``, before the
    Trainer counts that step): so does the Trainer's, and with it its
    logging, saving and evaluation intervals and its end at ``max_steps``.
    The Trainer's scheduler is moved with the optimizer's others."""
    state.global_step += steps


class MendCallback(TrainerCallback):
    """A ``TrainerCallback`` that trains the Trainer's model as one learner
    of a mend job.

    ``config``: the job's ``MendConfig`` (None: the defaults and ``MEND_*``
    variables); ``rank_id``: the learner id (else MEND_LEARNER_ID, else
    HOST-PID). ``resume_from``: where a resumed run finds mend's state, a
    checkpoint folder or its ``mend_state.pt``; by default the checkpoint
    the Trainer resumes from when it is in ``args.output_dir``
    (``checkpoint-<global step>``), which is what
    ``train(resume_from_checkpoint=True)`` picks. ``resume_from=False``
    starts mend afresh from a checkpoint saved without it. ``runtime`` is the
    learner's Runtime once training began (its ``stats()`` stay readable
    after the end).
    """

    def __init__(self, config: Optional[MendConfig] = None, rank_id: Optional[str] = None, *,
                 resume_from: Any = None) -> None:
        self._mend = Attachment(config, rank_id)
        self.resume_from = resume_from

    @property
    def runtime(self) -> Any:
        return self._mend.runtime

    def _saved_state_file(self, args: Any, global_step: int) -> Optional[str]:
        if self.resume_from is False:
            return None
        where = self.resume_from or os.path.join(args.output_dir, f"checkpoint-{global_step}")
        if os.path.isdir(os.path.join(where, STATE_DIR)):
            return os.path.join(where, STATE_DIR)
        path = where if os.path.isfile(where) else os.path.join(where, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"MendCallback: training resumes at step {global_step}, but {path} does not exist: mend's "
                f"state is saved in each checkpoint as {STATE_FILE}. Resume from a checkpoint in "
                f"args.output_dir, or say where it is with MendCallback(resume_from=<checkpoint folder>) "
                "(resume_from=False starts mend afresh)")
        return path

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if model is None or optimizer is None:
            raise RuntimeError("MendCallback: the Trainer gave no model or optimizer at the start of training")
        if state.global_step > 0:  # resumed from a checkpoint
            path = self._saved_state_file(args, state.global_step)
            if path is not None and os.path.isdir(path):
                self._mend.load_dcp(path)
            elif path is not None:
                self._mend.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        # mend's step count is the Trainer's (restored with its state), or
        # starts now (a fresh start, or resume_from=False).
        first = 0 if self._mend.resuming else state.global_step
        self._mend.start(model, optimizer, total_steps=state.max_steps - first,
                         follow_step=lambda steps: _move_global_step(state, steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step < state.max_steps and self._mend.ends_the_job_early(state.global_step):
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if self._mend.running and self.runtime.sharded:  # (FSDP2, TP: every rank saves its own)
            self._mend.save_dcp(os.path.join(folder, STATE_DIR))
            return
        saved = self._mend.state_dict()  # (every rank: collective for a learner of several)
        if saved and args.should_save:
            os.makedirs(folder, exist_ok=True)
            torch.save(saved, os.path.join(folder, STATE_FILE))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        counters = self._mend.logged()
        if logs is not None:
            logs.update(counters)  # (what the callbacks after this one report)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(counters)  # (the Trainer's record, in trainer_state.json)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mend.finish()
