"""A model sharded over a learner's ranks: FSDP2's ``fully_shard``, tensor
parallelism (``parallelize_module``) and both on a 2-D mesh make its
parameters DTensors.

mend works on each rank's local tensor of a DTensor (FSDP2's sharded fp32
parameter, never the unsharded one it gathers for a forward), in place and by
address as for a plain tensor. Each parameter gets a replica key: the ranks
of the learner that pass the same key hold the same values of it.

- A DTensor sharded on some mesh dimensions (any placement but
  ``Replicate``): the ranks with the same coordinates on those dimensions
  hold the same piece (FSDP2 over all of them: each rank's piece is its own).
- A ``Replicate()`` DTensor, or a plain tensor (a parameter that TP leaves
  whole): key 0, every rank holds all of it.

libmend then makes each rank exchange its own pieces, with the same rank of
every other learner, and a slice of what several ranks hold (group_layout.h):
no all-gather of the model, inside the learner or across.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any, Dict, List, Optional, Tuple

import torch

LAYOUT_SETTING = "model_layout"
_MAX_LENGTH = 480  # of a job setting's value (the lighthouse takes 512 with its key)


def _dtensor_type() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.5
        return DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # torch 2.0 - 2.4
            return DTensor
        except ImportError:
            return None


_DTENSOR = _dtensor_type()


def is_dtensor(tensor: object) -> bool:
    return _DTENSOR is not None and isinstance(tensor, _DTENSOR)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory mend reads and writes: a DTensor's local piece
    (FSDP2's sharded parameter, a view into its padded shard), else itself."""
    return tensor._local_tensor if is_dtensor(tensor) else tensor


def _placements_text(tensor: torch.Tensor) -> str:
    return "(" + ", ".join(str(p) for p in tensor.placements) + ")"


def replica_key(name: str, tensor: torch.Tensor) -> int:
    """The parameter's replica key on this rank: 0 when every rank holds all
    of it; else one per distinct piece (never 0)."""
    if not is_dtensor(tensor):
        return 0
    placements = tensor.placements
    if any(p.is_partial() for p in placements):
        raise ValueError(f"mend_init: parameter {name!r} is a DTensor with a Partial placement "
                         f"{_placements_text(tensor)}: a parameter's values must be whole on its ranks "
                         "(Shard or Replicate), not pending a reduction")
    coordinate = tensor.device_mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"mend_init: parameter {name!r} is a DTensor on a mesh that does not include this rank")
    # Every placement but Replicate cuts the parameter along that mesh
    # dimension (of more than one rank): Shard, and FSDP2's _StridedShard
    # over TP (not a Shard in torch 2.11). One of another kind counts as a
    # cut too: at worst ranks that hold the same values each exchange theirs.
    mesh = tensor.device_mesh
    dims = [(d, int(coordinate[d])) for d, p in enumerate(placements)
            if not p.is_replicate() and mesh.size(d) > 1]
    if not dims:
        return 0
    digest = hashlib.blake2b(repr(dims).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 1) + 1


def replica_keys(named: List[Tuple[str, torch.Tensor]], group_size: int) -> Optional[List[int]]:
    """Each parameter's replica key, or None for a model with no sharded
    parameter (every rank holds the whole model, as with DDP). A parameter
    sharded over several ranks needs a learner of several ranks."""
    keys = [replica_key(name, p) for name, p in named]
    if not any(keys):
        return None
    if group_size <= 1:
        name, p = next((name, p) for (name, p), key in zip(named, keys) if key)
        raise ValueError(
            f"mend_init: parameter {name!r} is sharded over {p.device_mesh.size()} ranks "
            f"(a DTensor, {_placements_text(p)}), but this learner is one rank (group_size = 1): every rank that "
            "holds a shard of the model must be a rank of the same learner (under torchrun, leave group_size "
            "unset: the default process group's ranks are the learner's)")
    return keys


def layout_setting(named: List[Tuple[str, torch.Tensor]]) -> Optional[str]:
    """The model's layout over its ranks, which every learner of a job must
    share (a job setting): None when no parameter is a DTensor. The mesh
    shapes and the placements, counted, and a digest of every DTensor's name,
    global shape, placements and mesh shape."""
    sharded = [(name, p) for name, p in named if is_dtensor(p)]
    if not sharded:
        return None
    meshes = sorted({(tuple(p.device_mesh.shape), tuple(p.device_mesh.mesh_dim_names or ()))
                     for _, p in sharded})
    placements = collections.Counter(_placements_text(p) for _, p in sharded)
    every = " ".join(f"{name}:{list(p.shape)}:{_placements_text(p)}:{tuple(p.device_mesh.shape)}"
                     for name, p in sharded)
    digest = hashlib.blake2b(every.encode(), digest_size=8).hexdigest()
    mesh_text = ", ".join(f"{list(shape)}{' ' + '/'.join(names) if names else ''}" for shape, names in meshes)
    kinds = ", ".join(f"{count} {text}" for text, count in sorted(placements.items()))
    setting = f"{len(sharded)} of {len(named)} parameters DTensors, digest {digest}, mesh {mesh_text}: {kinds}"
    return setting if len(setting) <= _MAX_LENGTH else setting[:_MAX_LENGTH - 4] + " ..."


def any_dtensor(parameters: List[torch.Tensor]) -> bool:
    return any(is_dtensor(p) for p in parameters)


def _shaped_like(parameter: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`values` (this rank's piece of the parameter's outer state) as the
    parameter is held: a DTensor of its mesh and placements, so that
    torch.distributed.checkpoint saves each rank's piece once and reshards
    it on a load with another rank count; else the tensor itself."""
    if not is_dtensor(parameter):
        return values
    return type(parameter).from_local(values, parameter.device_mesh, parameter.placements, run_check=False,
                                      shape=parameter.shape, stride=parameter.stride())


def own_state(names: List[str], parameters: List[torch.Tensor], global_state: torch.Tensor,
              momentum: torch.Tensor) -> Dict[str, Dict[str, torch.Tensor]]:
    """This rank's flat outer state (global parameters and outer momentum of
    its local pieces, in its parameters' order) by parameter name, each
    shaped as its parameter: {"global": {...}, "outer_momentum": {...}}."""
    state: Dict[str, Dict[str, torch.Tensor]] = {"global": {}, "outer_momentum": {}}
    at = 0
    for name, parameter in zip(names, parameters):
        piece = local_tensor(parameter)
        n = piece.numel()
        for key, flat in (("global", global_state), ("outer_momentum", momentum)):
            state[key][name] = _shaped_like(parameter, flat[at:at + n].view(piece.shape))
        at += n
    return state


def flat_own_state(state: Dict[str, Any], names: List[str], parameters: List[torch.Tensor],
                   values: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """own_state's inverse: this rank's pieces (of the layout it holds now:
    a DTensor's local piece, whatever rank count saved it) flat."""
    flats = (torch.empty(values, dtype=torch.float32), torch.empty(values, dtype=torch.float32))
    at = 0
    for name, parameter in zip(names, parameters):
        n = local_tensor(parameter).numel()
        for key, flat in zip(("global", "outer_momentum"), flats):
            saved = state.get(key, {}).get(name) if isinstance(state.get(key), dict) else None
            if not isinstance(saved, torch.Tensor):
                raise ValueError(f"mend: load_state_dict(): the saved outer state has no {key!r} of parameter {name!r}")
            piece = saved.to_local() if is_dtensor(saved) else saved
            if piece.numel() != n:
                raise ValueError(f"mend: load_state_dict(): the saved {key} of parameter {name!r} holds {piece.numel()} "
                                 f"values for this rank, which holds {n} of it (load a sharded state with "
                                 "torch.distributed.checkpoint, which reshards it to the ranks loading it)")
            flat[at:at + n].copy_(piece.detach().reshape(-1).to("cpu", torch.float32))
        at += n
    if at != values:
        raise ValueError(f"mend: load_state_dict(): this rank's parameters hold {at} values, its learner {values}")
    return flats
