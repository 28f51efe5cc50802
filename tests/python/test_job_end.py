"""After the job's end: a learner restarted once the others finished and left
does not train a new job alone. The lighthouse remembers the job's final
round; the restarted learner, holding none of its state, is told the job
finished (mend.OutOfRangeError at its first boundary, naming the final
round) unless it resumes from the final round's checkpoint, where it holds
the job's final model and has nothing left to train. The same learners
started together again (a new run of the job) are not refused."""
import os

import pytest
torch = pytest.importorskip("torch")

import mend
from job_threads import run_in_threads

TOKEN = "python-job-end-token-0123456789"
PERIOD, TOTAL = 5, 10


def model_of(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 1)


def lighthouse():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    return mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1, heartbeat_ms=50,
                                           heartbeat_timeout_ms=2000, grace_window_ms=20000,
                                           grace_window_adaptive=False, log_level="error"))


def config_for(house, **keys):
    return mend.MendConfig(lighthouse=house.address, quorum_min_learners=1, sync_period_steps=PERIOD,
                           total_steps=TOTAL, concurrent_outer_step=False,
                           quorum_timeout_ms=4000, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                           log_level="error", dataplane_host="127.0.0.1", **keys)


def train(model, runtime, seed):
    """The loop of docs/python.md, to the job's end by its count."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(seed)
    while not runtime.finished:
        x = torch.randn(16, 8, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def run_job(house, keys, ids=("a", "b")):
    """Learners `ids` train the whole job together; their final models."""
    models = [model_of() for _ in ids]

    def learn(i):
        runtime = mend.mend_init(models[i], config_for(house, **keys), ids[i])
        train(models[i], runtime, seed=i + 1)
        mend.mend_shutdown(models[i])

    errors = run_in_threads(learn, len(ids))
    assert not errors, errors
    for model in models[1:]:
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), models[0].parameters()))
    return models


def test_a_learner_restarted_after_the_job_finished_is_told_so_and_trains_no_job_alone():
    with lighthouse() as house:
        finished = run_job(house, {})
        restarted = model_of()
        runtime = mend.mend_init(restarted, config_for(house), "b")  # (its process was restarted)
        with pytest.raises(mend.OutOfRangeError) as told:
            train(restarted, runtime, seed=3)
        message = str(told.value)
        assert "the job finished at step 10" in message, message
        assert "it would train a new job alone, so it stops instead" in message, message
        stats = runtime.stats()
        assert stats["rounds"] == 0 and stats["steps"] == PERIOD, stats  # (no round of its own, ever)
        mend.mend_shutdown(restarted)  # leaves (the job's end it never reached is not claimed)
        assert not all(torch.equal(p, q) for p, q in zip(restarted.parameters(), finished[0].parameters()))


def test_a_learner_restarted_after_the_job_finished_takes_its_final_model_from_the_checkpoint(tmp_path):
    keys = dict(checkpoint_dir=str(tmp_path), checkpoint_every_rounds=1000, resume=True)
    with lighthouse() as house:
        finished = run_job(house, keys)
        restarted = model_of(7)
        runtime = mend.mend_init(restarted, config_for(house, **keys), "b")
        assert runtime.finished and runtime.stats()["steps"] == TOTAL
        train(restarted, runtime, seed=3)  # (nothing to train)
        mend.mend_shutdown(restarted)
        # A loop that checks runtime.finished only after a step (docs/python.md's) takes one
        # past the end: that step is dropped, and the learner ends with the final model too.
        again = model_of(8)
        runtime = mend.mend_init(again, config_for(house, **keys), "b")
        optimizer = torch.optim.SGD(again.parameters(), lr=0.05)
        again(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        assert runtime.finished and runtime.stats()["steps"] == TOTAL + 1
        mend.mend_shutdown(again)
    for model in (restarted, again):
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), finished[0].parameters()))


def test_the_learners_of_a_finished_job_started_together_again_run_it_again():
    with lighthouse() as house:
        run_job(house, {})
        again = run_job(house, {})  # the same ids, started together: a new run, not refused
        assert all(torch.isfinite(p).all() for p in again[0].parameters())
