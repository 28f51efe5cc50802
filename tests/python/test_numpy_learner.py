"""mend without torch: mend.Learner over numpy arrays (the C ABI through
ctypes, nothing else)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_numpy_learners_without_torch_end_bit_identical():
    run = subprocess.run([sys.executable, os.path.join(HERE, "numpy_learners.py")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["errors"] == []
    assert seen["torch_loaded"] is False
    for stats in seen["stats"]:
        assert stats["rounds"] == 3 and stats["failed_rounds"] == 0 and stats["steps"] == 12
        # Synchronous over buffers in place: each round but the first (which
        # compares the states) made its pseudo-gradient as the merge reached it.
        assert stats["rounds_made_in_merge"] == 2
    assert seen["after_rounds"][0] == seen["after_rounds"][1]  # every round: the same parameters
    # Where the three rounds' time went, by phase; a round's wall time holds
    # its thread's phases (fp32: nothing encoded).
    for phases in seen["phases"]:
        assert set(phases) == {"snapshot", "join", "agree_or_heal", "encode", "transfer", "reduce", "outer_step",
                               "moments_and_buffers", "round"}
        assert all(seconds >= 0 for seconds in phases.values())
        assert phases["encode"] == 0
        assert phases["round"] > 0 and phases["snapshot"] > 0 and phases["outer_step"] > 0
        assert phases["round"] >= phases["join"] + phases["transfer"]
    assert seen["globals"][0] == seen["globals"][1]
    assert seen["state_bytes"] > 0
    assert seen["version"]


def test_a_bad_buffer_is_refused_by_name():
    import numpy as np
    import pytest

    import mend
    config = mend.MendConfig(lighthouse="127.0.0.1:1", log_level="warn")
    with pytest.raises(ValueError, match="'w' holds 'd' values"):
        mend.Learner(config, [("w", np.zeros(3))], "x", token="numpy-test-token-0123456789")
    with pytest.raises(ValueError, match="'w' is not C-contiguous"):
        mend.Learner(config, [("w", np.zeros((4, 4), np.float32).T)], "x", token="numpy-test-token-0123456789")
    shared = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="buffers 'a' and 'b' share memory"):
        mend.Learner(config, [("a", shared[:5]), ("b", shared[4:])], "x", token="numpy-test-token-0123456789")
    with pytest.raises(TypeError, match="mend.Learner: config must be a MendConfig, not dict"):
        mend.Learner({"lighthouse": "127.0.0.1:1"}, [("w", shared)], "x", token="numpy-test-token-0123456789")
    with pytest.raises(TypeError, match="mend.Lighthouse: config must be a MendConfig, not dict"):
        mend.Lighthouse({"bind": "127.0.0.1:0"}, token="numpy-test-token-0123456789")
    # The token's rule holds for a token given to the call as for MEND_JOB_TOKEN.
    with pytest.raises(mend.InvalidArgumentError, match="job token from the caller: 3 characters, need at least 8"):
        mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http=""), token="abc")
    with pytest.raises(mend.InvalidArgumentError, match="job token from the caller: 3 characters"):
        mend.Learner(config, [("w", shared)], "x", token="abc")
    with pytest.raises(TypeError, match="MendConfig: the positional argument is a TOML file's path, not dict"):
        mend.MendConfig({"lighthouse": "127.0.0.1:1"})
    frozen = np.zeros(3, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="'w' is read-only"):
        mend.Learner(config, [("w", frozen)], "x", token="numpy-test-token-0123456789")
    # A data-plane host that is no address of this host (TEST-NET-1), before
    # the lighthouse is asked (none listens at port 1).
    elsewhere = mend.MendConfig(lighthouse="127.0.0.1:1", dataplane_host="192.0.2.1", log_level="warn")
    with pytest.raises(mend.InvalidArgumentError, match='dataplane_host = "192.0.2.1": the data plane cannot listen'):
        mend.Learner(elsewhere, [("w", np.zeros(3, np.float32))], "x", token="numpy-test-token-0123456789")


def test_a_learner_with_another_round_schedule_is_refused_naming_the_key():
    import numpy as np
    import pytest

    import mend
    token = "numpy-test-token-0123456789"
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 log_level="warn"), token=token)
    try:
        def config(**keys):
            return mend.MendConfig(lighthouse=lighthouse.address, log_level="warn", **keys)

        first = mend.Learner(config(sync_period_steps=5), [("w", np.zeros(4, np.float32))], "a", token=token)
        try:
            with pytest.raises(mend.InvalidArgumentError,
                               match=r"sync_period_steps = 10 \(this job's learners have 5\)"):
                mend.Learner(config(sync_period_steps=10), [("w", np.zeros(4, np.float32))], "b", token=token)
            # A learner of another model is refused, both layouts named.
            with pytest.raises(mend.InvalidArgumentError,
                               match=r"parameters = 1 tensors, 5 values, shapes [0-9a-f]{16}: \[5\] \(this "
                                     r"job's learners have 1 tensors, 4 values, shapes [0-9a-f]{16}: \[4\]\)"):
                mend.Learner(config(sync_period_steps=5), [("w", np.zeros(5, np.float32))], "e", token=token)
            # Pacing may differ.
            paced = mend.Learner(config(sync_period_steps=5, concurrent_outer_step=False),
                                 [("w", np.zeros(4, np.float32))], "c", token=token)
            paced.shutdown()
        finally:
            first.shutdown()
    finally:
        lighthouse.shutdown()


def test_moments_of_another_size_and_bad_token_counts_are_refused_at_the_call():
    import numpy as np
    import pytest

    import mend
    token = "numpy-test-token-0123456789"
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", log_level="warn"), token=token)
    try:
        config = mend.MendConfig(lighthouse=lighthouse.address, log_level="warn", desloc=True)
        learner = mend.Learner(config, [("w", np.zeros(8, np.float32))], "a", token=token)
        try:
            # mend reads and writes 8 values through each moment: 2 would let
            # it write past the caller's memory.
            memory = np.ones(16, np.float32)
            with pytest.raises(ValueError, match="the first moment of 'w' holds 2 values; the buffer holds 8"):
                learner.set_moments(0, memory[:2], memory[8:])
            with pytest.raises(IndexError, match="no buffer 5"):
                learner.set_moments(5, memory[:8], memory[8:])
            learner.set_moments(0, memory[:8], memory[8:])
            with pytest.raises(ValueError, match=r"Learner.step: tokens = -1: must be in \[0, 2\^62\]"):
                learner.step(-1)
            with pytest.raises(ValueError, match="tokens = 1180591620717411303424"):
                learner.step(2 ** 70)
            with pytest.raises(TypeError, match="tokens must be an integer, got float 2.7"):
                learner.step(2.7)
            assert learner.stats()["steps"] == 0
        finally:
            learner.shutdown()
    finally:
        lighthouse.shutdown()


def test_a_group_rank_that_cannot_start_tells_the_other_rank_why():
    # Each rank of a two-rank learner, on a thread: the rank whose data plane
    # cannot listen (192.0.2.1 is no address of this host) is refused at
    # once; the other one learns that from it (through the lighthouse: rank
    # 0's group store goes with it), instead of waiting a minute
    # (quorum_timeout_ms) for a rank that will never come.
    import socket
    import threading

    import numpy as np

    import mend
    token = "numpy-test-token-0123456789"
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", log_level="error"), token=token) as lighthouse:
        for bad in (0, 1):
            base = mend.MendConfig(lighthouse=lighthouse.address, group_size=2, quorum_timeout_ms=60000,
                                   log_level="error")
            with socket.socket() as s:  # the port rank 0 serves the group's store on
                s.bind(("127.0.0.1", 0))
                store = f"127.0.0.1:{s.getsockname()[1]}"
            errors = {}

            def start(rank):
                config = base.replace(group_rank=rank, group_store=store, group_generation=bad,
                                      dataplane_host="192.0.2.1" if rank == bad else "127.0.0.1")
                try:
                    mend.Learner(config, [("w", np.zeros(4, np.float32))], "grouped", token=token).shutdown()
                except mend.MendError as error:
                    errors[rank] = error

            threads = [threading.Thread(target=start, args=(rank,)) for rank in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert sorted(errors) == [0, 1], errors
            assert isinstance(errors[bad], mend.InvalidArgumentError), errors
            assert 'dataplane_host = "192.0.2.1"' in str(errors[bad])
            other = errors[1 - bad]
            assert isinstance(other, mend.InvalidArgumentError), errors
            assert f"group rank {1 - bad}: group rank {bad} could not start: " in str(other)
            assert 'dataplane_host = "192.0.2.1"' in str(other)


def test_a_second_learner_of_the_same_id_in_one_process_is_refused_until_the_first_shuts_down():
    # The lighthouse would take the second for a restart of the first and
    # stop the first at its next round (two models' mend_init in one process,
    # both with the default HOST-PID id): refused here, at once, instead.
    import numpy as np
    import pytest

    import mend
    token = "numpy-test-token-0123456789"
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", log_level="error"), token=token) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, log_level="error")
        first = mend.Learner(config, [("w", np.zeros(4, np.float32))], "twice", token=token)
        try:
            with pytest.raises(mend.AlreadyExistsError,
                               match=r"learner 'twice' of job 'mend' \(lighthouse .*\) is already open in this "
                                     r"process, and not shut down"):
                mend.Learner(config, [("v", np.zeros(2, np.float32))], "twice", token=token)
            other = mend.Learner(config, [("w", np.zeros(4, np.float32))], "another", token=token)
            other.shutdown()
            assert first.stats()["steps"] == 0  # the first is untouched
        finally:
            first.shutdown()
        again = mend.Learner(config, [("w", np.zeros(4, np.float32))], "twice", token=token)
        again.shutdown()


def run_healed_forward(loop):
    """tests/python/healed_forward.py: learner b starts late and heals onto a's step."""
    run = subprocess.run([sys.executable, os.path.join(HERE, "healed_forward.py"), loop], capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["errors"] == [], seen["errors"]
    assert "healed from a: step 2 becomes the job's step 6" in run.stderr, run.stderr
    assert seen["stats"]["b"]["heals"] == 1
    return seen, run.stderr


def test_a_learner_healed_forward_ends_with_the_job_when_its_loop_stops_at_finished():
    seen, log = run_healed_forward("finished")
    # b took 2 steps, healed 4 forward, and took the job's 6 others: both end at
    # step 12 with the same model, and nothing is said of steps past the end.
    assert seen["iterations"] == {"a": 12, "b": 8}
    assert seen["stats"]["a"]["steps"] == seen["stats"]["b"]["steps"] == 12
    assert seen["finished_before"] == {"a": False, "b": False}
    assert seen["finished_after"] == {"a": True, "b": True}
    assert seen["final"]["a"] == seen["final"]["b"]
    assert "past the job's last step" not in log


def test_a_loop_of_its_own_count_past_the_jobs_end_is_told_why_and_what_to_do():
    seen, log = run_healed_forward("fixed")
    assert seen["iterations"] == {"a": 12, "b": 12}
    assert seen["stats"]["b"]["steps"] == 16  # (4 past the end)
    assert seen["final"]["a"] != seen["final"]["b"]  # b's own steps past the end
    assert ("learner 'b': step 13 is past the job's last step (total_steps = 12): rounds moved this learner 4 "
            "step(s) forward") in log
    assert "Learner.finished" in log
    assert "learner 'a': step 13" not in log


def test_a_streaming_learner_whose_peer_left_trains_on_instead_of_waiting_out_its_quorum_timeout():
    """Two fragments: a round of the next fragment launches only beside a
    join that formed, so the next boundary waits for the pending one. That
    wait gives up as the wait at boundary + tau does: with the only other
    learner gone (too few alive for the quorum), the join is trained on and
    later boundaries skipped, where every boundary waited out the quorum
    timeout (failed rounds, one per boundary)."""
    import numpy as np

    import mend
    token = "numpy-test-token-0123456789"
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 heartbeat_ms=100, heartbeat_timeout_ms=1000, log_level="warn"),
                                 token=token)
    try:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=8,
                                 fragments=2, total_steps=40, concurrent_outer_step=True, heartbeat_ms=100,
                                 heartbeat_timeout_ms=1000, quorum_timeout_ms=4000, log_level="warn")
        gone = mend.Learner(config, [("w", np.zeros(8, np.float32)), ("v", np.zeros(4, np.float32))], "gone",
                            token=token)
        buffers = [np.zeros(8, np.float32), np.zeros(4, np.float32)]
        left = mend.Learner(config, [("w", buffers[0]), ("v", buffers[1])], "left", token=token)
        gone.shutdown()  # (it leaves before any round)
        for _ in range(40):
            buffers[0] += np.float32(0.1)
            left.step(10)
        stats = left.stats()
        left.shutdown()
    finally:
        lighthouse.shutdown()
    assert stats["steps"] == 40
    assert stats["failed_rounds"] == 0, stats  # (each boundary's wait ran out before)
    assert stats["passed_over"] == 1 and stats["rounds_started"] == 1, stats
