"""libmend.so's C ABI (include/mend/mend.h) through ctypes.

Loads the library once, declares every function's signature, and turns a
failed call into the ``mend.MendError`` subclass of its status code with the
library's message. Nothing here imports torch.

Where the library comes from, first found: ``$MEND_LIBRARY``; the copy a
wheel carries in ``mend/_lib/``; the one ``_build_info.LIBRARY`` names (a
build tree's, or the installed one); ``libmend.so.<major>`` by the dynamic
loader's search. It is loaded with RTLD_LOCAL: its symbols stay out of the
process's global scope, and the libraries a wheel carries have names of
their own (scripts/wheel.sh), so they never stand in for another copy in the
process (a pip torch's). Not RTLD_DEEPBIND: that binds malloc and free in
libmend and everything it loads to glibc's own, beside an allocator
preloaded for the rest of the process (jemalloc, tcmalloc), which then frees
memory it never allocated. ``check_scope`` refuses, with a message, a
process whose global scope holds another Gloo (torch loaded with
TORCH_USE_RTLD_GLOBAL=1), which would stand in for the one libmend uses.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
from typing import Any, Dict, List, Optional

from mend import _build_info

ABI_VERSION = 13
PENDING = 100

# mend_learner_plan_step / mend_learner_last_flags.
STEP_MAY_WAIT = 1
STEP_READS = 2
STEP_WROTE = 4
STEP_MAY_WRITE = 8
STEP_DUE_NEXT = 16
# mend_learner_step_fragments.
FRAGMENTS_PLANNED = 0
FRAGMENTS_READ = 1
FRAGMENTS_WROTE = 2
# mend_learner_set_buffers.
BUFFERS_AVERAGED = 0
BUFFERS_FROM_FIRST_MEMBER = 1
# mend_learner_import_state.
IMPORT_KEEP_PARAMETERS = 1


class MendError(RuntimeError):
    """Base of every error mend raises; .args[0] is the message."""


_CODES = [
    (1, "CancelledError"), (2, "UnknownError"), (3, "InvalidArgumentError"),
    (4, "DeadlineExceededError"), (5, "NotFoundError"), (6, "AlreadyExistsError"),
    (7, "PermissionDeniedError"), (8, "ResourceExhaustedError"), (9, "FailedPreconditionError"),
    (10, "AbortedError"), (11, "OutOfRangeError"), (12, "UnimplementedError"), (13, "InternalError"),
    (14, "UnavailableError"), (15, "DataLossError"), (16, "UnauthenticatedError"),
]
ERRORS: Dict[int, type] = {}
for _code, _name in _CODES:
    ERRORS[_code] = type(_name, (MendError,), {"__module__": "mend", "__doc__": f"mend status {_name}."})
MendError.__module__ = "mend"


def _library_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("MEND_LIBRARY", "")]
    candidates += sorted(glob.glob(os.path.join(here, "_lib", "libmend.so*")))
    candidates.append(getattr(_build_info, "LIBRARY", ""))
    for path in candidates:
        if path and os.path.exists(path):
            return path
    major = _build_info.VERSION.split(".")[0]
    return f"libmend.so.{major}"  # the dynamic loader's search


# A Gloo function that libmend calls and a pip torch's libtorch_cpu.so
# exports too (torch carries a Gloo of its own, of another version).
_GLOO_PROBE = "_ZN4gloo9transport3tcp12CreateDeviceERKNS1_4attrE"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def check_scope() -> None:
    """Refuses a process whose global scope already holds Gloo's functions
    from a library other than a Gloo of its own (a pip torch loaded with
    TORCH_USE_RTLD_GLOBAL=1, or a module loaded with RTLD_GLOBAL): libmend's
    calls into Gloo would bind to that copy, of another version, and crash.
    Debian's torch links Debian's libgloo, the one libmend uses: accepted."""
    process = ctypes.CDLL(None)
    try:
        address = ctypes.cast(getattr(process, _GLOO_PROBE), ctypes.c_void_p).value
    except AttributeError:
        return  # no Gloo in the global scope
    info = _DlInfo()
    if not process.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return
    provider = info.dli_fname.decode(errors="replace")
    if not os.path.basename(provider).startswith("libgloo"):
        raise ImportError(
            f"mend: this process's global symbol scope already holds Gloo from {provider} (a torch loaded with "
            "TORCH_USE_RTLD_GLOBAL=1, or a library loaded with RTLD_GLOBAL): libmend's calls into Gloo would "
            "go to that copy, of another version. Import mend before torch, or unset TORCH_USE_RTLD_GLOBAL")


def _load() -> ctypes.CDLL:
    path = _library_path()
    check_scope()
    try:
        # (RTLD_NOW: every symbol bound now, before a library loaded later
        # with RTLD_GLOBAL could stand in for one)
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as error:
        raise ImportError(f"mend: cannot load its native library {path!r}: {error} (set MEND_LIBRARY to "
                          f"libmend.so, or reinstall mend)") from error
    lib.mend_abi_version.restype = ctypes.c_uint32
    lib.mend_abi_version.argtypes = []
    if lib.mend_abi_version() != ABI_VERSION:
        raise ImportError(f"mend: {path} implements C ABI version {lib.mend_abi_version()}, but this package "
                          f"speaks version {ABI_VERSION}: install the matching libmend.so")
    return lib


lib = _load()
LIBRARY_PATH = lib._name

_p = ctypes.c_void_p
_s = ctypes.c_char_p
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_int = ctypes.c_int
_status = ctypes.c_int


class Buffer(ctypes.Structure):
    _fields_ = [("name", _s), ("data", ctypes.POINTER(ctypes.c_float)), ("numel", _u64),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", _u32)]


STAT_FIELDS = ["steps", "rounds_started", "rounds", "failed_rounds", "passed_over", "heals", "moment_syncs",
               "bytes_sent", "cross_rack_bytes_sent", "last_round_id", "checkpoints", "checkpoint_failures",
               "resumed_from_round", "overlap_steps", "parameter_copies", "round_waits",
               "most_rounds_in_flight", "rounds_made_in_merge", "group_bytes_sent",
               "group_state_bytes_sent"]


class Stats(ctypes.Structure):
    _fields_ = [(name, _u64) for name in STAT_FIELDS]


PHASE_FIELDS = ["snapshot", "join", "agree_or_heal", "encode", "transfer", "reduce", "outer_step",
                "moments_and_buffers", "round"]


class RoundPhases(ctypes.Structure):
    _fields_ = [(name, ctypes.c_double) for name in PHASE_FIELDS]


_PP = ctypes.POINTER(_p)
_PS = ctypes.POINTER(ctypes.c_char_p)
_SIGNATURES = {
    "mend_version": (_s, []),
    "mend_last_error": (_s, []),
    "mend_string_free": (None, [_p]),
    "mend_bytes_free": (None, [_p]),
    "mend_set_logging": (_status, [_s, _s]),
    "mend_log": (_status, [_s, _s]),
    "mend_config_new": (_status, [_PP]),
    "mend_config_copy": (_status, [_p, _PP]),
    "mend_config_free": (None, [_p]),
    "mend_config_set": (_status, [_p, _s, _s, _s]),
    "mend_config_load_file": (_status, [_p, _s]),
    "mend_config_apply_environment": (_status, [_p]),
    "mend_config_check": (_status, [_p]),
    "mend_config_get": (_status, [_p, _s, _PP]),
    "mend_config_to_toml": (_status, [_p, _PP]),
    "mend_config_set_json": (_status, [_p, _s, _s]),
    "mend_config_to_json": (_status, [_p, _PP]),
    "mend_config_keys_json": (_status, [_PP]),
    "mend_config_suggest_key": (_status, [_s, _PP]),
    "mend_config_read_token": (_status, [_p, _PP]),
    "mend_config_add_job_setting": (_status, [_p, _s, _s]),
    "mend_lighthouse_start": (_status, [_p, _s, _PP]),
    "mend_lighthouse_address": (_s, [_p]),
    "mend_lighthouse_http_address": (_s, [_p]),
    "mend_lighthouse_status_json": (_status, [_p, _u32, _u32, _PP]),
    "mend_lighthouse_stop": (None, [_p]),
    "mend_status_json": (_status, [_s, _s, _s, _u32, _u32, _i64, _PP]),
    "mend_group_store_serve": (_status, [_p, _s, _s, _PP]),
    "mend_group_store_address": (_s, [_p]),
    "mend_group_store_stop": (None, [_p]),
    "mend_learner_create": (_status, [_p, _s, _s, ctypes.POINTER(Buffer), ctypes.c_size_t, _u64, _PP]),
    "mend_learner_create_sharded": (_status, [_p, _s, _s, ctypes.POINTER(Buffer), ctypes.POINTER(_u64),
                                              ctypes.c_size_t, _u64, _PP]),
    "mend_learner_set_moments": (_status, [_p, ctypes.c_size_t, _p, _p]),
    "mend_learner_set_optimizer": (_status, [_p, ctypes.c_double, ctypes.c_double, ctypes.POINTER(_u64)]),
    "mend_learner_round_phases": (_status, [_p, ctypes.POINTER(RoundPhases)]),
    "mend_learner_set_buffers": (_status, [_p, ctypes.POINTER(Buffer), ctypes.c_size_t, _u32]),
    "mend_learner_plan_step": (_u32, [_p]),
    "mend_learner_step": (_status, [_p, _u64, _i64]),
    "mend_learner_wait": (_status, [_p, _i64]),
    "mend_learner_interrupt": (None, [_p]),
    "mend_learner_last_flags": (_u32, [_p]),
    "mend_learner_stats": (_status, [_p, ctypes.POINTER(Stats)]),
    "mend_learner_fragments": (_int, [_p]),
    "mend_learner_parameter_fragment": (_int, [_p, _u64]),
    "mend_learner_step_fragments": (_status, [_p, _u32, ctypes.POINTER(ctypes.c_uint8), _u64]),
    "mend_learner_global_state": (_status, [_p, _int, ctypes.POINTER(ctypes.c_float), _u64,
                                            ctypes.POINTER(_u64)]),
    "mend_learner_export_state": (_status, [_p, _PP, ctypes.POINTER(_u64)]),
    "mend_learner_import_state": (_status, [_p, ctypes.c_char_p, _u64, _u32]),
    "mend_learner_own_values": (_status, [_p, ctypes.POINTER(_u64)]),
    "mend_learner_export_own_state": (_status, [_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float),
                                                _u64, _PP, ctypes.POINTER(_u64)]),
    "mend_learner_import_own_state": (_status, [_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float),
                                                _u64, ctypes.c_char_p, _u64]),
    "mend_learner_save_checkpoint": (_status, [_p, _s]),
    "mend_learner_shutdown": (_status, [_p]),
    "mend_learner_free": (None, [_p]),
}
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _function = getattr(lib, _name)
    _function.restype = _restype
    _function.argtypes = _argtypes

VERSION = lib.mend_version().decode()


def encode(text: Optional[str]) -> Optional[bytes]:
    return None if text is None else text.encode()


def error(code: int) -> MendError:
    """The exception for status `code`, with the calling thread's last message."""
    message = lib.mend_last_error().decode(errors="replace")
    return ERRORS.get(code, MendError)(message)


def check(code: int) -> None:
    if code != 0:
        raise error(code)


def take_string(call, *args: Any) -> str:
    """Calls a function whose last argument is a char** result; returns the text."""
    out = _p()
    check(call(*args, ctypes.byref(out)))
    try:
        return ctypes.string_at(out.value).decode() if out.value else ""
    finally:
        lib.mend_string_free(out)


def log(level: str, message: str) -> None:
    """A line in mend's log (stderr), at `level`, tagged like the learner's own."""
    check(lib.mend_log(level.encode(), message.encode()))


def config_keys() -> List[Dict[str, Any]]:
    return json.loads(take_string(lib.mend_config_keys_json))


class Handle:
    """Owns one C handle and frees it with `free` (once)."""

    def __init__(self, pointer: _p, free) -> None:
        self._pointer = pointer
        self._free = free

    @property
    def pointer(self) -> _p:
        if not self._pointer:
            raise ERRORS[9]("mend: this object was closed")
        return self._pointer

    def close(self) -> None:
        pointer, self._pointer = self._pointer, None
        if pointer:
            self._free(pointer)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (at interpreter exit the library may be gone)
            pass
