"""What mend_init handed to libmend by address: the model's parameters and
buffers, and the inner optimizer's Adam state, with the checks that they
are still the model's and the optimizer's.

libmend reads and writes those tensors' memory in place (or the front end
copies through host buffers taken from them). ``model.to(...)``, ``.half()``,
``p.data = ...``, ``load_state_dict(..., assign=True)`` and FSDP2's
``fully_shard`` give a parameter other storage; ``optimizer.load_state_dict``
gives it other moments. The front end keeps every tensor it handed over
alive, so such a change never makes libmend touch freed memory, and it looks
for one before every call that reads or writes them: a changed parameter or
buffer is an error that names it; changed moments are handed over again.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import torch

from mend import _native
from mend._sharding import local_tensor

_REPLACED_BY = ("model.to(...), .half(), `p.data = ...`, load_state_dict(..., assign=True) or FSDP's "
                "fully_shard")


def _describe(tensor: torch.Tensor) -> str:
    data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    kind = type(data).__name__
    if kind not in ("Tensor", "Parameter"):  # a tensor subclass (FSDP2's DTensor) holds no storage of its own
        return f"a {kind} of {tensor.dtype} {list(tensor.shape)} on {tensor.device}"
    return f"{tensor.dtype} {list(tensor.shape)} on {tensor.device} at {tensor.data_ptr():#x}"


class Attached:
    """A parameter or buffer of the model as mend_init took it."""

    __slots__ = ("kind", "name", "tensor", "address", "dtype", "shape", "device")

    def __init__(self, kind: str, name: str, tensor: torch.Tensor) -> None:
        self.kind = kind
        self.name = name
        self.tensor = tensor  # the module's own object (a Parameter, or the buffer)
        self.address = local_tensor(tensor).data_ptr()  # (a DTensor's: its local piece's)
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)
        self.device = tensor.device

    def change(self, current: Optional[torch.Tensor]) -> Optional[str]:
        """None while ``current`` (the module's tensor of that name now) is
        still this one, in the same storage; else what changed, in words."""
        if current is None:
            return "it is no longer in the model"
        if current is not self.tensor:
            return f"the model holds another tensor under its name now ({_describe(current)})"
        if (local_tensor(current).data_ptr(), current.dtype, tuple(current.shape), current.device) != \
                (self.address, self.dtype, self.shape, self.device):
            return (f"its storage was replaced: it was {self.dtype} {list(self.shape)} on {self.device} at "
                    f"{self.address:#x}, it is {_describe(current)} now")
        return None


def own_name(name: str) -> str:
    """A parameter's or buffer's name as its module knows it: without the
    ``_orig_mod`` components of torch.compile's wrapper (whole model or a
    submodule), so that a compiled and an uncompiled learner, and their
    checkpoints, name it alike."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def named_parameters(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Parameter]]:
    return [(own_name(name), p) for name, p in model.named_parameters()]


def named_buffers(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    return [(own_name(name), b) for name, b in model.named_buffers()]


def state_buffers(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """The buffers of the model's state_dict: not the non-persistent ones
    (``register_buffer(..., persistent=False)``: a rotary embedding's
    ``inv_freq``, a cached mask), which are derived from the configuration,
    not trained, and which no checkpoint restores."""
    derived = {f"{prefix}.{name}" if prefix else name
               for prefix, module in model.named_modules()
               for name in getattr(module, "_non_persistent_buffers_set", ())}
    return [(own_name(name), b) for name, b in model.named_buffers() if name not in derived]


def check_attached(model: torch.nn.Module, attached: List[Attached]) -> None:
    """Raises FailedPreconditionError naming the first parameter or buffer
    of ``model`` that is no longer what mend_init attached to."""
    current: Dict[str, Dict[str, torch.Tensor]] = {"parameter": dict(named_parameters(model))}
    if any(a.kind == "buffer" for a in attached):
        current["buffer"] = dict(named_buffers(model))
    for a in attached:
        what = a.change(current[a.kind].get(a.name))
        if what is not None:
            raise _native.ERRORS[9](
                f"mend: {a.kind} {a.name!r} is not the tensor mend_init attached to any more: {what}. "
                f"Something replaced it after mend_init ({_REPLACED_BY}); mend reads and writes the model's "
                f"{a.kind}s in place, so it stops rather than use memory that is no longer the model's. Move, "
                f"convert, shard and load the model before mend_init (load_state_dict without assign=True "
                f"copies into the same storage).")


# -- the inner optimizer's Adam state ------------------------------------------

def adam_moments(optimizer: torch.optim.Optimizer,
                 parameter: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(exp_avg, exp_avg_sq) of ``parameter``, or None before its first step."""
    state = optimizer.state.get(parameter)
    if not state or "exp_avg" not in state or "exp_avg_sq" not in state:
        return None
    return state["exp_avg"], state["exp_avg_sq"]


def same_moments(a: Optional[Tuple[torch.Tensor, torch.Tensor]],
                 b: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return all(x is y and local_tensor(x).data_ptr() == local_tensor(y).data_ptr() for x, y in zip(a, b))


def adam_betas(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor]) -> Tuple[float, float]:
    """The betas of the first parameter group holding one of ``parameters``
    (torch's defaults, 0.9 and 0.999, when it names none)."""
    wanted = {id(p) for p in parameters}
    for group in optimizer.param_groups:
        if any(id(p) in wanted for p in group["params"]):
            beta1, beta2 = group.get("betas", (0.9, 0.999))
            return float(beta1), float(beta2)
    return 0.9, 0.999


def optimizer_step(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor]) -> int:
    """The optimizer's step count (Adam's t) of the first of ``parameters``
    that has one; 0 when none has."""
    for p in parameters:
        state = optimizer.state.get(p)
        if state and "step" in state:
            step = state["step"]
            return int(step.item()) if torch.is_tensor(step) else int(step)
    return 0


def set_optimizer_step(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor], step: int) -> None:
    """Sets the step count of every one of ``parameters`` that has one (a
    tensor keeps its dtype and device)."""
    for p in parameters:
        state = optimizer.state.get(p)
        if state and "step" in state:
            if torch.is_tensor(state["step"]):
                state["step"].fill_(step)
            else:
                state["step"] = step
