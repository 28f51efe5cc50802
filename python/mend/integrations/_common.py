"""What the trainer callbacks share: one learner attached at the start of
training, its outer state in the trainer's checkpoints, its counters in the
trainer's logs, and the final merge at the end."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional

import mend
from mend._config import MendConfig

# The counters a trainer's logs get, as "mend/<name>".
LOGGED_STATS = ("steps", "tokens", "rounds", "failed_rounds", "passed_over", "heals", "bytes_sent",
                "round_waits", "skipped_steps")


class Attachment:
    """One training run's learner: ``start`` at the beginning of training
    (mend_init, then the saved outer state if there is one), ``state_dict``
    for a checkpoint, ``logged`` for the logs, ``finish`` at the end (the
    final merge). A trainer that trains again starts a new learner."""

    def __init__(self, config: Optional[MendConfig], rank_id: Optional[str]) -> None:
        if config is not None and not isinstance(config, MendConfig):
            raise TypeError(f"MendCallback: config must be a mend.MendConfig, not {type(config).__name__}")
        self.config = config
        self.rank_id = rank_id
        self.runtime: Any = None
        self._model: Any = None
        self._saved: Optional[Dict[str, Any]] = None  # loaded before the learner started
        self._saved_dcp: Optional[str] = None  # a sharded state's DCP checkpoint, likewise
        self._said_end = False

    @property
    def resuming(self) -> bool:
        """Whether a checkpoint's mend state waits to be loaded at the start."""
        return self._saved is not None or self._saved_dcp is not None

    @property
    def running(self) -> bool:
        return self.runtime is not None and not self.runtime.closed

    def start(self, model: Any, optimizer: Any, scaler: Any = None, total_steps: int = 0,
              follow_step: Optional[Callable[[int], None]] = None) -> Any:
        """mend_init, and the saved state if one was loaded. ``total_steps``:
        the inner steps mend will see in this run, from the trainer, so that
        training ends with the final merge; a config's own total_steps wins.
        ``follow_step(steps)``: moves the trainer's own step counter when mend
        moves the job's step (a heal), as the LR schedulers are moved."""
        if self.running:
            raise mend.FailedPreconditionError(
                "MendCallback: training began again while mend's learner of the last run is still attached")
        config = self.config if self.config is not None else MendConfig()
        derived = config.total_steps == 0 and total_steps > 0
        if derived:
            config = config.replace(total_steps=int(total_steps))
        try:
            self.runtime = mend.mend_init(model, config, self.rank_id, optimizer=optimizer, scaler=scaler)
        except mend.InvalidArgumentError as error:
            if not derived or "total_steps" not in str(error):
                raise
            # The user set no total_steps: say where this learner's came from.
            raise mend.InvalidArgumentError(
                f"{error}. This learner's total_steps = {int(total_steps)} is its trainer's own step count "
                "(max_steps, or its epochs over its own data); learners whose data differ in length count "
                "differently: give every learner the same MendConfig(total_steps=N), or the same max_steps"
            ) from error
        self._model = model
        if self._saved is not None:
            saved, self._saved = self._saved, None
            self.runtime.load_state_dict(saved)
        if self._saved_dcp is not None:
            path, self._saved_dcp = self._saved_dcp, None
            self.load_dcp(path)
        if follow_step is not None:
            self.runtime.on_step_moved(follow_step)
        return self.runtime

    def state_dict(self) -> Dict[str, Any]:
        """mend's outer state (collective for a learner of several ranks);
        empty when no learner is attached (before training, after its end)."""
        return self.runtime.state_dict() if self.running else {}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """A checkpoint's outer state: loaded at once into a running
        learner, else when the learner starts."""
        if not state:
            return
        if self.running:
            self.runtime.load_state_dict(state)
        else:
            self._saved = state

    def save_dcp(self, path: str) -> None:
        """A sharded model's outer state, each rank its own, into the DCP
        checkpoint directory ``path`` (every rank calls it)."""
        import torch.distributed.checkpoint as dcp
        dcp.save({"mend": self.runtime}, checkpoint_id=path)

    def load_dcp(self, path: str) -> None:
        """save_dcp's state back (every rank; resharded to this rank count):
        at once into a running learner, else when the learner starts."""
        if not self.running:
            self._saved_dcp = path
            return
        if not self.runtime.sharded:
            raise ValueError(f"MendCallback: {path} holds a sharded model's outer state (saved with "
                             "torch.distributed.checkpoint), and this learner's model is not sharded")
        import torch.distributed.checkpoint as dcp
        dcp.load({"mend": self.runtime}, checkpoint_id=path)

    def logged(self) -> Dict[str, float]:
        if self.runtime is None:
            return {}
        stats = self.runtime.stats()
        return {f"mend/{name}": float(stats[name]) for name in LOGGED_STATS}

    def ends_the_job_early(self, trainer_step: int) -> bool:
        """Whether the trainer should stop at its step ``trainer_step``
        (after it): the learner has trained the job's total_steps there,
        before the trainer's own end, because a heal moved its step onto
        the others' (a restarted learner). Said once."""
        if not self.running or not self.runtime.finished:
            return False
        if not self._said_end:
            self._said_end = True
            warnings.warn(
                f"mend: the learner has trained the job's total_steps = {self.runtime.config.total_steps} at "
                f"the trainer's step {trainer_step} (a heal moved it onto the other learners' step): training "
                "stops here, for the final merge", RuntimeWarning, stacklevel=3)
        return True

    def finish(self) -> None:
        """The final merge, and the learner leaves the job (idempotent)."""
        if self._model is not None:
            mend.mend_shutdown(self._model)

    def leave(self) -> None:
        """Training failed: leave the job without a final merge."""
        if self.running:
            self.runtime._learner.leave()
            self.runtime.shutdown()  # (its hooks; it has left)
