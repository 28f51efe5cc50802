"""heal_inner_optimizer with torch's AdamW: a learner that joins behind takes
its source's global state, Adam moments and step count, so that its next
optimizer step on the same batch is the source's, bit for bit; for learners
of one rank and of a group of two (threads of this process)."""
import os
import threading

import pytest
torch = pytest.importorskip("torch")

import mend
from job_threads import learner_state, run_in_threads, wait_for

TOKEN = "python-heal-optimizer-token-0123456789"
PERIOD = 4


def batch(learner, step):
    """Learner ``learner``'s batch at ``step``, from no generator: a group's
    ranks see the same batches, as DDP's replicas hold the same model."""
    x = torch.sin(torch.arange(16 * 8, dtype=torch.float32) * (0.37 * (learner + 1)) + step).reshape(16, 8)
    true_w = torch.arange(8, dtype=torch.float32).reshape(8, 1) / 8
    return x, x @ true_w + 0.1 * learner


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_learner_healed_with_its_sources_moments_takes_the_sources_next_step(ranks):
    # Learner 0 runs round 1 alone; learner 1 starts after it (behind) and
    # joins round 2, where it heals from learner 0 (at its step 8, learner
    # 1 at its step 4). Learner 0 joins round 2 once learner 1 waits in it.
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                         log_level="warn")) as lighthouse:
        base = dict(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=PERIOD,
                    concurrent_outer_step=False, heal_inner_optimizer=True, heartbeat_ms=50,
                    heartbeat_timeout_ms=2000, log_level="warn", dataplane_host="127.0.0.1")
        stores = []
        if ranks > 1:
            for _ in range(2):
                config = mend.MendConfig(**base, group_size=ranks)
                stores.append(mend.GroupStore(config, TOKEN, "127.0.0.1:0"))
        rounds_of_0 = [0]
        # Once a rank of learner 0 saw learner 1 waiting in round 2, the
        # round may form and learner 1 stop waiting: the other rank goes on.
        learner_1_waits = threading.Event()
        logs = {}

        def train(learner, rank):
            keys = dict(base)
            if ranks > 1:
                keys.update(group_size=ranks, group_rank=rank, group_store=stores[learner].address)
            config = mend.MendConfig(**keys)
            if learner == 1:
                assert wait_for(lambda: rounds_of_0[0] >= 1)
            model = torch.nn.Linear(8, 1)
            with torch.no_grad():
                model.weight.copy_(torch.linspace(-0.4, 0.4, 8).reshape(1, 8) * (learner + 1))
                model.bias.fill_(0.1 * learner)
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95))
            runtime = mend.mend_init(model, config, f"learner-{learner}", optimizer=optimizer, manual=True)
            finite = True

            def step(data_learner, s):
                nonlocal finite
                x, y = batch(data_learner, s)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                finite &= bool(torch.isfinite(loss))

            for s in range(1, (2 if learner == 0 else 1) * PERIOD + 1):
                if learner == 0 and s == 2 * PERIOD:
                    assert wait_for(lambda: learner_1_waits.is_set()
                                    or learner_state(lighthouse, "learner-1") == "waiting")
                    learner_1_waits.set()
                step(learner, s)
                runtime.step(16)
                if rank == 0 and learner == 0:
                    rounds_of_0[0] = runtime.stats()["rounds"]
            state = optimizer.state[model.weight]
            log = {"stats": runtime.stats(), "step": int(state["step"]), "finite": finite,
                   "exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone()}
            step(99, 0)  # the probe: the same batch everywhere
            log["probe"] = torch.cat([model.weight.detach().reshape(-1), model.bias.detach()])
            mend.mend_shutdown(model)
            logs[(learner, rank)] = log

        errors = run_in_threads(lambda i: train(i // ranks, i % ranks), 2 * ranks)
        for store in stores:
            store.stop()
        assert not errors, errors
    source = logs[(0, 0)]
    for (learner, rank), log in logs.items():
        who = f"learner {learner} rank {rank} of {ranks}"
        assert log["finite"], who
        assert log["stats"]["rounds"] == (2 if learner == 0 else 1), who
        assert log["stats"]["steps"] == 2 * PERIOD, who  # learner 1 took the job's step
        assert log["step"] == 2 * PERIOD, who  # the source's step count ...
        assert torch.equal(log["exp_avg"], source["exp_avg"]), who  # ... and moments
        assert torch.equal(log["exp_avg_sq"], source["exp_avg_sq"]), who
        assert torch.equal(log["probe"], source["probe"]), who  # so the same next step
        if learner == 1:
            assert log["stats"]["heals"] == 1, who
