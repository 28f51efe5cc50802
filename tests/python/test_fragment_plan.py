"""Staging by fragment: the C ABI tells a front end which fragments the next
step may read or write (Learner.step_fragments(FRAGMENTS_PLANNED) after
plan_step), and which ones the last call read and wrote. A step must touch
no fragment its plan left out, and a concurrent round's steps touch its own
fragment only; a heal, a synchronous round and a group's rounds plan every
fragment. A step planned to read without MAY_WRITE (a launch with nothing
in flight and no provisional step) must write nothing. mend.Learner over numpy arrays, learners on threads (the
step's own plan, at the driver, is checked on a fake clock in
tests/reducer/round_driver_clock_test.cc)."""
import os
import sys
import threading

import pytest

np = pytest.importorskip("numpy")

import mend  # noqa: E402
from mend._native import FRAGMENTS_PLANNED, FRAGMENTS_READ, FRAGMENTS_WROTE, STEP_MAY_WRITE, STEP_READS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import run_in_threads  # noqa: E402

TOKEN = "fragment-plan-test-token-0123456789"
SHAPES = [(16, 8), (8,), (8, 8), (8,), (24, 4), (4,), (4, 4), (4,)]  # 8 parameters: 2 per fragment of 4


class Seen:
    """What one learner's steps planned and did."""

    def __init__(self):
        self.missed = []         # (step, fragment) touched but not planned
        self.planned_one = 0     # steps that planned exactly one fragment
        self.planned_all = 0     # steps that planned every fragment
        self.touched_one = 0     # steps that read or wrote exactly one fragment
        self.wrote_many = 0      # steps that wrote more than one fragment
        self.only_reads = 0      # steps planned to read and not to write
        self.wrote_unplanned = []  # steps that wrote with no MAY_WRITE in their plan


def learn(learner, params, steps, seed, seen, before_step=None):
    rng = np.random.default_rng(seed)
    for step in range(1, steps + 1):
        if before_step is not None:
            before_step(step)
        for p in params:
            p += np.float32(0.01) * rng.standard_normal(p.shape).astype(np.float32)
        plan = learner.plan_step()
        reads = plan & STEP_READS
        planned = learner.step_fragments(FRAGMENTS_PLANNED)
        learner.step(16)
        read, wrote = learner.step_fragments(FRAGMENTS_READ), learner.step_fragments(FRAGMENTS_WROTE)
        touched = [r or w for r, w in zip(read, wrote)]
        if not reads:
            planned = [False] * len(planned)  # nothing to copy in: it must touch nothing
        seen.missed += [(step, f) for f, t in enumerate(touched) if t and not planned[f]]
        seen.planned_one += sum(planned) == 1
        seen.planned_all += all(planned)
        seen.touched_one += sum(touched) == 1
        seen.wrote_many += sum(wrote) > 1
        if reads and not plan & STEP_MAY_WRITE:
            seen.only_reads += 1
            if any(wrote):
                seen.wrote_unplanned.append(step)


def make_params(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def start_job(**keys):
    config = mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                             heartbeat_timeout_ms=2000, log_level="warn")
    lighthouse = mend.Lighthouse(config, token=TOKEN)
    return lighthouse, config.replace(lighthouse=lighthouse.address, **keys)


def new_learner(config, params, name):
    return mend.Learner(config, [(f"p{i}", p) for i, p in enumerate(params)], name, token=TOKEN)


@pytest.mark.parametrize("warm_up", [True, False])
def test_a_concurrent_round_plans_and_touches_its_own_fragment_only(warm_up):
    # outer_warmup_steps: the default (150: every round of these 40 steps
    # averages), or 0 (every launch takes the provisional step: it writes).
    lighthouse, config = start_job(fragments=4, sync_period_steps=8, concurrent_outer_step=True,
                                   overlap_steps=1, quorum_timeout_ms=20000,
                                   **({} if warm_up else {"outer_warmup_steps": 0}))
    params = [make_params(1), make_params(1)]
    learners = [new_learner(config, params[i], f"plan-{i}") for i in range(2)]
    assert [learners[0].parameter_fragment(i) for i in range(len(SHAPES))] == [0, 1, 2, 3, 0, 1, 2, 3]
    with pytest.raises(IndexError):
        learners[0].parameter_fragment(len(SHAPES))
    with pytest.raises(mend.MendError, match="unknown which 7"):
        learners[0].step_fragments(7)
    seen = [Seen(), Seen()]
    errors = run_in_threads(lambda i: learn(learners[i], params[i], 40, 10 + i, seen[i]), 2)
    assert not errors, errors
    stats = [learner.stats() for learner in learners]
    for learner in learners:
        learner.shutdown()
    lighthouse.shutdown()
    for s, st in zip(seen, stats):
        assert st["rounds"] >= 10 and st["heals"] == 0
        assert s.missed == []
        # Every boundary (20) launches its fragment's round, planned and
        # touched alone; one step later the round is taken up, touching that
        # fragment alone too (planned alone when the round had formed by then,
        # as round_driver_clock_test checks on a fake clock).
        assert s.planned_one >= st["rounds"]
        assert s.touched_one >= 2 * st["rounds"] - 2
        assert s.wrote_many == 0
        # In the outer warm-up no launch takes the provisional step, and each
        # finds nothing in flight (tau = 1): each only reads. Past it each writes.
        assert s.wrote_unplanned == []
        if warm_up:
            assert s.only_reads >= st["rounds"]
        else:
            assert s.only_reads == 0


def test_a_heal_and_a_synchronous_round_plan_every_fragment():
    # Synchronous: a round launched and taken up in one step, its outcome
    # (a heal?) unknown beforehand. A third learner with parameters of its
    # own joins late: its first round heals every fragment.
    lighthouse, config = start_job(fragments=2, sync_period_steps=4, concurrent_outer_step=False,
                                   quorum_timeout_ms=20000)
    params = [make_params(1), make_params(1), make_params(7)]
    learners = [new_learner(config, params[i], f"sync-{i}") for i in range(3)]
    seen = [Seen(), Seen(), Seen()]
    third_may_start = threading.Event()
    third_stats = []

    def work(i):
        if i == 2:
            assert third_may_start.wait(timeout=60), "the first learners never reached step 8"
            learn(learners[2], params[2], 16, 12, seen[2])
            third_stats.append(learners[2].stats())
            learners[2].shutdown()  # (the others' rounds do not wait for its joins)
            return
        learn(learners[i], params[i], 32, 10 + i, seen[i],
              before_step=lambda step: step == 8 and third_may_start.set())

    errors = run_in_threads(work, 3)
    assert not errors, errors
    for learner in learners[:2]:
        learner.shutdown()
    lighthouse.shutdown()
    for s in seen:
        assert s.missed == []
        assert s.planned_one == 0 and s.planned_all > 0
        assert s.only_reads == 0  # a synchronous round writes at its step
    assert third_stats[0]["heals"] >= 1
    assert seen[2].wrote_many >= 1  # the heal wrote both fragments
