"""The learning-rate schedules that follow the job's step when mend moves it.

A heal puts a learner that joined late, restarted or fell a period behind
onto the job's step (``stats()["steps"]``); so do a resume from mend's own
checkpoint at ``mend_init`` (``resume``, ``resume_from``, ``checkpoint_dir``),
``import_state()`` and the final merge. From then on the learner's optimizer
must use, at each job step, exactly the learning rate the other learners use
there, so every LR scheduler that drives it moves by as many steps as the job
step moved (a scheduler steps once per optimizer step, as a training loop,
the transformers Trainer and Lightning's "step" interval step it):

- a scheduler whose rate is a function of ``last_epoch`` alone (torch's
  ``LambdaLR``, ``OneCycleLR``, ``CyclicLR``) jumps: one ``step()`` from the
  new position computes the rate the others computed there, bit for bit;
- every other one (``CosineAnnealingLR``, ``StepLR``, ``LinearLR``, ...,
  ``SequentialLR`` and ``ChainedScheduler`` with their children), which
  computes each rate from the one before, is stepped as many times as the
  job step moved: the same float operations as the others made, so the same
  bits (about 10 us a step: a second for a move of 100,000 steps);
- one that cannot be moved is named in a warning, once: ``ReduceLROnPlateau``
  (it follows a metric, not the step), an object with no ``last_epoch``, a
  move back for a scheduler that must be stepped, a step the scheduler
  refuses (``OneCycleLR`` past its ``total_steps``).

``runtime.load_state_dict()`` moves nothing: it restores mend's part of a
checkpoint of your own, beside the optimizer's and the scheduler's, which
put them where they were. The schedulers are found through the optimizer
(the objects that refer to it as their ``optimizer`` and have a ``step``)
when a move is due, so one created after ``mend_init`` is found too.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any, Callable, List, Optional, Set

import torch

# Rates that are a function of last_epoch alone (the exact classes: a
# subclass may compute its rate otherwise).
_JUMPING = tuple(c for c in (getattr(torch.optim.lr_scheduler, name, None)
                             for name in ("LambdaLR", "OneCycleLR", "CyclicLR")) if c is not None)
_PLATEAU = getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)


def _attribute(candidate: Any, name: str) -> Any:
    try:
        return getattr(candidate, name, None)
    except Exception:  # noqa: BLE001 (an object whose attributes raise has none)
        return None


def _referrers(target: Any) -> List[Any]:
    """The objects that refer to ``target``, an instance's ``__dict__`` taken
    for the instance (Python < 3.11, or a dict made by a __dict__ access)."""
    owners = []
    for referrer in gc.get_referrers(target):
        if isinstance(referrer, dict):
            owners += [owner for owner in gc.get_referrers(referrer) if _attribute(owner, "__dict__") is referrer]
        elif not isinstance(referrer, (list, tuple, type)):
            owners.append(referrer)
    return owners


def schedulers_of(optimizer: torch.optim.Optimizer) -> List[Any]:
    """The schedulers that drive ``optimizer`` or a trainer's wrapper of it
    (Accelerate's AcceleratedOptimizer, which the transformers Trainer's
    scheduler holds; Lightning's LightningOptimizer), outermost only (a
    SequentialLR's or ChainedScheduler's children move with it)."""
    found: List[Any] = []
    seen: Set[int] = set()
    targets = [optimizer]
    with warnings.catch_warnings():  # (attributes of deprecated shims warn)
        warnings.simplefilter("ignore")
        while targets:
            target = targets.pop()
            for candidate in _referrers(target):
                if id(candidate) in seen:
                    continue
                seen.add(id(candidate))
                held = _attribute(candidate, "optimizer")
                if _attribute(candidate, "param_groups") is not None:  # an optimizer
                    if held is target or _attribute(candidate, "_optimizer") is target:
                        targets.append(candidate)  # a wrapper of it: what refers to the wrapper
                elif held is target and callable(_attribute(candidate, "step")):
                    found.append(candidate)
    children: Set[int] = set()
    stack = list(found)
    while stack:
        for child in getattr(stack.pop(), "_schedulers", None) or ():
            if id(child) not in children:
                children.add(id(child))
                stack.append(child)
    return [s for s in found if id(s) not in children]


def move(scheduler: Any, steps: int) -> Optional[str]:
    """Moves ``scheduler`` by ``steps`` optimizer steps; None when it moved,
    else why it could not."""
    if _PLATEAU is not None and isinstance(scheduler, _PLATEAU):
        return "it follows a metric (ReduceLROnPlateau), not the step"
    chained = isinstance(getattr(scheduler, "_schedulers", None), (list, tuple))  # (torch 1.13's ChainedScheduler)
    if not chained and not isinstance(getattr(scheduler, "last_epoch", None), int):
        return "it has no integer last_epoch to move"
    try:
        with warnings.catch_warnings():  # ("lr_scheduler.step() before optimizer.step()")
            warnings.simplefilter("ignore")
            if type(scheduler) in _JUMPING:
                scheduler.last_epoch += steps - 1
                scheduler.step()
            elif steps < 0:
                return (f"it computes each rate from the one before, so it cannot be moved back "
                        f"({steps} steps)")
            else:
                for _ in range(steps):
                    scheduler.step()
    except Exception as error:  # noqa: BLE001 (named in the warning)
        return f"its step() raised {type(error).__name__}: {error}"
    return None


class StepFollower:
    """What follows the job's step when mend moves it: the schedulers of the
    learner's optimizer (at the next ``follow``: see module doc) and the
    ``listeners`` (a trainer's own step counter: at once, with the steps).
    Used from the training thread only."""

    def __init__(self) -> None:
        self.moved = 0                     # the job step's moves so far, net
        self.pending = 0                   # not yet applied to the schedulers
        self.listeners: List[Callable[[int], None]] = []
        self.left_alone: Set[int] = set()  # schedulers a trainer's listener moves itself (ids)
        self._warned: Set[int] = set()

    def add(self, steps: int) -> None:
        """The job step moved by ``steps``."""
        if steps == 0:
            return
        self.moved += steps
        self.pending += steps
        for listener in list(self.listeners):
            listener(steps)

    def follow(self, optimizer: Optional[torch.optim.Optimizer], final: bool) -> None:
        """Moves the optimizer's schedulers by the pending steps. Where none
        is found the steps stay pending (a scheduler made after mend_init
        and before the first optimizer step is moved then), unless ``final``
        (after an optimizer step: a scheduler there would have been found)."""
        if not self.pending:
            return
        schedulers = schedulers_of(optimizer) if optimizer is not None else []
        if not schedulers and not final:
            return
        steps, self.pending = self.pending, 0
        for scheduler in schedulers:
            if id(scheduler) in self.left_alone:
                continue
            why = move(scheduler, steps)
            if why is not None and id(scheduler) not in self._warned:
                self._warned.add(id(scheduler))
                warnings.warn(f"mend: the job's step moved by {steps} (a heal or a resume), but the learning-rate "
                              f"scheduler {type(scheduler).__name__} of this learner's optimizer does not follow: "
                              f"{why}. Its learning rate may now differ from the other learners'.",
                              RuntimeWarning, stacklevel=2)
