"""mend: fault-tolerant, communication-efficient data-parallel training.

Add mend to an ordinary PyTorch training loop::

    from mend import MendConfig, mend_init, mend_shutdown
    config = MendConfig(quorum_min_learners=2, sync_period_steps=128,
                        lighthouse="10.0.0.1:29510")
    mend_init(model, config)            # or mend_init(model, config, optimizer=opt)
    for batch in data:                  # train normally
        loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    mend_shutdown(model)

Each process that calls mend_init is one learner of the job (or, under
torchrun with a process group, one rank of a learner): every
``sync_period_steps`` optimizer steps it exchanges its pseudo-gradient with
the other learners through the lighthouse's round, and its parameters are
set to the job's new global parameters (DiLoCo's outer step). The job token
comes from the MEND_JOB_TOKEN environment variable or the ``token_file``
key, never from the script.

The package is pure Python over libmend.so's C ABI (ctypes): it works with
any CPython >= 3.9 and any torch >= 1.13, and ``mend.Learner`` runs a
learner over plain float32 buffers (numpy) without torch at all.
"""

from __future__ import annotations

import atexit
from typing import Any, Optional

from mend._config import MendConfig
from mend._learner import GroupStore, Learner, Lighthouse, status
from mend._native import (  # noqa: F401
    ERRORS as _ERRORS, MendError, VERSION as __version__)

AbortedError = _ERRORS[10]
AlreadyExistsError = _ERRORS[6]
CancelledError = _ERRORS[1]
DataLossError = _ERRORS[15]
DeadlineExceededError = _ERRORS[4]
FailedPreconditionError = _ERRORS[9]
InternalError = _ERRORS[13]
InvalidArgumentError = _ERRORS[3]
NotFoundError = _ERRORS[5]
OutOfRangeError = _ERRORS[11]
PermissionDeniedError = _ERRORS[7]
ResourceExhaustedError = _ERRORS[8]
UnauthenticatedError = _ERRORS[16]
UnavailableError = _ERRORS[14]
UnimplementedError = _ERRORS[12]
UnknownError = _ERRORS[2]

__all__ = [
    "MendConfig", "mend_init", "mend_shutdown", "get_runtime", "Runtime", "Lighthouse", "status",
    "Learner", "MendError", "__version__",
]

# The torch front end is imported on first use, so that `import mend` works
# without torch: the functions below, and `mend.Runtime` through __getattr__.


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from mend import _torch
        return _torch.Runtime
    raise AttributeError(f"module 'mend' has no attribute {name!r}")


def mend_init(model: Any, config: Optional[MendConfig] = None, rank_id: Optional[str] = None, *,
              optimizer: Any = None, manual: bool = False, scaler: Any = None) -> Any:
    """Makes ``model``'s process a learner of the job and returns its Runtime.

    ``model``: a torch.nn.Module (its parameters may be FSDP2 or tensor
    parallel DTensors); ``config``: a MendConfig (None: the defaults, the
    environment's MEND_* variables applied); ``rank_id``: the learner's id
    (None: MEND_LEARNER_ID, else HOST-PID). ``optimizer``: the inner
    optimizer whose steps run mend (None: the one found); ``manual=True``:
    call ``runtime.step(tokens)`` yourself; ``scaler``: the GradScaler, so
    that a step it skipped counts no tokens. The whole story:
    mend._torch.mend_init and docs/python.md.
    """
    from mend import _torch
    return _torch.mend_init(model, config, rank_id, optimizer=optimizer, manual=manual,
                            scaler=scaler)


def mend_shutdown(model: Any) -> None:
    """Finishes the round in flight and leaves the job. Idempotent; also at exit."""
    from mend import _torch
    _torch.mend_shutdown(model)


def get_runtime(model: Any):
    """The Runtime mend_init attached to ``model``, or None."""
    from mend import _torch
    return _torch.get_runtime(model)


@atexit.register
def _shutdown_all() -> None:
    import sys
    if "mend._torch" in sys.modules:
        sys.modules["mend._torch"].shutdown_all()
