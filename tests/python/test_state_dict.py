"""mend's outer state in a user's own checkpoint (runtime.state_dict() /
load_state_dict()), and the step a checkpoint is labelled with."""
import io
import json
import os
import struct

import pytest

torch = pytest.importorskip("torch")  # python3-torch

import mend  # noqa: E402
from job_threads import run_in_threads  # noqa: E402

TOKEN = "state-dict-test-token-0123456789"
PERIOD = 4


def batch(learner, step):
    generator = torch.Generator().manual_seed(1000 * learner + step)
    x = torch.randn(8, 4, generator=generator)
    return x, x.sum(1, keepdim=True) * (learner + 1)


def solo_lighthouse():
    """A lighthouse for jobs of one learner."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    return mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1, log_level="warn"))


def train_alone(model, runtime, steps):
    """`steps` manual steps of a learner alone, each moving every parameter."""
    for _ in range(steps):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        runtime.step(8)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def checkpoint_meta(path):
    data = path.read_bytes()
    assert data[:8] == b"MENDCKPT"
    (length,) = struct.unpack("<Q", data[12:20])
    return json.loads(data[20:20 + length])["meta"]


def run(lighthouse, until, save_at=0, saved=None):
    """Two learners (threads) of a synchronous job with outer Nesterov from
    the first round; returns each learner's parameters after every round
    (by step), and (with save_at) what each saved after that step."""
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=PERIOD,
                             concurrent_outer_step=False, outer_warmup_steps=0, heartbeat_ms=50,
                             heartbeat_timeout_ms=2000, log_level="warn")
    after_rounds = [{}, {}]
    checkpoints = [None, None]
    models, optimizers, runtimes = [], [], []
    for learner in range(2):
        torch.manual_seed(7)  # the same initial model
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        if saved is not None:
            state = torch.load(io.BytesIO(saved[learner]))
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        runtime = mend.mend_init(model, config, f"learner-{learner}", optimizer=optimizer)
        if saved is not None:
            runtime.load_state_dict(state["mend"])
        models.append(model)
        optimizers.append(optimizer)
        runtimes.append(runtime)

    def train(learner):
        model, optimizer, runtime = models[learner], optimizers[learner], runtimes[learner]
        while runtime.stats()["steps"] < until:
            step = runtime.stats()["steps"] + 1
            x, y = batch(learner, step)
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            runtime.report_tokens(8)
            optimizer.step()
            if step % PERIOD == 0:
                after_rounds[learner][step] = flat(model)
            if step == save_at:
                out = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "mend": runtime.state_dict()}, out)
                checkpoints[learner] = out.getvalue()

    errors = run_in_threads(train, 2)
    assert not errors, errors
    for model in models:
        mend.mend_shutdown(model)
    return after_rounds, checkpoints


def test_a_job_restored_from_users_checkpoints_goes_on_bit_identically():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        uninterrupted, saved = run(lighthouse, 16, save_at=10)  # mid-period: 2 steps after round 2
        restarted, _ = run(lighthouse, 16, saved=saved)
    for learner in range(2):
        assert sorted(restarted[learner]) == [12, 16]
        for step in (12, 16):
            assert torch.equal(restarted[learner][step], uninterrupted[learner][step]), (learner, step)
    assert torch.equal(uninterrupted[0][16], uninterrupted[1][16])


def test_a_state_dict_is_refused_by_a_checkpoint_file_and_by_load_of_anything_else(tmp_path):
    with solo_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, log_level="warn")
        model = torch.nn.Linear(2, 1)
        runtime = mend.mend_init(model, config, "refuser", manual=True)
        with pytest.raises(ValueError, match="runtime.state_dict"):
            runtime.load_state_dict({"weights": 1})
        path = tmp_path / "x.mend"
        runtime.save_checkpoint(str(path))
        with pytest.raises(mend.InvalidArgumentError, match="no learner's progress"):
            runtime.load_state_dict({"format": "mend outer state", "version": 1, "state": path.read_bytes()})
        mend.mend_shutdown(model)


def test_a_state_or_checkpoint_the_job_token_does_not_authenticate_is_refused(tmp_path):
    """With a job token, state_dict() and save_checkpoint() are authenticated
    (format version 2, an HMAC under a key from the token): a state altered
    after it was exported, or one exported without authentication, is
    refused; with checkpoint_authenticate=False the latter loads."""
    with solo_lighthouse() as lighthouse:
        def learner(name, **keys):
            config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, log_level="warn", **keys)
            model = torch.nn.Linear(4, 1)
            return model, mend.mend_init(model, config, name, manual=True)

        model, runtime = learner("writer")
        train_alone(model, runtime, 3)
        state = runtime.state_dict()
        path = tmp_path / "sealed.mend"
        runtime.save_checkpoint(str(path))
        mend.mend_shutdown(model)
        assert struct.unpack("<I", path.read_bytes()[8:12]) == (2,)
        assert struct.unpack("<I", state["state"][8:12]) == (2,)
        altered = bytearray(state["state"])
        altered[-41] ^= 1  # the last byte before the trailer (padding or data)
        model, runtime = learner("reader")
        with pytest.raises(mend.DataLossError, match="authentication failed"):
            runtime.load_state_dict(dict(state, state=bytes(altered)))
        runtime.load_state_dict(state)
        mend.mend_shutdown(model)

        model, runtime = learner("plain-writer", checkpoint_authenticate=False)
        train_alone(model, runtime, 3)
        plain = runtime.state_dict()
        mend.mend_shutdown(model)
        assert struct.unpack("<I", plain["state"][8:12]) == (1,)
        model, runtime = learner("reader-2")
        with pytest.raises(mend.DataLossError, match="not authenticated"):
            runtime.load_state_dict(plain)
        mend.mend_shutdown(model)
        model, runtime = learner("plain-reader", checkpoint_authenticate=False)
        runtime.load_state_dict(plain)
        mend.mend_shutdown(model)


def test_a_checkpoint_is_labelled_with_the_step_of_the_state_it_holds(tmp_path):
    with solo_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=10,
                                 concurrent_outer_step=False, log_level="warn")
        model = torch.nn.Linear(4, 1)
        runtime = mend.mend_init(model, config, "labeller", manual=True)
        train_alone(model, runtime, 35)
        path = tmp_path / "at-35.mend"
        runtime.save_checkpoint(str(path))
        global_state = runtime.global_state()
        mend.mend_shutdown(model)
        meta = checkpoint_meta(path)
        assert meta["step"] == 30 and meta["round_id"] == 3  # the round-30 state, not step 35
        resumed_model = torch.nn.Linear(4, 1)
        resumed = mend.mend_init(resumed_model, config, "labeller-2", manual=True)
        resumed.import_state(path.read_bytes())
        assert resumed.stats()["steps"] == 30
        assert torch.equal(flat(resumed_model), global_state)
        mend.mend_shutdown(resumed_model)


def test_resume_from_a_file_of_any_name_or_fail_naming_it(tmp_path):
    with solo_lighthouse() as lighthouse:
        keys = dict(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=5,
                    concurrent_outer_step=False, log_level="warn")
        model = torch.nn.Linear(4, 1)
        runtime = mend.mend_init(model, mend.MendConfig(**keys), "saver", manual=True)
        train_alone(model, runtime, 12)
        path = tmp_path / "my-run.pt.mend"
        runtime.save_checkpoint(str(path))
        global_state = runtime.global_state()
        mend.mend_shutdown(model)
        resumed_model = torch.nn.Linear(4, 1)
        resumed = mend.mend_init(resumed_model, mend.MendConfig(resume_from=str(path), **keys), "resumer",
                                 manual=True)
        assert resumed.stats()["steps"] == 10 and resumed.stats()["resumed_from_round"] == 2
        assert torch.equal(flat(resumed_model), global_state)
        mend.mend_shutdown(resumed_model)
        missing = tmp_path / "no-such.mend"
        with pytest.raises(mend.NotFoundError, match=f"resume_from = \"{missing}\""):
            mend.mend_init(torch.nn.Linear(4, 1), mend.MendConfig(resume_from=str(missing), **keys), "x")


def test_a_checkpoint_dir_without_checkpoints_but_other_files_is_warned_of(tmp_path, capfd):
    (tmp_path / "model.pt").write_bytes(b"not mend's")
    with solo_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, checkpoint_dir=str(tmp_path),
                                 log_level="warn")
        model = torch.nn.Linear(2, 1)
        mend.mend_init(model, config, "warned", manual=True)
        mend.mend_shutdown(model)
    err = capfd.readouterr().err
    assert "holds no checkpoint named ckpt-<round, 12 digits>.mend (it has model.pt)" in err
    assert "resume_from" in err


def test_a_checkpoint_dir_that_cannot_hold_checkpoints_is_an_error_at_mend_init(tmp_path):
    # Refused at the start, naming the key: not a job that believes it is
    # checkpointing while every checkpoint fails (logged at each round).
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with solo_lighthouse() as lighthouse:
        keys = dict(lighthouse=lighthouse.address, quorum_min_learners=1, checkpoint_every_rounds=1,
                    log_level="error")
        for where in (a_file, a_file / "sub"):
            with pytest.raises(mend.InvalidArgumentError, match=f"checkpoint_dir = \"{where}\": checkpoints "
                                                                "cannot be written there"):
                mend.mend_init(torch.nn.Linear(4, 1), mend.MendConfig(checkpoint_dir=str(where), **keys), "x")
        made = tmp_path / "new" / "sub"  # a missing one is made
        model = torch.nn.Linear(4, 1)
        mend.mend_init(model, mend.MendConfig(checkpoint_dir=str(made), **keys), "y")
        assert made.is_dir()
        mend.mend_shutdown(model)
