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
  before). An optimizer created after mend_init is looked for at training-
  mode forwards until found: the first 8, then the 16th, 32nd, 64th, ...
  (one scan of the heap each; a forward before the optimizer exists, a shape
  check say, does not make mend miss it).
- The forward pre-hooks call the runtime through a weak reference; a copy of
  the model (``copy.deepcopy``, ``torch.save``, ``AveragedModel``) gets inert
  ones, so it carries no runtime. On torch >= 2.0 they see keyword arguments
  too (``with_kwargs=True``: transformers models are called as
  ``model(input_ids=..., attention_mask=...)``); on 1.13, positional ones only.
- Tokens of a forward (``count_tokens``): the real tokens of an
  ``attention_mask`` (its sum: padding is not counted) when one comes with
  the input ids, else the input ids' elements, else the first integer
  tensor's; on a GPU the sum is copied back without waiting for it
  (``TokenCount``).
"""

from __future__ import annotations

import gc
import inspect
import types
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


class ForwardHook:
    """A forward pre-hook that calls ``method`` of a runtime it does not keep
    alive; copies and unpickled ones do nothing."""

    def __init__(self, runtime: Any, method: str) -> None:
        self._runtime = weakref.ref(runtime) if runtime is not None else None
        self._method = method

    def __call__(self, module: torch.nn.Module, inputs: Any, kwargs: Optional[Dict[str, Any]] = None) -> None:
        runtime = self._runtime() if self._runtime is not None else None
        if runtime is not None:
            getattr(runtime, self._method)(module, inputs, kwargs or {})

    def __deepcopy__(self, memo: Dict[int, Any]) -> "ForwardHook":
        return ForwardHook(None, self._method)

    def __reduce__(self):
        return (ForwardHook, (None, self._method))


HOOKS_SEE_KEYWORDS = "with_kwargs" in inspect.signature(torch.nn.Module.register_forward_pre_hook).parameters


def register_forward_pre_hook(module: torch.nn.Module, hook: ForwardHook) -> Any:
    """The hook with keyword arguments where torch passes them (>= 2.0; on
    1.13 positional arguments only)."""
    if HOOKS_SEE_KEYWORDS:
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    return module.register_forward_pre_hook(hook)


def _is_integer(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()


class TokenCount:
    """The tokens of a step's forwards: host integers, and sums made on a
    device, copied back (non_blocking, into pinned memory) when made and
    read at the step, so that counting never waits for the device's queue."""

    def __init__(self) -> None:
        self.counted = 0
        self._pending: List[Tuple[torch.Tensor, Any]] = []  # (pinned host int64, the copy's CUDA event)

    def add(self, tokens: Any) -> None:
        if not isinstance(tokens, torch.Tensor):
            self.counted += int(tokens)
        elif tokens.device.type == "cuda":
            host = torch.empty((), dtype=torch.int64, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tokens.device))  # the copy's stream, not the current device's
            self._pending.append((host, event))
        else:
            self.counted += int(tokens)

    def drop(self) -> None:
        """Forgets what was counted (a step that was not taken), without waiting."""
        self.counted, self._pending = 0, []

    def take(self) -> int:
        """The step's tokens, and starts over."""
        total = self.counted
        for host, event in self._pending:
            event.synchronize()
            total += int(host)
        self.counted, self._pending = 0, []
        return total


_SIGNATURES: "weakref.WeakKeyDictionary[Any, Optional[inspect.Signature]]" = weakref.WeakKeyDictionary()


def _arguments(module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The forward's arguments by name (positional ones bound to its signature where it has one)."""
    forward = getattr(module.forward, "__func__", module.forward)  # (an instance's own wrapper too)
    try:
        signature = _SIGNATURES[forward]
    except (KeyError, TypeError):
        try:
            signature = inspect.signature(module.forward)
        except (TypeError, ValueError):
            signature = None
        try:
            _SIGNATURES[forward] = signature
        except TypeError:
            pass
    named = dict(kwargs)
    if signature is not None:
        try:
            named.update(signature.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            pass
    return named


def count_tokens(module: torch.nn.Module, args: Any, kwargs: Dict[str, Any]) -> Any:
    """The tokens of one forward call: an int, or a 0-d tensor on the inputs'
    device (an attention mask's sum); 0 when nothing integer came in."""
    args = args if isinstance(args, tuple) else (args,)
    named = _arguments(module, args, kwargs)
    if _is_integer(named.get("input_ids")):
        return _real_tokens(named)
    for value in list(args) + list(kwargs.values()):
        if _is_integer(value):
            return int(value.numel())
    return 0


def _real_tokens(named: Any) -> Any:
    ids, mask = named["input_ids"], named.get("attention_mask")
    # A 0/1 mask of the ids' shape (integer or bool, as tokenizers make it;
    # a float one may be additive, 0 and -inf).
    if _is_integer(mask) and mask.shape == ids.shape:
        return mask.sum(dtype=torch.int64)
    return int(ids.numel())


def batch_tokens(batch: Any) -> Any:
    """The tokens of a training batch as a data loader gives it (for a
    trainer whose module's forward mend does not see): a mapping's
    ``input_ids`` (its ``attention_mask``'s sum when it has one), else the
    first integer tensor's elements (in a mapping, tuple or list, or the
    batch itself); 0 when it holds none."""
    if isinstance(batch, Mapping) and _is_integer(batch.get("input_ids")):
        return _real_tokens(batch)
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else [batch]
    for value in values:
        if _is_integer(value):
            return int(value.numel())
    return 0


def holds_any(optimizer: torch.optim.Optimizer, parameters) -> bool:
    wanted = {id(p) for p in parameters}
    return any(id(p) in wanted for group in optimizer.param_groups for p in group["params"])


def unwrap_optimizer(optimizer: Any) -> Tuple[Any, Any]:
    """The torch optimizer inside a trainer's wrapper (Accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``), and the
    wrapper's GradScaler (None without one); a plain optimizer is its own."""
    scaler = None
    for _ in range(4):  # (wrappers of wrappers; never a cycle)
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            inner = getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        if scaler is None:
            scaler = getattr(optimizer, "scaler", None)
        optimizer = inner
    return optimizer, scaler


class ScalerAttachment:
    """Calls ``skipped()`` when ``scaler.step(optimizer)`` (torch.amp's
    GradScaler, or one with its ``step``) did not step an optimizer holding
    ``parameters``: it found inf or NaN gradients. ``taken()`` counts the
    steps mend saw; ``scaler.step`` becomes a bound method of the scaler
    until detached."""

    def __init__(self, scaler: Any, parameters, taken: Callable[[], int], skipped: Callable[[], None]) -> None:
        self.scaler = scaler
        self._parameters = list(parameters)
        original = scaler.step

        def step(owner: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = taken()
            result = original(optimizer, *args, **kwargs)
            if taken() == before and holds_any(unwrap_optimizer(optimizer)[0], self._parameters):
                skipped()
            return result

        self._original = original
        self._ours = types.MethodType(step, scaler)
        scaler.step = self._ours

    def detach(self) -> None:
        if self._original is not None and self.scaler.__dict__.get("step") is self._ours:
            self.scaler.step = self._original
        self._original = None


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
    """Calls ``before()`` before and ``stepped()`` after every step of
    ``optimizer`` until detached."""

    def __init__(self, optimizer: torch.optim.Optimizer, stepped: Callable[[], None],
                 before: Callable[[], None]) -> None:
        self.optimizer = optimizer
        self._handle = None
        self._pre_handle = None
        self._original = None
        if _hooks_available():
            self._pre_handle = optimizer.register_step_pre_hook(lambda opt, args, kwargs: before())
            self._handle = optimizer.register_step_post_hook(lambda opt, args, kwargs: stepped())
            return
        original = optimizer.step

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            before()
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
            self._pre_handle.remove()
            self._handle = self._pre_handle = None
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
    runs ``stepped`` for it, this step included); on 1.13 by scans at
    training-mode forwards (``found`` then attaches it)."""

    # torch 1.13: scans at the first this many forwards, then at powers of two.
    EVERY_FORWARD_UNTIL = 8

    def __init__(self, parameters, found: Callable[[torch.optim.Optimizer], None],
                 stepped: Callable[[], None]) -> None:
        self._parameters = list(parameters)
        self._found = found
        self._stepped = stepped
        self._handle = None
        self._seen: Dict[int, bool] = {}
        self.looked = False
        self._forwards = 0
        if _hooks_available():
            from torch.optim.optimizer import register_optimizer_step_post_hook
            self._handle = register_optimizer_step_post_hook(self._global_hook)

    def _global_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.looked:  # (found: its own hooks run from its next step; see found_by_hook)
            return
        ours = self._seen.get(id(optimizer))
        if ours is None:
            ours = self._seen[id(optimizer)] = holds_any(optimizer, self._parameters)
        if ours:
            # Attached as one found before its first step would be (its moments
            # for DES-LOC and heal_inner_optimizer, the pre-hook that makes a
            # deferred step): its own post-hook, added now, runs from its next
            # step (torch runs an optimizer's own post-hooks before the global
            # ones), so this step is counted here, once.
            self.looked = True
            self._found(optimizer)
            self._stepped()

    @property
    def found_by_hook(self) -> bool:
        """torch >= 2.0: the optimizer was found at its first step. The global
        hook may then be removed (detach), but not from inside a post-hook:
        torch iterates the global hooks' dict while they run."""
        return self._handle is not None and self.looked

    def look(self) -> None:
        """torch 1.13, at a training-mode forward: a scan of the heap at the
        first EVERY_FORWARD_UNTIL forwards, then at powers of two, until found."""
        if self._handle is not None or self.looked:
            return
        self._forwards += 1
        n = self._forwards
        if n > self.EVERY_FORWARD_UNTIL and n & (n - 1):
            return
        optimizer = find_optimizer(self._parameters)
        if optimizer is not None:
            self.looked = True
            self._found(optimizer)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
