"""mend: fault-tolerant, communication-efficient data-parallel training.

Add mend to an ordinary PyTorch training loop::

    from mend import MendConfig, mend_init, mend_shutdown
    config = MendConfig(quorum_min_learners=2, sync_period_steps=128,
                        lighthouse="10.0.0.1:29510")
    mend_init(model, config)            # or mend_init(model, config, optimizer=opt)
    for batch in data:                  # train normally
        loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    mend_shutdown(model)

Each process that calls mend_init is one learner of the job: every
``sync_period_steps`` optimizer steps it exchanges its pseudo-gradient with
the other learners through the lighthouse's round, and its parameters are
set to the job's new global parameters (DiLoCo's outer step). The job token
comes from the MEND_JOB_TOKEN environment variable or the ``token_file``
key, never from the script.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import threading
import warnings
import weakref
from typing import Any, Dict, Optional, Tuple

import torch

from mend import _build_info

if torch.__version__ != _build_info.TORCH_VERSION:
    raise ImportError(
        f"mend was built against torch {_build_info.TORCH_VERSION}, but this interpreter has "
        f"torch {torch.__version__}: rebuild and reinstall mend for it (scripts/setup.sh, or "
        f"cmake --build build && cmake --install build)")

from mend import _mend  # noqa: E402  (after the version check)
from mend._mend import (  # noqa: E402,F401
    AbortedError, AlreadyExistsError, CancelledError, DataLossError, DeadlineExceededError,
    FailedPreconditionError, InternalError, InvalidArgumentError, MendError, NotFoundError,
    OutOfRangeError, PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError,
    UnavailableError, UnimplementedError, UnknownError)

__all__ = [
    "MendConfig", "mend_init", "mend_shutdown", "get_runtime", "Runtime", "Lighthouse", "status",
    "MendError",
]

_KEYS = {row["name"]: row for row in _mend.config_keys()}

# Keys of the product's quick start that mend maps or refuses with a reason.
_ALIASES = {"sideband_heartbeat_ms": "heartbeat_ms"}
_REFUSED = {
    "async_tp_enabled": "async_tp_enabled: async tensor parallelism needs a CUDA build; mend's CPU "
                        "build has none (leave it out)",
    "sideband_addr": "sideband_addr: mend has no side band; learners reach each other through the "
                     "lighthouse (set lighthouse='HOST:PORT')",
    "sideband_peers": "sideband_peers: mend has no side band; the lighthouse tells every learner "
                      "its peers (set lighthouse='HOST:PORT')",
}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _key_doc() -> str:
    lines = []
    for name, row in _KEYS.items():
        allowed = ""
        if row["choices"]:
            allowed = " (" + " | ".join(row["choices"]) + ")"
        elif "min" in row:
            allowed = f" [{row['min']:g}, {row['max']:g}]"
        lines.append(f"    {name} ({row['type']}, default {row['default']!r}{allowed}):\n"
                     f"        {row['help']}")
    return "\n".join(lines)


class MendConfig:
    """A mend job's configuration: every key of the configuration table.

    ``MendConfig(**keys)`` layers, later winning: defaults < ``MEND_*``
    environment variables < the keywords (the same order as the ``mend``
    command: defaults < --config file < environment < flags). A bad value
    raises ValueError naming the key, the value and the allowed range; an
    unknown keyword raises TypeError naming the closest key.
    ``MendConfig.from_file(path, **keys)`` starts from a TOML file.

    ``momentum_sync_period_steps`` (or ``second_moment_sync_period_steps``)
    given without ``desloc`` turns DES-LOC on: averaging the inner Adam
    moments only happens with it.

    Keys:
{keys}
    """

    def __init__(self, _file: str = "", **keys: Any) -> None:
        given: Dict[str, str] = {}
        for name, value in keys.items():
            if name in _REFUSED:
                raise ValueError(_REFUSED[name])
            given[_ALIASES.get(name, name)] = _text(value)
        if ("momentum_sync_period_steps" in given or "second_moment_sync_period_steps" in given) \
                and "desloc" not in given:
            given["desloc"] = "true"
        self._config = _mend.Config(list(given.items()), _file, True)
        self._values = dict(self._config.values())
        self._given = given
        self._file = _file

    @classmethod
    def from_file(cls, path: str, **keys: Any) -> "MendConfig":
        """The configuration of a TOML file (then the environment, then ``keys``)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"mend: no configuration file {path!r}")
        return cls(_file=path, **keys)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is None or name not in values:
            raise AttributeError(f"MendConfig has no key {name!r}")
        row = _KEYS[name]
        text = values[name]
        if row["type"] == "int":
            return int(text)
        if row["type"] == "float":
            return float(text)
        if row["type"] == "bool":
            return text == "true"
        return text

    def as_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in _KEYS}

    def to_toml(self) -> str:
        return self._config.to_toml()

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._given)
        return f"MendConfig({changed})"


MendConfig.__doc__ = MendConfig.__doc__.replace("{keys}", _key_doc())


class Lighthouse:
    """A lighthouse (the job's coordinator) embedded in this process.

    For notebooks, tests and single-host jobs; ``mend lighthouse`` is the
    standalone one. ``bind`` and ``http`` of the config choose its addresses
    (port 0 picks a free one); ``.address`` is the gRPC address learners use
    as their ``lighthouse`` key. A context manager: leaving it shuts it down.
    """

    def __init__(self, config: Optional[MendConfig] = None, token: Optional[str] = None) -> None:
        config = config or MendConfig()
        self._token = token or _mend.read_job_token(config._config)
        self._server = _mend.Lighthouse(config._config, self._token)

    @property
    def address(self) -> str:
        return self._server.address

    @property
    def http_address(self) -> str:
        return self._server.http_address

    def status(self, max_learners: int = 0, max_rounds: int = 0) -> Dict[str, Any]:
        """The status document (the same as /status.json) as a dict."""
        return json.loads(self._server.status_json(max_learners, max_rounds))

    def shutdown(self) -> None:
        self._server.shutdown()

    def __enter__(self) -> "Lighthouse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def status(address: str, token: Optional[str] = None, max_learners: int = 0,
           max_rounds: int = 0) -> Dict[str, Any]:
    """The status document of the lighthouse at ``address`` as a dict.

    The token defaults to MEND_JOB_TOKEN."""
    token = token if token is not None else os.environ.get("MEND_JOB_TOKEN", "")
    return json.loads(_mend.status_json(address, token, max_learners, max_rounds))


_runtimes: "weakref.WeakKeyDictionary[torch.nn.Module, Runtime]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _default_learner_id() -> str:
    return f"{os.uname().nodename}-{os.getpid()}"


class Runtime:
    """What mend_init attaches to a model: one learner of the job.

    ``step(tokens=None)`` runs the reducer once (mend_init arranges for it to
    run after every optimizer step; call it yourself only with
    ``manual=True``); ``report_tokens(n)`` sets the tokens of the current
    step; ``stats()`` returns a dict; ``save_checkpoint(path)`` writes the
    global state; ``shutdown()`` finishes the round in flight and leaves.
    """

    def __init__(self, model: torch.nn.Module, config: MendConfig, learner_id: str,
                 optimizer: Optional[torch.optim.Optimizer]) -> None:
        named = [(name, p) for name, p in model.named_parameters()]
        if not named:
            raise ValueError("mend_init: the model has no parameters")
        for name, p in named:
            if p.is_sparse or p.dtype != torch.float32 or p.device.type != "cpu" \
                    or not p.is_contiguous():
                raise ValueError(
                    f"mend_init: parameter {name!r} is {'sparse ' if p.is_sparse else ''}"
                    f"{p.dtype} on {p.device}{'' if p.is_contiguous() else ', not contiguous'}; "
                    f"mend needs dense, contiguous float32 CPU parameters")
        self.model = model
        self.config = config
        self.learner_id = learner_id
        self._parameters = [p for _, p in named]
        self._moments_missing = set(range(len(self._parameters)))
        self._pid = os.getpid()
        self._tokens: Optional[int] = None
        self._counted_tokens = 0
        self._warned_no_tokens = False
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._original_step = None
        self._hooks = []
        token = _mend.read_job_token(config._config)
        with torch.no_grad():
            self._runtime = _mend.Runtime(config._config, token, learner_id,
                                          [(n, p.data) for n, p in named])
        self._hooks.append(model.register_forward_pre_hook(self._count_tokens))
        if optimizer is not None:
            self._attach(optimizer)
        else:
            found = _find_optimizer(self._parameters)
            if found is not None:
                self._attach(found)
            else:  # created after mend_init: looked for at the first training forward
                self._hooks.append(model.register_forward_pre_hook(self._find_later))

    # -- wiring ----------------------------------------------------------
    def _attach(self, optimizer: torch.optim.Optimizer) -> None:
        if self._optimizer is optimizer:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not any(id(p) in held for p in self._parameters):
            raise ValueError("mend_init: the optimizer holds none of the model's parameters")
        self._optimizer = optimizer
        original = optimizer.step
        runtime_ref = weakref.ref(self)

        def step(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            runtime = runtime_ref()
            if runtime is not None and not runtime.closed:
                runtime.step()
            return result

        self._original_step = original
        optimizer.step = step  # type: ignore[assignment]

    def _find_later(self, module: torch.nn.Module, inputs: Any) -> None:
        if self._optimizer is not None or not module.training:
            return
        found = _find_optimizer(self._parameters)
        if found is not None:
            self._attach(found)

    def _count_tokens(self, module: torch.nn.Module, inputs: Any) -> None:
        if not module.training:
            return
        for value in inputs if isinstance(inputs, tuple) else (inputs,):
            if isinstance(value, torch.Tensor) and not value.is_floating_point() \
                    and not value.is_complex():
                self._counted_tokens += int(value.numel())
                return

    def _hand_over_moments(self) -> None:
        """Gives the reducer each parameter's Adam moments once the optimizer has made them
        (at its first step); nothing is left to do on later steps."""
        if self._optimizer is None or not self._moments_missing:
            return
        state = self._optimizer.state
        for index in list(self._moments_missing):
            s = state.get(self._parameters[index])
            if s and "exp_avg" in s and "exp_avg_sq" in s:
                self._runtime.set_moments(index, s["exp_avg"], s["exp_avg_sq"])
                self._moments_missing.discard(index)

    # -- the user's calls -----------------------------------------------
    def report_tokens(self, tokens: int) -> None:
        """The tokens of the current inner step (else counted from the forward's input)."""
        self._tokens = int(tokens)

    def step(self, tokens: Optional[int] = None) -> None:
        """One inner step done: runs the reducer (a round at each boundary)."""
        self._check_process()
        if tokens is None:
            tokens = self._tokens if self._tokens is not None else self._counted_tokens
            if tokens == 0:
                # Nothing to count (the forward got no integer tensor, e.g. a
                # float-input model) and nothing reported: a step counts as 1,
                # so the merge weighs learners by steps rather than failing on
                # weights that sum to 0.
                if not self._warned_no_tokens:
                    self._warned_no_tokens = True
                    warnings.warn("mend: no token count for this inner step (the model's forward got no "
                                  "integer tensor and report_tokens() was not called); counting 1 per step, "
                                  "so learners are weighted by steps. Call runtime.report_tokens(n) or "
                                  "runtime.step(n) to weight them by tokens.", RuntimeWarning, stacklevel=2)
                tokens = 1
        self._tokens = None
        self._counted_tokens = 0
        if self.config.desloc or self.config.heal_inner_optimizer:
            self._hand_over_moments()
        with torch.no_grad():
            self._runtime.step(int(tokens))

    def stats(self) -> Dict[str, Any]:
        return dict(self._runtime.stats())

    def global_state(self, fragment: int = 0) -> torch.Tensor:
        """The job's global parameters of ``fragment`` after the last round (flat, a copy)."""
        return torch.tensor(self._runtime.global_state(fragment), dtype=torch.float32)

    def save_checkpoint(self, path: str) -> None:
        """Writes the global state (parameters and outer momentum, by name) to
        ``path``. For a learner of several ranks it is collective, like
        torch.distributed.checkpoint.save: every rank calls it at the same
        step, and group rank 0 writes the file."""
        self._check_process()
        self._runtime.save_checkpoint(path)

    @property
    def closed(self) -> bool:
        return self._runtime.closed

    def shutdown(self) -> None:
        """Finishes the round in flight and leaves the job. Idempotent."""
        if os.getpid() != self._pid:
            return
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._optimizer is not None and self._original_step is not None:
            self._optimizer.step = self._original_step  # type: ignore[assignment]
            self._original_step = None
        self._runtime.shutdown()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise FailedPreconditionError(
                f"mend: this runtime belongs to process {self._pid}; the forked process "
                f"{os.getpid()} (a DataLoader worker?) cannot use it")


def _find_optimizer(parameters) -> Optional[torch.optim.Optimizer]:
    """The live optimizer that holds any of ``parameters``, or None."""
    wanted = {id(p) for p in parameters}
    with warnings.catch_warnings():  # isinstance on every object wakes deprecated shims
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.optim.Optimizer):
                    held = {id(p) for group in obj.param_groups for p in group["params"]}
                    if held & wanted:
                        return obj
            except ReferenceError:
                continue
    return None


def _torch_group() -> Optional[Tuple[int, int]]:
    """(world size, rank) of torch.distributed's default group, when there is one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_world_size(), dist.get_rank()
    return None


def _with_group(config: MendConfig) -> MendConfig:
    """The learner's group: the config's group_size, else (under torchrun with a
    process group) every rank of torch.distributed's default group. A group's
    own store is the config's group_store, else torchrun's
    (MASTER_ADDR:MASTER_PORT)."""
    given = dict(config._given)
    group = _torch_group()
    if config.group_size == 1 and "group_size" not in given and group is not None:
        given["group_size"], given["group_rank"] = str(group[0]), str(group[1])
    elif config.group_size > 1 and "group_rank" not in given and group is not None:
        given["group_rank"] = str(group[1])
    grouped = int(given.get("group_size", config.group_size)) > 1
    master = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if grouped and not config.group_store and all(master):
        given["group_store"] = f"{master[0]}:{master[1]}"
    if given == config._given:
        return config
    return MendConfig(config._file, **given)


def _group_learner_id(config: MendConfig) -> str:
    """One id for every rank of a group: group rank 0's HOST-PID, through
    torch.distributed's store (the group's store under torchrun)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"mend_init: a learner of group_size = {config.group_size} needs one id for all its ranks: "
            "pass rank_id= or set MEND_LEARNER_ID (or initialize torch.distributed, whose store carries it)")
    store = distributed_c10d._get_default_store()
    key = "mend/learner_id"
    if config.group_rank == 0:
        store.set(key, _default_learner_id())
    return store.get(key).decode()


def mend_init(model: torch.nn.Module, config: Optional[MendConfig] = None,
              rank_id: Optional[str] = None, *,
              optimizer: Optional[torch.optim.Optimizer] = None) -> Runtime:
    """Makes ``model``'s process a learner of the job and returns its Runtime.

    After every inner optimizer step the reducer runs once: with
    ``optimizer=`` that optimizer's ``step`` is wrapped; without it, the
    optimizer that holds the model's parameters is found (now, or at the
    first training-mode forward if it is created later) and wrapped.
    Tokens per step: ``runtime.report_tokens(n)`` or ``runtime.step(n)``, else
    the element count of the first integer tensor the model's forward gets,
    else (a float-input model) 1 per step, with a warning.
    The learner id is ``rank_id``, else MEND_LEARNER_ID, else HOST-PID.

    A learner may be a group of ranks (a rack's hosts, training with their
    own DDP): under torchrun with torch.distributed initialized, every rank
    of the default process group is one rank of this learner (group_size =
    world size, group_rank = rank) unless the config sets group_size. Group
    rank 0 speaks for the group; rank r takes slice r of the cross-rack
    exchange on mend's own Gloo connections (never the user's process
    group). Without rank_id or MEND_LEARNER_ID the ranks share group rank
    0's HOST-PID, passed through torch.distributed's store.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError("mend_init: model must be a torch.nn.Module")
    config = _with_group(config or MendConfig())
    with _lock:
        if model in _runtimes and not _runtimes[model].closed:
            raise FailedPreconditionError(
                "mend_init: this model already has a mend runtime; call mend_shutdown(model) first")
        learner_id = rank_id or os.environ.get("MEND_LEARNER_ID") or (
            _group_learner_id(config) if config.group_size > 1 else _default_learner_id())
        runtime = Runtime(model, config, str(learner_id), optimizer)
        _runtimes[model] = runtime
    return runtime


def get_runtime(model: torch.nn.Module) -> Optional[Runtime]:
    """The Runtime mend_init attached to ``model``, or None."""
    return _runtimes.get(model)


def mend_shutdown(model: torch.nn.Module) -> None:
    """Finishes the round in flight and leaves the job. Idempotent; also at exit."""
    runtime = _runtimes.get(model)
    if runtime is not None:
        runtime.shutdown()


@atexit.register
def _shutdown_all() -> None:
    for runtime in list(_runtimes.values()):
        try:
            runtime.shutdown()
        except Exception:  # noqa: BLE001 (at exit, one failure must not stop the rest)
            pass
