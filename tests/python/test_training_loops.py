"""mend in the training loops people write: LR schedulers in either order,
copies of the model (deepcopy, torch.save, AveragedModel), manual stepping,
hand-written updates, statistics after shutdown. One learner in a job of
one, in this process."""
import copy
import gc
import io
import os
import warnings

import pytest

torch = pytest.importorskip("torch")  # python3-torch

import mend  # noqa: E402
from job_threads import run_in_threads  # noqa: E402
from mend import _attach  # noqa: E402

TOKEN = "loops-test-token-0123456789"


@pytest.fixture()
def lighthouse():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lh:
        yield lh


def job(lighthouse, period=5, **keys):
    return mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=period,
                           concurrent_outer_step=False, log_level="warn", **keys)


def train(model, optimizer, steps, scheduler=None):
    generator = torch.Generator().manual_seed(3)
    runtime = mend.get_runtime(model)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=generator)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        runtime.report_tokens(x.shape[0])  # float inputs: nothing to count
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


@pytest.mark.parametrize("scheduler_first", [True, False])
def test_an_lr_scheduler_works_in_either_order_without_warnings(lighthouse, scheduler_first):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "optimizer.step() has been overridden" included
        if scheduler_first:
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
            runtime = mend.mend_init(model, job(lighthouse), "sched-first")
        else:
            runtime = mend.mend_init(model, job(lighthouse), "sched-after")
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        train(model, optimizer, 10, scheduler)
        stats = runtime.stats()
        mend.mend_shutdown(model)
    assert stats["steps"] == 10 and stats["rounds"] == 2  # each optimizer step is one inner step
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 5)


def test_copies_of_the_model_carry_no_runtime(lighthouse):
    from torch.optim.swa_utils import AveragedModel
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    runtime = mend.mend_init(model, job(lighthouse), "copies")
    train(model, optimizer, 3)
    gc.collect()
    runtimes_before = sum(isinstance(o, mend.Runtime) for o in gc.get_objects())
    twin = copy.deepcopy(model)
    averaged = AveragedModel(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)  # a whole pickled model (torch >= 2.6 defaults to True)
    gc.collect()
    assert sum(isinstance(o, mend.Runtime) for o in gc.get_objects()) == runtimes_before  # the copies made none
    for other in (twin, averaged, loaded):
        assert mend.get_runtime(other) is None
        assert all(getattr(h, "_runtime", None) is None for h in other._forward_pre_hooks.values())
        other(torch.randn(2, 4))  # its (inert) hooks run
        for a, b in zip(model.state_dict().values(), other.state_dict().values() if other is not averaged
                        else averaged.module.state_dict().values()):
            assert torch.equal(a, b)
    train(model, optimizer, 7)  # the original goes on: 10 steps, 2 rounds
    stats = runtime.stats()
    mend.mend_shutdown(model)
    assert stats["steps"] == 10 and stats["rounds"] == 2


def test_runtime_step_is_the_only_step_in_manual_mode(lighthouse):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    automatic = mend.mend_init(model, job(lighthouse), "automatic")
    with pytest.raises(mend.FailedPreconditionError, match="count the step twice"):
        automatic.step(8)
    mend.mend_shutdown(model)
    runtime = mend.mend_init(model, job(lighthouse), "manual", manual=True)
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        x = torch.randn(8, 4, generator=generator)
        loss = (model(x) - 1).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # not wrapped
        runtime.step(8)
    stats = runtime.stats()
    mend.mend_shutdown(model)
    assert stats["steps"] == 20 and stats["rounds"] == 4


def test_a_hand_written_update_does_not_scan_the_heap_on_every_forward(lighthouse, monkeypatch):
    calls = []
    real = _attach.find_optimizer
    monkeypatch.setattr(_attach, "find_optimizer", lambda parameters: calls.append(1) or real(parameters))
    model = torch.nn.Linear(4, 1)
    runtime = mend.mend_init(model, job(lighthouse), "by-hand", manual=True)
    for _ in range(50):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        runtime.step(8)
    mend.mend_shutdown(model)
    assert calls == []  # manual: never looked for
    automatic = mend.mend_init(model, job(lighthouse), "by-hand-auto")
    with warnings.catch_warnings(record=True):
        for _ in range(120):
            model(torch.randn(8, 4))
    mend.mend_shutdown(model)
    # At mend_init; on torch 1.13 (no step hooks) at the first 8 training
    # forwards and then at the 16th, 32nd and 64th, since no optimizer came.
    hooks = hasattr(torch.optim.Optimizer, "register_step_post_hook")
    assert len(calls) == (1 if hooks else 1 + 8 + 3)
    del automatic


def test_an_optimizer_made_after_a_training_forward_is_still_found(lighthouse):
    # A forward before the optimizer exists (a shape check) must not make
    # mend miss it: on torch 1.13 it is looked for at later forwards too.
    model = torch.nn.Linear(4, 1)
    runtime = mend.mend_init(model, job(lighthouse), "late-optimizer")
    model(torch.randn(2, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        loss = model(torch.randint(0, 3, (8, 4)).float()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stats = runtime.stats()
    mend.mend_shutdown(model)
    assert stats["steps"] == 10 and stats["rounds"] == 2
    gc.collect()


def test_stats_after_shutdown_are_the_final_ones(lighthouse):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runtime = mend.mend_init(model, job(lighthouse), "final-stats")
    train(model, optimizer, 10)
    global_state = runtime.global_state()
    mend.mend_shutdown(model)
    stats = runtime.stats()
    assert stats["steps"] == 10 and stats["rounds"] == 2
    assert isinstance(global_state, torch.Tensor) and global_state.dtype == torch.float32
    assert torch.equal(global_state, runtime.global_state())
    assert global_state.numel() == 5
    # A step's tokens given after shutdown would count nowhere: an error, not silence.
    with pytest.raises(mend.FailedPreconditionError, match=r"report_tokens\(\) after mend_shutdown"):
        runtime.report_tokens(8)


def test_an_unreachable_lighthouse_is_an_error_at_mend_init():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    config = mend.MendConfig(lighthouse="127.0.0.1:1", lighthouse_wait_ms=300, log_level="error")
    with pytest.raises(mend.UnavailableError, match=r"lighthouse at 127\.0\.0\.1:1 did not answer within "
                                                    r"lighthouse_wait_ms = 300"):
        mend.mend_init(torch.nn.Linear(2, 1), config, "nobody-home")
    assert mend.MendConfig().lighthouse_wait_ms == 30000  # the default: learners may start a little early


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 1)
        # Derived, not trained (like a rotary embedding's inv_freq): no checkpoint holds it.
        self.register_buffer("cache", torch.zeros(8), persistent=False)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.linear(x))))


@pytest.mark.parametrize("sync_buffers", [True, False])
def test_batchnorm_statistics_are_the_same_on_every_learner_after_a_round(sync_buffers):
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lh:
        config = mend.MendConfig(lighthouse=lh.address, quorum_min_learners=2, sync_period_steps=5,
                                 concurrent_outer_step=False, sync_buffers=sync_buffers, heartbeat_ms=50,
                                 heartbeat_timeout_ms=2000, log_level="warn")
        models = []
        for learner in range(2):
            torch.manual_seed(1)
            models.append(Net())
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
        runtimes = [mend.mend_init(m, config, f"bn-{i}", optimizer=o) for i, (m, o) in enumerate(zip(models, optimizers))]
        for i, m in enumerate(models):
            m.cache.fill_(i)

        def learn(i):
            generator = torch.Generator().manual_seed(20 + i)
            for _ in range(10):
                x = torch.randn(16, 4, generator=generator) * (i + 1) + i  # different statistics
                loss = (models[i](x) - 1).pow(2).mean()
                optimizers[i].zero_grad()
                loss.backward()
                runtimes[i].report_tokens(16)
                optimizers[i].step()

        errors = run_in_threads(learn, 2)
        assert not errors, errors
        for m in models:
            mend.mend_shutdown(m)
    a, b = (dict(m.named_buffers()) for m in models)
    assert a["norm.num_batches_tracked"].item() == 10
    same = all(torch.equal(a[name], b[name]) for name in ("norm.running_mean", "norm.running_var"))
    assert same == sync_buffers
    # A non-persistent buffer is each learner's own: never averaged.
    assert [m.cache.tolist() for m in models] == [[0.0] * 8, [1.0] * 8]
    if sync_buffers:
        for m in models:
            m.eval()
        x = torch.randn(32, 4)
        assert torch.equal(models[0](x), models[1](x))


@pytest.mark.parametrize("concurrent", [True, False])
def test_a_job_of_known_length_ends_with_one_merged_model(tmp_path, concurrent):
    """total_steps = 40, H = 10: concurrent mode launches no round in the last
    fragment period, so without the final merge each learner ends with its
    own parameters; with it every learner holds the same model after
    mend_shutdown, and the checkpoint written at the end holds it too."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lh:
        config = mend.MendConfig(lighthouse=lh.address, quorum_min_learners=2, sync_period_steps=10,
                                 total_steps=40 if concurrent else 43, concurrent_outer_step=concurrent,
                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn",
                                 checkpoint_dir=str(tmp_path), checkpoint_every_rounds=1000)
        models = []
        for _ in range(2):
            torch.manual_seed(1)
            models.append(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
        optimizers = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
        for i, (m, o) in enumerate(zip(models, optimizers)):
            mend.mend_init(m, config, f"final-{i}", optimizer=o)

        def learn(i):
            generator = torch.Generator().manual_seed(40 + i)
            for _ in range(config.total_steps):
                x = torch.randn(16, 4, generator=generator) + i
                loss = (models[i](x) - x.sum(1, keepdim=True)).pow(2).mean()
                optimizers[i].zero_grad()
                loss.backward()
                mend.get_runtime(models[i]).report_tokens(16)
                optimizers[i].step()
            mend.mend_shutdown(models[i])  # the final merge: every learner takes part

        errors = run_in_threads(learn, 2)
        assert not errors, errors
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b)
        stats = mend.get_runtime(models[0]).stats()
        assert stats["steps"] == config.total_steps
        assert stats["failed_rounds"] == 0
        # The checkpoint at the end: a new learner resumed from it starts with the merged model.
        written = sorted(tmp_path.glob("ckpt-*.mend"))
        assert len(written) == 1, written
        torch.manual_seed(2)
        fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        runtime = mend.mend_init(fresh, config.replace(resume_from=str(written[0]), checkpoint_dir=""), "final-2")
        assert runtime.stats()["steps"] == config.total_steps
        for a, b in zip(models[0].parameters(), fresh.parameters()):
            assert torch.equal(a, b)
        mend.mend_shutdown(fresh)
