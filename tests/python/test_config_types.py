"""MendConfig as a typed value: attributes of the key table's types, equality,
a repr of what differs from the defaults, and a stub that matches the table."""
import copy
import inspect
import os
import pickle

import pytest

import mend
from mend import _config

HERE = os.path.dirname(os.path.abspath(__file__))


def test_attributes_have_the_key_tables_types():
    config = mend.MendConfig(sync_period_steps=64, outer_lr=1.0, concurrent_outer_step=False, codec="int4")
    assert config.sync_period_steps == 64 and type(config.sync_period_steps) is int
    assert config.outer_lr == 1.0 and type(config.outer_lr) is float
    assert config.concurrent_outer_step is False
    assert config.codec == "int4"
    for name, row in _config._KEYS.items():
        assert type(getattr(config, name)).__name__ == {"enum": "str"}.get(row["type"], row["type"]), name
    with pytest.raises(AttributeError, match="replace"):
        config.outer_lr = 2.0


def test_equality_repr_copies_and_replace():
    a = mend.MendConfig(sync_period_steps=64, outer_lr=1.0)
    assert a == mend.MendConfig(outer_lr=1.0, sync_period_steps=64)
    assert a != mend.MendConfig(sync_period_steps=65, outer_lr=1.0)
    assert repr(a) == "MendConfig(sync_period_steps=64, outer_lr=1.0)"
    assert copy.deepcopy(a) == a and pickle.loads(pickle.dumps(a)) == a
    b = a.replace(codec="bf16")
    assert b.codec == "bf16" and a.codec == "fp32" and b.sync_period_steps == 64
    with pytest.raises(ValueError, match="grace_window_ms"):
        a.replace(grace_window_ms=-1)
    assert len({a, mend.MendConfig(outer_lr=1.0, sync_period_steps=64)}) == 1
    # A moment period turns DES-LOC on in replace() as in the constructor,
    # unless desloc was given.
    assert a.replace(momentum_sync_period_steps=128).desloc is True
    assert mend.MendConfig(desloc=False).replace(momentum_sync_period_steps=200).desloc is False


def test_a_moment_period_turns_desloc_on_by_the_libraries_rule_in_every_source(tmp_path, monkeypatch):
    # The rule is the C++ check's: a file and the environment follow it as
    # the keywords do (mend has no Python rule of its own).
    path = tmp_path / "job.toml"
    path.write_text("momentum_sync_period_steps = 300\n")
    assert mend.MendConfig.from_file(str(path)).desloc is True
    path.write_text("momentum_sync_period_steps = 300\ndesloc = false\n")
    assert mend.MendConfig.from_file(str(path)).desloc is False
    assert mend.MendConfig.from_file(str(path), second_moment_sync_period_steps=600).desloc is True
    monkeypatch.setenv("MEND_SECOND_MOMENT_SYNC_PERIOD_STEPS", "600")
    assert mend.MendConfig().desloc is True
    assert mend.MendConfig(desloc=False).desloc is False


def test_the_stub_matches_the_key_table():
    with open(os.path.join(HERE, "..", "..", "python", "mend", "_config.pyi")) as f:
        assert f.read() == _config.stub(), "regenerate python/mend/_config.pyi with mend._config.stub()"
    assert os.path.exists(os.path.join(HERE, "..", "..", "python", "mend", "py.typed"))


def test_help_lists_every_key_with_its_default_and_range_as_written():
    text = mend.MendConfig.__doc__
    for name in _config._KEYS:
        assert f"    {name} (" in text, name
    assert "heartbeat_timeout_ms (int, default 2000 [20, 3600000])" in text  # not 3.6e+06
    assert "outer_lr (float, default 0.7 [0, 100])" in text
    assert "job_id (str, default 'mend')" in text
    assert "codec (enum, default fp32 (fp32 | bf16 | int8 | int4 | topk))" in text


def test_a_config_is_built_and_read_in_one_call_each(monkeypatch):
    # Every key in one mend_config_set_json call and out in one
    # mend_config_to_json call: never a call per key.
    calls = {}
    for name in ("mend_config_set", "mend_config_get", "mend_config_set_json", "mend_config_to_json"):
        real = getattr(_config.lib, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args)

        monkeypatch.setattr(_config.lib, name, counted)
    config = mend.MendConfig(sync_period_steps=64, outer_lr=1.0, codec="int8")
    config.native()
    assert calls == {"mend_config_set_json": 2, "mend_config_to_json": 1}
    with pytest.raises(ValueError, match="keyword outer_lr"):
        mend.MendConfig(outer_lr=-1.0)


def test_replaced_keys_say_what_to_set_instead():
    # udp_control and control_transport became control_plane: the old names
    # are refused with libmend's message, not as unknown keywords.
    for old in ("udp_control", "control_transport"):
        with pytest.raises(ValueError, match="replaced by control_plane"):
            mend.MendConfig(**{old: "udp"})
    with pytest.raises(TypeError, match="did you mean 'control_plane'"):
        mend.MendConfig(control_plan="udp")
    assert mend.MendConfig(control_plane="udp").control_plane == "udp"


def test_a_keyword_of_none_is_not_given():
    # An argparse default of None leaves the key as it was: checkpoints off,
    # not in a directory named "None".
    config = mend.MendConfig(checkpoint_dir=None, rack=None, sync_period_steps=None)
    assert config.checkpoint_dir == "" and config.rack == ""
    assert config.sync_period_steps == mend.MendConfig().sync_period_steps
    assert config.replace(checkpoint_dir="ckpt").replace(rack=None).checkpoint_dir == "ckpt"


def test_mend_init_has_the_explicit_signature_of_the_torch_front_end():
    # help(mend.mend_init) shows what it takes, not (*args, **kwargs), and
    # that is the signature of the function it calls.
    torch_front_end = pytest.importorskip("mend._torch")
    ours = inspect.signature(mend.mend_init)
    theirs = inspect.signature(torch_front_end.mend_init)
    assert list(ours.parameters) == ["model", "config", "rank_id", "optimizer", "manual", "scaler"]
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]
