"""How mend runs after every optimizer step without the user calling it, and
the forward pre-hooks it puts on the model; none of it gets in the way of
what PyTorch users do with models and optimizers.

- torch >= 2.0: a step post-hook on the optimizer (``register_step_post_hook``);
  an optimizer created after mend_init is found by a global step post-hook
  (``register_optimizer_step_post_hook``) the first time it steps, without
  looking through the heap.
- torch 1.13 (no step hooks): ``optimizer.step`` becomes a bound method that
  calls the original and then mend; torch's LR schedulers accept it in
  either order (it keeps the ``_with_counter`` mark of a scheduler created
  before). An optimizer created after mend_init is looked for once, at the
  first training-mode forward (one scan of the heap; never again).
- The forward pre-hooks call the runtime through a weak reference; a copy of
  the model (``copy.deepcopy``, ``torch.save``, ``AveragedModel``) gets inert
  ones, so it carries no runtime.
"""

from __future__ import annotations

import gc
import types
import warnings
import weakref
from typing import Any, Callable, Dict, Optional

import torch


class ForwardHook:
    """A forward pre-hook that calls ``method`` of a runtime it does not keep
    alive; copies and unpickled ones do nothing."""

    def __init__(self, runtime: Any, method: str) -> None:
        self._runtime = weakref.ref(runtime) if runtime is not None else None
        self._method = method

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        runtime = self._runtime() if self._runtime is not None else None
        if runtime is not None:
            getattr(runtime, self._method)(module, inputs)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "ForwardHook":
        return ForwardHook(None, self._method)

    def __reduce__(self):
        return (ForwardHook, (None, self._method))


def holds_any(optimizer: torch.optim.Optimizer, parameters) -> bool:
    wanted = {id(p) for p in parameters}
    return any(id(p) in wanted for group in optimizer.param_groups for p in group["params"])


def find_optimizer(parameters) -> Optional[torch.optim.Optimizer]:
    """The live optimizer that holds any of ``parameters``, or None (one scan of the heap)."""
    with warnings.catch_warnings():  # isinstance on every object wakes deprecated shims
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.optim.Optimizer) and holds_any(obj, parameters):
                    return obj
            except ReferenceError:
                continue
    return None


def _hooks_available() -> bool:
    return hasattr(torch.optim.Optimizer, "register_step_post_hook")


class StepAttachment:
    """Calls ``stepped()`` after every step of ``optimizer`` until detached."""

    def __init__(self, optimizer: torch.optim.Optimizer, stepped: Callable[[], None]) -> None:
        self.optimizer = optimizer
        self._handle = None
        self._original = None
        if _hooks_available():
            self._handle = optimizer.register_step_post_hook(lambda opt, args, kwargs: stepped())
            return
        original = optimizer.step

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            stepped()
            return result

        if getattr(original, "_with_counter", False):  # a scheduler counts through `original`
            step._with_counter = True  # type: ignore[attr-defined]
        self._original = original
        self._ours = types.MethodType(step, optimizer)
        optimizer.step = self._ours  # type: ignore[assignment]

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        elif self._original is not None:
            # Put the original back unless something (a scheduler created
            # later) wrapped ours since: then ours stays and does nothing
            # more for a runtime that is gone.
            if self.optimizer.__dict__.get("step") is self._ours:
                self.optimizer.step = self._original  # type: ignore[assignment]
            self._original = None


class LaterOptimizer:
    """Finds the optimizer of ``parameters`` created after mend_init: on
    torch >= 2.0 at its first step (a global step post-hook, which then
    runs ``stepped`` for it, this step included); on 1.13 by one scan at the
    first training-mode forward (``found`` then attaches it)."""

    def __init__(self, parameters, found: Callable[[torch.optim.Optimizer], None],
                 stepped: Callable[[], None]) -> None:
        self._parameters = list(parameters)
        self._found = found
        self._stepped = stepped
        self._handle = None
        self._seen: Dict[int, bool] = {}
        self.looked = False
        if _hooks_available():
            from torch.optim.optimizer import register_optimizer_step_post_hook
            self._handle = register_optimizer_step_post_hook(self._global_hook)

    def _global_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        ours = self._seen.get(id(optimizer))
        if ours is None:
            ours = self._seen[id(optimizer)] = holds_any(optimizer, self._parameters)
        if ours:
            self._stepped()

    def look_once(self) -> None:
        """torch 1.13: the one scan, at the first training-mode forward."""
        if self._handle is not None or self.looked:
            return
        self.looked = True
        optimizer = find_optimizer(self._parameters)
        if optimizer is not None:
            self._found(optimizer)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
