"""Mixed precision: a step that a GradScaler skipped (inf or NaN gradients:
the parameters stay as they were) is still an inner step for mend when mend
knows the scaler (``scaler=``, or the one inside an Accelerate optimizer),
so boundaries stay at the same iterations on every learner, but it counts
no tokens. Learners that skip different steps meet at every round's
boundary and leave it bit-identical; the merge weighs them by the tokens of
the steps that moved their models. Without the scaler mend never sees the
skipped step. torch >= 2.3: torch.amp.GradScaler("cpu")."""
import copy
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
    pytest.skip("this torch has no device-generic torch.amp.GradScaler", allow_module_level=True)

import mend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import train_then_leave  # noqa: E402

TOKEN = "amp-test-token-0123456789"


def cpu_scaler():
    try:
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    except (RuntimeError, TypeError) as error:  # (a torch whose CPU has no GradScaler)
        pytest.skip(f"no CPU GradScaler here: {error}")


def lighthouse():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    return mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                           heartbeat_timeout_ms=2000, log_level="warn"))


def job_config(address, period):
    # outer lr 1, no momentum: a round's result is the token-weighted mean of the learners' models.
    return mend.MendConfig(lighthouse=address, quorum_min_learners=2, sync_period_steps=period,
                           concurrent_outer_step=False, outer_lr=1.0, outer_momentum=0.0, heartbeat_ms=50,
                           heartbeat_timeout_ms=2000, log_level="warn")


def batch(learner, iteration, rows):
    """Token ids (rows x 5) and their regression target."""
    generator = torch.Generator().manual_seed(100 * learner + iteration)
    ids = torch.randint(0, 16, (rows, 5), generator=generator)
    return ids, ids.float().sum(1, keepdim=True) / 40


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(16, 4)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, ids):
        return self.out(self.embed(ids))


def learners(seed, lr):
    """The start and two learners' copies of it, each with SGD and a CPU GradScaler."""
    torch.manual_seed(seed)
    start = Model()
    models = [copy.deepcopy(start) for _ in range(2)]
    return start, models, [torch.optim.SGD(m.parameters(), lr=lr) for m in models], [cpu_scaler() for _ in models]


def iteration(model, optimizer, scaler, ids, target, poisoned):
    """One AMP iteration; a poisoned one has an infinite loss, so the scaler skips its step."""
    loss = (model(ids) - target).pow(2).mean()
    if poisoned:
        loss = loss * float("inf")
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_learners_that_skip_different_steps_meet_at_every_round_bit_identically():
    period, rounds = 3, 3
    skips = ({1}, {3, 4, 5, 7})  # by iteration, per learner (learner 1 skips every step of round 2: weight 0)
    after = [{}, {}]
    with lighthouse() as house:
        _, models, optimizers, scalers = learners(5, 0.1)
        for i in range(2):
            mend.mend_init(models[i], job_config(house.address, period), f"amp-{i}", optimizer=optimizers[i],
                           scaler=scalers[i])

        def learn(i):
            runtime = mend.get_runtime(models[i])
            for n in range(period * rounds):
                before = flat(models[i])
                iteration(models[i], optimizers[i], scalers[i], *batch(i, n, 4), poisoned=n in skips[i])
                steps = runtime.stats()["steps"]
                assert steps == n + 1, (i, n, steps)  # a skipped step is a step
                if n in skips[i] and steps % period:
                    assert torch.equal(flat(models[i]), before)  # (and moved nothing)
                if steps % period == 0:
                    after[i][steps] = flat(models[i])

        stats = train_then_leave(models, learn)
    for i in range(2):
        assert stats[i]["skipped_steps"] == len(skips[i])
        assert stats[i]["rounds"] == rounds
        assert stats[i]["tokens"] == (period * rounds - len(skips[i])) * 4 * 5
        assert sorted(after[i]) == [period * r for r in range(1, rounds + 1)]
    for step in after[0]:
        assert torch.equal(after[0][step], after[1][step]), step


def test_a_skipped_step_counts_no_tokens_in_the_merge():
    # One round of two steps each: learner 0 skips a step of a 20-row batch
    # and takes one of 2 rows; learner 1 takes steps of 6 and 3 rows. The
    # round weighs them 2:9 (the skipped batch moved nothing), not 22:9.
    rows = ((20, 2), (6, 3))
    with lighthouse() as house:
        start, models, optimizers, scalers = learners(9, 0.5)

        def steps(i, model, optimizer, scaler):
            for n, count in enumerate(rows[i]):
                iteration(model, optimizer, scaler, *batch(i, n, count), poisoned=(i, n) == (0, 0))

        alone = []  # what each learner's steps do without mend: the same scaler arithmetic
        for i in range(2):
            model = copy.deepcopy(start)
            steps(i, model, torch.optim.SGD(model.parameters(), lr=0.5), cpu_scaler())
            alone.append(flat(model))
        for i in range(2):
            mend.mend_init(models[i], job_config(house.address, 2), f"amp-tokens-{i}", optimizer=optimizers[i],
                           scaler=scalers[i])
        stats = train_then_leave(models, lambda i: steps(i, models[i], optimizers[i], scalers[i]))
    assert [s["rounds"] for s in stats] == [1, 1]
    assert [s["skipped_steps"] for s in stats] == [1, 0]
    assert [s["tokens"] for s in stats] == [2 * 5, 9 * 5]
    expected = (2 * alone[0] + 9 * alone[1]) / 11
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert torch.allclose(flat(models[0]), expected, rtol=0, atol=1e-6), (flat(models[0]) - expected).abs().max()


def test_without_the_scaler_mend_does_not_see_a_skipped_step():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                         log_level="warn")) as house:
        model = Model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = cpu_scaler()
        config = mend.MendConfig(lighthouse=house.address, quorum_min_learners=1, sync_period_steps=100,
                                 log_level="warn")
        runtime = mend.mend_init(model, config, "amp-untold", optimizer=optimizer)
        try:
            iteration(model, optimizer, scaler, *batch(0, 0, 3), poisoned=True)
            iteration(model, optimizer, scaler, *batch(0, 1, 2), poisoned=False)
            stats = runtime.stats()
        finally:
            mend.mend_shutdown(model)
    # One step seen, with both forwards' tokens.
    assert (stats["steps"], stats["skipped_steps"], stats["tokens"]) == (1, 0, (3 + 2) * 5)


def test_an_accelerate_optimizer_brings_its_scaler_and_manual_mode_refuses_one():
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Wrapper(torch.optim.Optimizer):  # what Accelerate's AcceleratedOptimizer holds
        def __init__(self, inner, scaler):
            self.optimizer, self.scaler = inner, scaler

    scaler = cpu_scaler()
    inner, found = mend._attach.unwrap_optimizer(Wrapper(optimizer, scaler))
    assert inner is optimizer and found is scaler
    assert mend._attach.unwrap_optimizer(optimizer) == (optimizer, None)
    with pytest.raises(ValueError, match="scaler= with manual=True"):
        mend.mend_init(model, mend.MendConfig(), manual=True, scaler=scaler)
