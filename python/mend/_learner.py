"""The torch-free layer: a learner over float32 buffers, an embedded
lighthouse, a learner group's store, and a lighthouse's status."""

from __future__ import annotations

import array
import ctypes
import json
import operator
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mend import _native
from mend._config import MendConfig, check_config
from mend._native import lib

# How long one wait for a round lasts before Python gets a chance to run
# signal handlers (Ctrl-C) and other threads.
_WAIT_SLICE_MS = 20


def read_token(config: MendConfig) -> str:
    """MEND_JOB_TOKEN, else the contents of the config's token_file."""
    native = config.native()  # alive until the call returns
    return _native.take_string(lib.mend_config_read_token, native.pointer)


def default_learner_id() -> str:
    return f"{os.uname().nodename}-{os.getpid()}"


# The learners open in this process, by (lighthouse, job, learner id, group
# rank): a second one of the same key would register as the first's restart,
# and the lighthouse would stop the first (ALREADY_EXISTS at its next round).
_open_lock = threading.Lock()
_open_learners: Dict[Tuple[str, str, str, int], "weakref.ref[Learner]"] = {}


def _claim(learner: "Learner", key: Tuple[str, str, str, int]) -> None:
    """Takes `key` for `learner`; AlreadyExistsError when a learner of this
    process that was not shut down holds it."""
    with _open_lock:
        held = _open_learners.get(key)
        other = held() if held is not None else None
        if other is not None and other is not learner and not other._closed and other._pid == os.getpid():
            lighthouse, job, learner_id, rank = key
            raise _native.ERRORS[6](
                f"mend: learner {learner_id!r}{f' group rank {rank}' if rank else ''} of job {job!r} "
                f"(lighthouse {lighthouse}) is already open in this process, and not shut down: the "
                "lighthouse would take the new one for a restart of the first and stop the first. Give each "
                "its own learner id (rank_id=, or the learner_id argument), or shut the first down first "
                "(mend_shutdown); a second model is a job of its own (its own job_id and lighthouse)")
        _open_learners[key] = weakref.ref(learner)


def _release(learner: "Learner") -> None:
    key = learner.__dict__.get("_claimed")
    if key is None:
        return
    with _open_lock:
        held = _open_learners.get(key)
        if held is not None and held() in (learner, None):
            del _open_learners[key]


class Lighthouse:
    """A lighthouse (the job's coordinator) embedded in this process.

    For notebooks, tests and single-host jobs; ``mend lighthouse`` is the
    standalone one. ``bind`` and ``http`` of the config choose its addresses
    (port 0 picks a free one); ``.address`` is the gRPC address learners use
    as their ``lighthouse`` key. A context manager: leaving it shuts it down.
    """

    def __init__(self, config: Optional[MendConfig] = None, token: Optional[str] = None) -> None:
        config = config or MendConfig()
        check_config(config, "mend.Lighthouse")
        token = token or read_token(config)
        pointer = _native._p()
        native = config.native()  # alive until the call returns
        _native.check(lib.mend_lighthouse_start(native.pointer, token.encode(), ctypes.byref(pointer)))
        self._handle = _native.Handle(pointer, lib.mend_lighthouse_stop)
        self._address = lib.mend_lighthouse_address(pointer).decode()
        self._http_address = lib.mend_lighthouse_http_address(pointer).decode()

    @property
    def address(self) -> str:
        return self._address

    @property
    def http_address(self) -> str:
        return self._http_address

    def status(self, max_learners: int = 0, max_rounds: int = 0) -> Dict[str, Any]:
        """The status document (the same as /status.json) as a dict."""
        return json.loads(_native.take_string(lib.mend_lighthouse_status_json, self._handle.pointer,
                                              max_learners, max_rounds))

    def shutdown(self) -> None:
        self._handle.close()

    def __enter__(self) -> "Lighthouse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def status(address: str, token: Optional[str] = None, max_learners: int = 0,
           max_rounds: int = 0) -> Dict[str, Any]:
    """The status document of the lighthouse at ``address`` as a dict.

    The token defaults to MEND_JOB_TOKEN."""
    token = token if token is not None else os.environ.get("MEND_JOB_TOKEN", "")
    return json.loads(_native.take_string(lib.mend_status_json, address.encode(), token.encode(), None,
                                          max_learners, max_rounds, 5000))


class GroupStore:
    """The store of a learner group, served by its rank 0 (see mend_init)."""

    def __init__(self, config: MendConfig, token: str, address: str) -> None:
        pointer = _native._p()
        native = config.native()  # alive until the call returns
        _native.check(lib.mend_group_store_serve(native.pointer, token.encode(), address.encode(),
                                                 ctypes.byref(pointer)))
        self._handle = _native.Handle(pointer, lib.mend_group_store_stop)
        self.address = lib.mend_group_store_address(pointer).decode()

    def stop(self) -> None:
        self._handle.close()


# The most tokens one call may count: the lighthouse's bound on a learner's
# tokens between rounds.
MAX_TOKENS = 1 << 62


def check_tokens(tokens: Any, where: str) -> int:
    """``tokens`` as an int in [0, MAX_TOKENS]; TypeError / ValueError naming
    ``where`` otherwise (a negative count would wrap to 2^64 - n)."""
    try:
        count = operator.index(tokens)
    except TypeError:
        raise TypeError(f"mend: {where}: tokens must be an integer, got {type(tokens).__name__} "
                        f"{tokens!r}") from None
    if not 0 <= count <= MAX_TOKENS:
        raise ValueError(f"mend: {where}: tokens = {count}: must be in [0, 2^62]")
    return count


def _address_of(name: str, buffer: Any) -> Tuple[int, int, Tuple[int, ...], memoryview]:
    """(address, values, shape, view) of a writable, C-contiguous float32 buffer."""
    try:
        view = memoryview(buffer)
    except TypeError as error:
        raise TypeError(f"mend: buffer {name!r} ({type(buffer).__name__}) does not expose its memory "
                        f"(use a numpy array or array.array('f'))") from error
    if view.format not in ("f", "<f", "=f") or view.itemsize != 4:
        raise ValueError(f"mend: buffer {name!r} holds {view.format!r} values; mend needs float32")
    if not view.c_contiguous:
        raise ValueError(f"mend: buffer {name!r} is not C-contiguous")
    if view.readonly:
        raise ValueError(f"mend: buffer {name!r} is read-only; mend writes the parameters in place")
    count = view.nbytes // 4
    address = ctypes.addressof(ctypes.c_float.from_buffer(view)) if count else 0
    return address, count, tuple(view.shape), view


def _call_aside(name: str, call: Callable[[], int], interrupted: Callable[[], None],
                join_after_interrupt: bool = False) -> None:
    """Runs ``call``, a C call that returns a mend_status and may block for
    long, on a thread of its own and waits for it, so that Ctrl-C in the
    wait is answered at once: ``interrupted()`` runs then (and, with
    ``join_after_interrupt``, the wait for the call goes on, uninterruptible
    by this one exception) and the exception goes on. The call's error is
    raised here (its message is read on the thread that made the call)."""
    failed: List[BaseException] = []

    def run() -> None:
        try:
            _native.check(call())
        except BaseException as error:  # noqa: B902 - handed to the caller
            failed.append(error)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except BaseException:
        interrupted()
        if join_after_interrupt:
            worker.join()
        raise
    if failed:
        raise failed[0]


def _refuse_overlaps(entries: List[Tuple[str, int, int, Tuple[int, ...]]]) -> None:
    """ValueError naming two buffers that share memory: mend would merge the
    same values twice and write each result over the other."""
    spans = sorted((address, address + 4 * count, name) for name, address, count, _ in entries if count)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"mend: buffers {first!r} and {second!r} share memory; give each parameter "
                             f"once (tied weights: one name)")


def _buffer_array(entries: List[Tuple[str, int, int, Tuple[int, ...]]]):
    """The C array of mend_buffer for (name, address, values, shape) entries,
    and what must stay alive while it is used (the names and shapes)."""
    buffers = (_native.Buffer * len(entries))()
    keep = []
    for i, (name, address, count, shape) in enumerate(entries):
        encoded = name.encode()
        dims = (ctypes.c_int64 * len(shape))(*shape)
        keep += [encoded, dims]
        buffers[i] = _native.Buffer(encoded, ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), count, dims,
                                    len(shape))
    return buffers, keep


class Learner:
    """One learner of a mend job over float32 buffers it does not own.

    ``buffers`` is a sequence of ``(name, buffer)``: writable, C-contiguous
    float32 memory (a numpy array, ``array.array('f')``, ...), which mend
    reads and writes in place at round boundaries; every learner of the job
    passes the same names and sizes in the same order. After each inner step
    the program calls ``step(tokens)``. No torch is needed: this is what
    ``mend_init`` builds on.

    ``step`` releases the GIL while it waits for a round and lets Python run
    signal handlers every few milliseconds: a KeyboardInterrupt there calls
    the round off, leaves the job and propagates.
    """

    def __init__(self, config: MendConfig, buffers: Sequence[Tuple[str, Any]], learner_id: Optional[str] = None,
                 *, token: Optional[str] = None, start_step: int = 0) -> None:
        entries = []
        keep = []
        for name, buffer in buffers:
            address, count, shape, view = _address_of(name, buffer)
            entries.append((name, address, count, shape))
            keep.append((buffer, view))
        _refuse_overlaps(entries)
        self._open(config, entries, learner_id, token, start_step, keep)

    @classmethod
    def _from_addresses(cls, config: MendConfig, entries: List[Tuple[str, int, int, Tuple[int, ...]]],
                        learner_id: Optional[str], token: Optional[str], start_step: int,
                        keep: Any, job_settings: Optional[Dict[str, str]] = None,
                        replica_keys: Optional[List[int]] = None) -> "Learner":
        """A learner over raw addresses (name, address, values, shape) that
        `keep` keeps alive; `job_settings` (key -> value) must agree with the
        job's other learners (mend_config_add_job_setting); `replica_keys`:
        each parameter's, for a model sharded over the group's ranks
        (mend_learner_create_sharded)."""
        learner = cls.__new__(cls)
        learner._open(config, entries, learner_id, token, start_step, keep, job_settings, replica_keys)
        return learner

    def _open(self, config: MendConfig, entries, learner_id, token, start_step, keep,
              job_settings: Optional[Dict[str, str]] = None, replica_keys: Optional[List[int]] = None) -> None:
        check_config(config, "mend.Learner")
        if not entries:
            raise ValueError("mend: a learner needs at least one parameter")
        self.config = config
        self.learner_id = str(learner_id or os.environ.get("MEND_LEARNER_ID") or default_learner_id())
        self._keep = keep
        self._optimizer_step: Optional[ctypes.c_uint64] = None
        self._pid = os.getpid()
        self._closed = False
        token = token or read_token(config)
        self._claimed = (config.lighthouse, config.job_id, self.learner_id, int(config.group_rank))
        _claim(self, self._claimed)
        try:
            self._create(config, entries, token, start_step, job_settings or {}, replica_keys)
        except BaseException:
            _release(self)
            raise

    def _create(self, config: MendConfig, entries, token, start_step, job_settings: Dict[str, str],
                replica_keys: Optional[List[int]] = None) -> None:
        buffers, _ = _buffer_array(entries)
        keys = None if replica_keys is None else (_native._u64 * len(entries))(*replica_keys)
        pointer = _native._p()
        native = config.native()  # alive until the call returns
        for key, value in job_settings.items():
            _native.check(lib.mend_config_add_job_setting(native.pointer, key.encode(), value.encode()))
        # The call waits up to lighthouse_wait_ms for the lighthouse, aside
        # (_call_aside). A learner created after the caller gave up leaves the
        # job there and then.
        lock = threading.Lock()
        state = {"done": False, "abandoned": False}

        def release() -> None:
            lib.mend_learner_interrupt(pointer)
            lib.mend_learner_shutdown(pointer)
            lib.mend_learner_free(pointer)

        def create() -> int:
            code = lib.mend_learner_create_sharded(native.pointer, token.encode(), self.learner_id.encode(),
                                                   buffers, keys, len(entries), int(start_step),
                                                   ctypes.byref(pointer))
            with lock:
                state["done"] = True
                if state["abandoned"] and pointer:
                    release()
            return code

        def give_up() -> None:
            with lock:
                state["abandoned"] = True
                if state["done"] and pointer:
                    release()

        _call_aside("mend-learner-create", create, give_up)
        self._handle = _native.Handle(pointer, lib.mend_learner_free)
        self._pointer = pointer
        self.names = [name for name, _, _, _ in entries]
        self.counts = [count for _, _, count, _ in entries]

    # -- steps -----------------------------------------------------------
    def plan_step(self) -> int:
        """Fixes what the next step does: a bit set of mend._native.STEP_MAY_WAIT
        and STEP_READS (it may read the buffers: a staged copy must be current)."""
        return lib.mend_learner_plan_step(self._pointer)

    def step(self, tokens: int) -> None:
        """One inner step done, with the tokens it processed."""
        self._check_process()
        tokens = check_tokens(tokens, "Learner.step")
        pointer = self._pointer
        try:
            code = lib.mend_learner_step(pointer, tokens, _WAIT_SLICE_MS)
            while code == _native.PENDING:
                code = lib.mend_learner_wait(pointer, _WAIT_SLICE_MS)
        except BaseException:
            # A signal handler (Ctrl-C) raised between waits: call the round
            # off, let the step return (a no-op when none waits), leave the
            # job, and let the exception go on.
            lib.mend_learner_interrupt(pointer)
            lib.mend_learner_wait(pointer, -1)
            try:
                self.shutdown()
            except _native.MendError:
                pass
            raise
        if code != 0:
            raise _native.error(code)

    @property
    def last_flags(self) -> int:
        """STEP_WROTE when the last create, step, import or shutdown wrote the buffers."""
        return lib.mend_learner_last_flags(self._pointer)

    def set_moments(self, index: int, first: Any, second: Any) -> None:
        """The inner optimizer's Adam moments of buffer ``index`` (float32
        buffers of its size), for desloc and heal_inner_optimizer."""
        index = operator.index(index)
        if not 0 <= index < len(self.names):
            raise IndexError(f"mend: set_moments: no buffer {index} (there are {len(self.names)})")
        a, count_a, _, view_a = _address_of(f"{self.names[index]} (first moment)", first)
        b, count_b, _, view_b = _address_of(f"{self.names[index]} (second moment)", second)
        # mend reads and writes the parameter's count of values through each.
        for which, count in (("first", count_a), ("second", count_b)):
            if count != self.counts[index]:
                raise ValueError(f"mend: set_moments: the {which} moment of {self.names[index]!r} holds "
                                 f"{count} values; the buffer holds {self.counts[index]}")
        self._set_moment_addresses(index, a, b, (first, second, view_a, view_b))

    def set_optimizer(self, beta1: float, beta2: float) -> None:
        """The inner optimizer's Adam betas, for desloc and
        heal_inner_optimizer (torch's defaults, 0.9 and 0.999, until set);
        from then on ``optimizer_step`` is its step count (Adam's t): set it
        before a step that reads the buffers; a heal writes the source's
        into it with the moments."""
        self._check_process()
        counter = ctypes.c_uint64(self._optimizer_step.value if self._optimizer_step is not None else 0)
        _native.check(lib.mend_learner_set_optimizer(self._pointer, float(beta1), float(beta2),
                                                     ctypes.byref(counter)))
        self._optimizer_step = counter  # the library holds its address from now on

    @property
    def optimizer_step(self) -> int:
        """The inner optimizer's step count as mend holds it (0 before set_optimizer)."""
        return self._optimizer_step.value if self._optimizer_step is not None else 0

    @optimizer_step.setter
    def optimizer_step(self, step: int) -> None:
        if self._optimizer_step is None:
            raise _native.ERRORS[9]("mend: optimizer_step before set_optimizer(beta1, beta2)")
        self._optimizer_step.value = int(step)

    def set_buffers(self, buffers: Sequence[Tuple[str, Any]], from_first_member: bool = False) -> None:
        """The model's buffers (float32 memory, like the parameters), kept the
        same on every member: averaged at every round with its weights, or
        (``from_first_member``: integer values carried as floats) taken from
        the round's first member. Before the first step."""
        entries, keep = [], []
        for name, buffer in buffers:
            address, count, shape, view = _address_of(name, buffer)
            entries.append((name, address, count, shape))
            keep.append((buffer, view))
        self._set_buffer_addresses(entries, from_first_member, keep)

    def _set_buffer_addresses(self, entries, from_first_member: bool, keep: Any) -> None:
        self._check_process()
        array, names = _buffer_array(entries)
        kind = _native.BUFFERS_FROM_FIRST_MEMBER if from_first_member else _native.BUFFERS_AVERAGED
        _native.check(lib.mend_learner_set_buffers(self._pointer, array, len(entries), kind))
        self._keep = (self._keep, keep, names)

    def _set_moment_addresses(self, index: int, first: int, second: int, keep: Any) -> None:
        self._check_process()
        _native.check(lib.mend_learner_set_moments(self._pointer, index, first, second))
        if keep:
            self._keep = (self._keep, keep)

    # -- state -----------------------------------------------------------
    def stats(self) -> Dict[str, int]:
        """The learner's counters; after shutdown, the final ones."""
        stats = _native.Stats()
        _native.check(lib.mend_learner_stats(self._pointer, ctypes.byref(stats)))
        return {name: getattr(stats, name) for name in _native.STAT_FIELDS}

    @property
    def finished(self) -> bool:
        """Whether this learner has trained the job's ``total_steps``, by the
        job's step count (``stats()["steps"]``). A learner that joins late
        or restarts heals onto the others' step, so a loop that counts its
        own iterations would run past the job's end and miss the final
        merge; ``while not learner.finished: ...`` ends with the job. Always
        False with ``total_steps = 0`` (a job of unknown length)."""
        total = int(self.config.total_steps)
        return total > 0 and self.stats()["steps"] >= total

    def round_phases(self) -> Dict[str, float]:
        """Where the rounds' time went: seconds by phase (snapshot, join, agree_or_heal,
        encode, transfer, reduce, outer_step, moments_and_buffers, round), summed
        over the rounds this learner completed; work on several threads adds up."""
        phases = _native.RoundPhases()
        _native.check(lib.mend_learner_round_phases(self._pointer, ctypes.byref(phases)))
        return {name: getattr(phases, name) for name in _native.PHASE_FIELDS}

    @property
    def fragments(self) -> int:
        return lib.mend_learner_fragments(self._pointer)

    def parameter_fragment(self, index: int) -> int:
        """The fragment buffer ``index`` belongs to (index mod fragments)."""
        fragment = lib.mend_learner_parameter_fragment(self._pointer, int(index))
        if fragment < 0:
            raise IndexError(f"mend: no buffer {index} (there are {len(self.names)})")
        return fragment

    def step_fragments(self, which: int) -> List[bool]:
        """By fragment: whether the next step may read or write its buffers
        (``which`` = mend._native.FRAGMENTS_PLANNED, as plan_step() fixed it;
        all when none is fixed), or whether the last create, step, import or
        shutdown read (FRAGMENTS_READ) or wrote (FRAGMENTS_WROTE) them."""
        count = self.fragments
        out = (ctypes.c_uint8 * count)()
        _native.check(lib.mend_learner_step_fragments(self._pointer, int(which), out, count))
        return [bool(v) for v in out]

    def global_state(self, fragment: int = 0) -> array.array:
        """The job's global parameters of ``fragment`` after the last round (flat, a copy)."""
        def allocate(count: int) -> array.array:
            return array.array("f", bytes(4 * count))
        return self.global_state_into(fragment, allocate, lambda a: a.buffer_info()[0])

    def global_state_into(self, fragment: int, allocate: Callable[[int], Any],
                          address: Callable[[Any], int] = lambda t: t.data_ptr()) -> Any:
        """The global parameters of ``fragment`` written straight into
        ``allocate(count)`` (float32 memory at ``address(it)``)."""
        count = ctypes.c_uint64()
        _native.check(lib.mend_learner_global_state(self._pointer, fragment, None, 0, ctypes.byref(count)))
        out = allocate(count.value)
        if count.value:
            pointer = ctypes.cast(address(out), ctypes.POINTER(ctypes.c_float))
            _native.check(lib.mend_learner_global_state(self._pointer, fragment, pointer, count.value,
                                                        ctypes.byref(count)))
        return out

    def export_state(self) -> bytes:
        """The outer state (global parameters, outer momentum, round, step) as
        bytes in mend's checkpoint format. A group's ranks call it together;
        rank 0 gets the bytes, the others b""."""
        self._check_process()
        data = _native._p()
        size = ctypes.c_uint64()
        _native.check(lib.mend_learner_export_state(self._pointer, ctypes.byref(data), ctypes.byref(size)))
        try:
            return ctypes.string_at(data.value, size.value) if size.value else b""
        finally:
            lib.mend_bytes_free(data)

    def import_state(self, state: bytes, keep_parameters: bool = False) -> None:
        """Makes exported bytes (or a checkpoint file's) the global state,
        between rounds. By default they become the buffers too and the step is
        the state's; with ``keep_parameters`` the buffers stay as they are
        (restored by the caller) and the exporting learner's step, tokens and
        error feedback come back: the job goes on exactly."""
        self._check_process()
        flags = _native.IMPORT_KEEP_PARAMETERS if keep_parameters else 0
        _native.check(lib.mend_learner_import_state(self._pointer, bytes(state), len(state), flags))

    def own_values(self) -> int:
        """How many values of the model this rank holds (its local pieces',
        the trainable parameters' in the order given)."""
        self._check_process()
        count = ctypes.c_uint64()
        _native.check(lib.mend_learner_own_values(self._pointer, ctypes.byref(count)))
        return count.value

    def export_own_state(self, global_address: int, momentum_address: int, values: int) -> bytes:
        """This rank's own outer state: the global parameters and outer
        momentum of every value it holds (own_values() float32 each, flat, in
        its parameters' order) into the buffers at the two addresses; returns
        the state's description (round, steps, tokens) as bytes. A group's
        ranks call it together; each gets its own."""
        self._check_process()
        data = _native._p()
        size = ctypes.c_uint64()
        as_floats = ctypes.POINTER(ctypes.c_float)
        _native.check(lib.mend_learner_export_own_state(
            self._pointer, ctypes.cast(global_address, as_floats), ctypes.cast(momentum_address, as_floats),
            values, ctypes.byref(data), ctypes.byref(size)))
        try:
            return ctypes.string_at(data.value, size.value)
        finally:
            lib.mend_bytes_free(data)

    def import_own_state(self, global_address: int, momentum_address: int, values: int, described: bytes) -> None:
        """export_own_state's three back, between rounds (a group's ranks
        together); the parameters stay as they are, and the exporting
        learner's step and tokens since its rounds come back."""
        self._check_process()
        as_floats = ctypes.POINTER(ctypes.c_float)
        _native.check(lib.mend_learner_import_own_state(
            self._pointer, ctypes.cast(global_address, as_floats), ctypes.cast(momentum_address, as_floats),
            values, bytes(described), len(described)))

    def save_checkpoint(self, path: str) -> None:
        self._check_process()
        _native.check(lib.mend_learner_save_checkpoint(self._pointer, os.fspath(path).encode()))

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        """Finishes the round in flight and leaves the job. Idempotent."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        _release(self)
        # The call may wait for the round in flight and the final merge (up to
        # quorum_timeout_ms), aside: Ctrl-C calls them off, as in step.
        pointer = self._pointer
        _call_aside("mend-shutdown", lambda: lib.mend_learner_shutdown(pointer),
                    lambda: lib.mend_learner_interrupt(pointer), join_after_interrupt=True)

    def interrupt(self) -> None:
        """Calls off the round a step waits for (from any thread)."""
        lib.mend_learner_interrupt(self._pointer)

    def leave(self) -> None:
        """Leaves the job without its final merge: calls every later join
        off, then shuts down (what that returns is not an error here)."""
        if self._closed or os.getpid() != self._pid:
            return
        self.interrupt()
        try:
            self.shutdown()
        except _native.MendError:
            pass

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise _native.ERRORS[9](
                f"mend: this learner belongs to process {self._pid}; the forked process {os.getpid()} "
                f"(a DataLoader worker?) cannot use it")
        if self._closed:
            raise _native.ERRORS[9]("mend: this learner was shut down")

    def __del__(self) -> None:
        handle = self.__dict__.get("_handle")
        if handle is not None and os.getpid() == self._pid:
            try:
                if not self._closed:
                    lib.mend_learner_shutdown(self._pointer)
            except Exception:  # noqa: BLE001
                pass
