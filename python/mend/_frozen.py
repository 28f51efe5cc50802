"""The frozen parameters' agreement: a digest of each, sent when the learner
registers, so that a learner whose frozen weights differ from the job's is
refused at ``mend_init`` instead of training on as a different model.

Frozen parameters (``requires_grad=False`` at ``mend_init``: a LoRA model's
base weights, frozen embeddings) are not exchanged: every learner must hold
the same ones from the start (the same pretrained base, or the same seed).
Each one's digest is computed where the tensor lives, with integer sums of
its bits as 64-bit words laid out in rows (the rows' and the columns' sums,
weighted by position, modulo 2^64: exact, so a GPU's and the CPU's digest of
the same bits agree), 64 MiB at a time; no copy of the weights leaves the
device. It tells weights that differ by accident (another seed, another
checkpoint) apart; it is no defence against a learner built to collide. The
job setting ``frozen_parameters`` holds their count, a digest of all and, as
far as the lighthouse's 512 characters go, each one's name and digest in
order, so a refusal names the first that differs.
"""

from __future__ import annotations

import hashlib
from typing import List, Optional, Tuple

import torch

JOB_SETTING = "frozen_parameters"
_CHUNK_WORDS = 1 << 23   # 64 MiB of a tensor's 64-bit words at a time
_COLUMNS = 512           # a chunk's words as a grid of this many columns
_MASK = (1 << 64) - 1
_MAX_LENGTH = 480        # mend_config_add_job_setting takes 500, key included
_WORD_TYPES = (torch.int64, torch.int32, torch.int16)


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as the widest integer words they divide into."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    for dtype in _WORD_TYPES:
        size = torch.empty((), dtype=dtype).element_size()
        if flat.numel() % size == 0:
            try:
                return flat.view(dtype)
            except RuntimeError:  # (a storage offset that is not a multiple of it)
                continue
    return flat


def _grid_sums(grid: torch.Tensor) -> Tuple[int, int, int]:
    """(sum, rows weighted by their index + 1, columns likewise) of a grid of
    words, modulo 2^64: integer additions wrap the same in any order on any
    device, so the CPU's and a GPU's sums of the same bits agree."""
    grid = grid.to(torch.int64)  # (words narrower than 64 bits: only a small tensor's)
    rows = grid.sum(dim=1)
    columns = grid.sum(dim=0)
    row_weights = torch.arange(1, rows.numel() + 1, dtype=torch.int64, device=grid.device)
    column_weights = torch.arange(1, columns.numel() + 1, dtype=torch.int64, device=grid.device)
    return (int(rows.sum()) & _MASK, int((rows * row_weights).sum()) & _MASK,
            int((columns * column_weights).sum()) & _MASK)


def tensor_digest(tensor: torch.Tensor) -> str:
    """16 hex digits of the tensor's dtype, shape and bits: two reduction
    passes over its words, chunk by chunk, where it lives (about 2.5 GB/s
    on one CPU core)."""
    words = _words(tensor)
    sums = []
    for start in range(0, words.numel(), _CHUNK_WORDS):
        part = words[start:start + _CHUNK_WORDS]
        full = part.numel() - part.numel() % _COLUMNS
        if full:
            sums.append(_grid_sums(part[:full].view(-1, _COLUMNS)))
        if full < part.numel():
            sums.append(_grid_sums(part[full:].view(1, -1)))
    text = f"{tensor.dtype} {tuple(tensor.shape)} {words.dtype} {sums}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def job_setting(named: List[Tuple[str, torch.Tensor]]) -> Optional[str]:
    """The value of the frozen_parameters job setting for these frozen
    parameters, in order; None when there are none."""
    if not named:
        return None
    digests = [(name, tensor_digest(p)) for name, p in named]
    every = hashlib.blake2b(" ".join(f"{n}={d}" for n, d in digests).encode(), digest_size=8).hexdigest()
    values = sum(p.numel() for _, p in named)
    setting = f"{len(named)} tensors, {values} values, digest {every}:"
    for name, digest in digests:
        item = f" {name}={digest[:8]}"
        if len(JOB_SETTING) + 1 + len(setting) + len(item) + 4 > _MAX_LENGTH:
            setting += " ..."
            break
        setting += item
    return setting
