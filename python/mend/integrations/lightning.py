"""mend in a Lightning ``Trainer``::

    from mend import MendConfig
    from mend.integrations.lightning import MendCallback
    trainer = Trainer(max_steps=1000, callbacks=[MendCallback(MendConfig(lighthouse="10.0.0.1:29510"))])
    trainer.fit(module, data)          # or trainer.fit(module, data, ckpt_path="last")

When fitting begins the callback makes the process a learner of the job
(``mend_init`` on the LightningModule and its optimizer; a ``16-mixed``
precision plugin's GradScaler is watched for skipped steps). Tokens are
counted from each training batch (``input_ids`` and its attention mask's
sum, else the first integer tensor), since a LightningModule's
``training_step`` need not call its own forward. mend's outer state is part
of every checkpoint Lightning saves (the callback's ``state_dict``), so
``ckpt_path=`` resumes mend too; the counters are logged as ``mend/...``;
the job's length (``total_steps``) is the Trainer's ``max_steps`` (or what
its epochs make) unless the config sets it, so training ends with the
final merge. When a heal moves the learner onto the job's step, the
trainer's ``global_step`` (and what it drives: ``max_steps``,
``every_n_train_steps`` checkpoints, the logging interval) and its
schedulers of ``interval="step"`` move with it.

The callback derives from the Lightning package already imported
(``lightning.pytorch`` or ``pytorch_lightning``), else from whichever is
installed: a Trainer accepts callbacks of its own package only.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Dict, List, Optional

from mend._config import MendConfig
from mend.integrations._common import Attachment


def _lightning() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if name in sys.modules:
            return sys.modules[name]
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("mend.integrations.lightning needs Lightning: pip install lightning (or pytorch-lightning)")


_pl = _lightning()


class MendCallback(_pl.Callback):
    """A Lightning ``Callback`` that trains the LightningModule as one
    learner of a mend job. ``config``: the job's ``MendConfig`` (None: the
    defaults and ``MEND_*`` variables); ``rank_id``: the learner id (else
    MEND_LEARNER_ID, else HOST-PID); ``log_stats``: log mend's counters
    at each training step's end (Lightning's ``log_every_n_steps`` applies).
    ``runtime`` is the learner's Runtime once fitting began (its ``stats()``
    stay readable after the end). The module must have one optimizer.
    """

    def __init__(self, config: Optional[MendConfig] = None, rank_id: Optional[str] = None, *,
                 log_stats: bool = True) -> None:
        super().__init__()
        self._mend = Attachment(config, rank_id)
        self.log_stats = log_stats
        self._unfollowed: List[str] = []  # schedulers a move leaves alone, until said

    @property
    def runtime(self) -> Any:
        return self._mend.runtime

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            raise ValueError(f"MendCallback: the LightningModule has {len(optimizers)} optimizers; mend runs "
                             "after the inner steps of one (use mend_init(..., manual=True) and "
                             "runtime.step(tokens) for anything else)")
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        # The job's length, for the final merge: max_steps, else what the
        # epochs make (the loops are restored after this hook, so a resumed
        # run counts from the step of mend's restored state).
        total = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps > 0 else \
            trainer.estimated_stepping_batches
        # (The trainer's own last step: it stops there itself, no heal needed.)
        self._trainer_end = int(total) if total != float("inf") else None
        runtime = self._mend.start(pl_module, optimizers[0], scaler, int(total) if total != float("inf") else 0,
                                   follow_step=lambda steps: self._move_global_step(trainer, steps))
        for config in trainer.lr_scheduler_configs:
            if config.interval != "step" or config.frequency != 1:
                # Not once per optimizer step: mend cannot tell where a heal puts it.
                runtime._follower.left_alone.add(id(config.scheduler))
                self._unfollowed.append(f"{type(config.scheduler).__name__} (interval {config.interval!r}, "
                                        f"frequency {config.frequency})")

    def _move_global_step(self, trainer: Any, steps: int) -> None:
        """A heal moved the job's step (inside the optimizer's step, between
        Lightning's ready and completed counts of it): so does the trainer's
        ``global_step``, and with it ``max_steps``, ``every_n_train_steps``
        checkpoints and the logging interval. Its "step" schedulers are
        moved with the optimizer's others; the rest are named, once."""
        loop = trainer.fit_loop.epoch_loop
        module = trainer.lightning_module
        if module is None or module.automatic_optimization:
            total = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            total = loop.manual_optimization.optim_step_progress.total
        total.ready += steps
        total.completed += steps
        loop._batches_that_stepped += steps
        if self._unfollowed:
            warnings.warn(
                f"mend: the job's step moved (a heal), but the learning-rate scheduler "
                f"{', '.join(self._unfollowed)} does not step once per optimizer step, so it does not "
                "follow: its learning rate may now differ from the other learners'. Use "
                "interval='step', frequency=1 for a schedule that follows the job's step.",
                RuntimeWarning, stacklevel=2)
            self._unfollowed = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._mend.running:
            self.runtime._count_batch(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.log_stats and self._mend.running:
            pl_module.log_dict(self._mend.logged(), on_step=True, on_epoch=False)
        end = getattr(self, "_trainer_end", None)
        if (end is None or trainer.global_step < end) and self._mend.ends_the_job_early(trainer.global_step):
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._mend.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._mend.leave()

    def state_dict(self) -> Dict[str, Any]:
        if self._mend.running and self.runtime.sharded:
            # Lightning saves callback states from global rank 0 only (its
            # ModelParallelStrategy too), and a sharded model's mend state
            # is each rank's own: it would resume every rank with rank 0's.
            if not getattr(self, "_said_sharded", False):
                self._said_sharded = True
                warnings.warn(
                    "mend: Lightning's checkpoints hold callback states from rank 0 only, and a sharded model's "
                    "outer state is each rank's own: it is not in this checkpoint. Save it beside it with "
                    "torch.distributed.checkpoint (dcp.save({'mend': callback.runtime}, checkpoint_id=path) on "
                    "every rank) and, after resuming, dcp.load it before the first step; resumed without it, "
                    "mend's outer state starts from the restored parameters", RuntimeWarning, stacklevel=2)
            return {}
        return self._mend.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._mend.load_state_dict(state_dict)
