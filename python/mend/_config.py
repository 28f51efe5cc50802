"""MendConfig: the configuration key table, through libmend's checks."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from mend import _native
from mend._native import lib

_KEYS = {row["name"]: row for row in _native.config_keys()}

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


def _bound(row: dict, value: float) -> str:
    """A range's end as the key's type writes it: 3600000, not 3.6e+06."""
    return str(int(value)) if row["type"] == "int" else f"{value:g}"


def _key_doc() -> str:
    lines = []
    for name, row in _KEYS.items():
        allowed = ""
        if row["choices"]:
            allowed = " (" + " | ".join(row["choices"]) + ")"
        elif "min" in row:
            allowed = f" [{_bound(row, row['min'])}, {_bound(row, row['max'])}]"
        default = repr(row["default"]) if row["type"] == "str" else row["default"]
        lines.append(f"    {name} ({row['type']}, default {default}{allowed}):\n"
                     f"        {row['help']}")
    return "\n".join(lines)


def _refuse_retired(name: str, value: Any) -> None:
    """Raises ValueError with libmend's message when ``name`` is a key that
    was replaced (it names what to set instead); returns for other unknown keys."""
    try:
        NativeConfig({name: _text(value)})
    except Exception as error:  # libmend's error for the key, whatever its class
        if "was replaced by" in str(error):
            raise ValueError(str(error)) from None


def _given_texts(keys: Dict[str, Any]) -> Dict[str, str]:
    """Keywords as (key, text): aliases mapped, refused keys and unknown ones
    (with the closest known key) raised."""
    given: Dict[str, str] = {}
    for name, value in keys.items():
        if name in _REFUSED:
            raise ValueError(_REFUSED[name])
        name = _ALIASES.get(name, name)
        if name not in _KEYS:
            _refuse_retired(name, value)
            suggestion = _native.take_string(lib.mend_config_suggest_key, name.encode())
            raise TypeError(f"MendConfig() got an unexpected keyword argument '{name}'"
                            + (f"; did you mean '{suggestion}'?" if suggestion else ""))
        if value is None:  # not given (an argparse default): the key keeps its value
            continue
        given[name] = _text(value)
    return given


class NativeConfig(_native.Handle):
    """A mend_config handle holding `values` (every key's text)."""

    def __init__(self, values: Dict[str, str]) -> None:
        pointer = _native._p()
        _native.check(lib.mend_config_new(pointer))
        super().__init__(pointer, lib.mend_config_free)
        _native.check(lib.mend_config_set_json(pointer, json.dumps(values).encode(), b"MendConfig"))


def _resolve(file: str, given: Dict[str, str], environment: bool = True,
             base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """defaults (or ``base``) < file < MEND_* environment < keywords, checked; every key's text."""
    pointer = _native._p()
    _native.check(lib.mend_config_new(pointer))
    handle = _native.Handle(pointer, lib.mend_config_free)
    try:
        if base:
            _native.check(lib.mend_config_set_json(pointer, json.dumps(base).encode(), b"MendConfig"))
        if file:
            _raise_as_value_error(lib.mend_config_load_file(pointer, file.encode()))
        if environment:
            _raise_as_value_error(lib.mend_config_apply_environment(pointer))
        if given:
            _raise_as_value_error(lib.mend_config_set_json(pointer, json.dumps(given).encode(), b"keyword"))
        _raise_as_value_error(lib.mend_config_check(pointer))
        return json.loads(_native.take_string(lib.mend_config_to_json, pointer))
    finally:
        handle.close()


def _raise_as_value_error(code: int) -> None:
    """A bad value (INVALID_ARGUMENT) is a ValueError; other failures their MendError."""
    if code == 3:
        raise ValueError(lib.mend_last_error().decode(errors="replace"))
    _native.check(code)


def check_config(config: Any, where: str) -> None:
    """TypeError naming ``where`` unless ``config`` is a MendConfig."""
    if not isinstance(config, MendConfig):
        raise TypeError(f"{where}: config must be a MendConfig, not {type(config).__name__}"
                        + (" (MendConfig(**settings) makes one from a dict)" if isinstance(config, dict) else ""))


class MendConfig:
    """A mend job's configuration: every key of the configuration table.

    ``MendConfig(**keys)`` layers, later winning: defaults < ``MEND_*``
    environment variables < the keywords (the same order as the ``mend``
    command: defaults < --config file < environment < flags). A bad value
    raises ValueError naming the key, the value and the allowed range; an
    unknown keyword raises TypeError naming the closest key.
    ``MendConfig.from_file(path, **keys)`` starts from a TOML file.

    ``momentum_sync_period_steps`` (or ``second_moment_sync_period_steps``)
    given without ``desloc`` in the same source (the keywords here and to
    ``replace``, a file, the environment) turns DES-LOC on: averaging the
    inner Adam moments only happens with it. The rule is the C++ library's,
    the same for every front end.

    A keyword given as ``None`` counts as not given: the key keeps its value
    (default, file or environment), so ``checkpoint_dir=args.checkpoint_dir``
    with an argparse default of None leaves checkpoints off, not in ./None.

    A MendConfig is a plain value (it can be copied and pickled).

    Keys:
{keys}
    """

    def __init__(self, _file: str = "", **keys: Any) -> None:
        if not isinstance(_file, (str, os.PathLike)):
            raise TypeError(f"MendConfig: the positional argument is a TOML file's path, not "
                            f"{type(_file).__name__}"
                            + (" (MendConfig(**settings) makes one from a dict)" if isinstance(_file, dict) else ""))
        _file = os.fspath(_file)
        given = _given_texts(keys)
        self._values = _resolve(_file, given)
        self._typed = _typed(self._values)
        self._given = given
        self._file = _file

    @classmethod
    def from_file(cls, path: str, **keys: Any) -> "MendConfig":
        """The configuration of a TOML file (then the environment, then ``keys``)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"mend: no configuration file {path!r}")
        return cls(_file=path, **keys)

    def __getattr__(self, name: str) -> Any:
        typed = self.__dict__.get("_typed")
        if typed is None or name not in typed:
            raise AttributeError(f"MendConfig has no key {name!r}")
        return typed[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _KEYS:
            raise AttributeError(f"MendConfig is a value: use config.replace({name}=...) for another one")
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MendConfig) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def replace(self, **keys: Any) -> "MendConfig":
        """A copy with ``keys`` changed (checked as in the constructor; the
        environment is not read again)."""
        copy = MendConfig.__new__(MendConfig)
        given = dict(self._given)
        given.update(_given_texts(keys))
        # (The keywords given so far, over the values, as one source: the
        # rules that tie keys given together see them all.)
        copy._values = _resolve("", given, environment=False, base=self._values)
        copy._typed = _typed(copy._values)
        copy._given = given
        copy._file = self._file
        return copy

    def as_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in _KEYS}

    def to_toml(self) -> str:
        native = self.native()  # alive until the call returns
        return _native.take_string(lib.mend_config_to_toml, native.pointer)

    def native(self) -> NativeConfig:
        """A C handle holding these values (for the C ABI's calls)."""
        return NativeConfig(self._values)

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self._typed.items() if self._values[k] != _KEYS[k]["default"])
        return f"MendConfig({changed})"

    def __reduce__(self):
        return (_rebuild, (self._values, self._given, self._file))


def _rebuild(values: Dict[str, str], given: Dict[str, str], file: str) -> MendConfig:
    config = MendConfig.__new__(MendConfig)
    config._values, config._given, config._file = dict(values), dict(given), file
    config._typed = _typed(config._values)
    return config


_PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "enum": str}


def _typed(values: Dict[str, str]) -> Dict[str, Any]:
    """Every key's value as its Python type (parsed once, at construction)."""
    typed: Dict[str, Any] = {}
    for name, text in values.items():
        kind = _KEYS[name]["type"]
        typed[name] = text == "true" if kind == "bool" else _PYTHON_TYPES[kind](text)
    return typed


def stub() -> str:
    """The text of _config.pyi: MendConfig's keys with their types, from the
    key table (tests/python checks that the committed stub matches)."""
    lines = ['"""Type stub of mend._config, generated from the key table by mend._config.stub()."""',
             "from typing import Any, Dict, Optional", "", "", "class MendConfig:"]
    for name, row in _KEYS.items():
        lines.append(f"    {name}: {_PYTHON_TYPES[row['type']].__name__}")
    keywords = ", ".join(f"{name}: {_PYTHON_TYPES[row['type']].__name__} = ..." for name, row in _KEYS.items())
    lines += ["", f"    def __init__(self, _file: str = ..., *, {keywords}) -> None: ...",
              "    @classmethod",
              "    def from_file(cls, path: str, **keys: Any) -> MendConfig: ...",
              "    def replace(self, **keys: Any) -> MendConfig: ...",
              "    def as_dict(self) -> Dict[str, Any]: ...",
              "    def to_toml(self) -> str: ...",
              "    def __eq__(self, other: object) -> bool: ...",
              "    def __hash__(self) -> int: ...", ""]
    return "\n".join(lines)


MendConfig.__doc__ = MendConfig.__doc__.replace("{keys}", _key_doc())
