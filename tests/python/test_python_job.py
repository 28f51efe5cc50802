"""The Python module end to end: MendConfig's keys and errors, an embedded
lighthouse, and a two-learner job of separate Python processes."""
import json
import os
import subprocess
import sys

import pytest
torch = pytest.importorskip("torch")  # python3-torch; the torch-less tests are the numpy ones

import mend
from job_processes import child_pythonpath, free_port
from job_threads import assert_same_moments

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "python-test-token-0123456789"


def test_quickstart_keywords_are_accepted():
    config = mend.MendConfig(
        quorum_min_learners=4, grace_window_ms=2000, token_weighted_merge=True,
        sync_period_steps=128, momentum_sync_period_steps=512, concurrent_outer_step=True,
        failslow_zscore_threshold=3.0, failslow_window_steps=50, rack_aware=True,
        diagnostics_dir="./results/mend_diag")
    assert config.quorum_min_learners == 4
    assert config.token_weighted_merge is True
    assert config.failslow_zscore_threshold == 3.0
    assert config.desloc is True  # momentum_sync_period_steps turns DES-LOC on
    assert mend.MendConfig(sideband_heartbeat_ms=250).heartbeat_ms == 250
    assert mend.MendConfig(total_steps=1000).total_steps == 1000  # README's quick start
    with pytest.raises(ValueError, match="total_steps"):
        mend.MendConfig(total_steps=-1)


def test_config_errors_name_the_key():
    with pytest.raises(TypeError, match="did you mean 'grace_window_ms'"):
        mend.MendConfig(grace_window=5)
    with pytest.raises(ValueError, match=r'grace_window_ms = "-5".*\[0, 600000\]'):
        mend.MendConfig(grace_window_ms=-5)
    with pytest.raises(ValueError, match="CUDA"):
        mend.MendConfig(async_tp_enabled=True)
    with pytest.raises(ValueError, match="lighthouse"):
        mend.MendConfig(sideband_addr="10.0.0.1:1234")
    assert "grace_window_ms" in mend.MendConfig.__doc__


def test_config_from_file_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "job.toml"
    path.write_text("sync_period_steps = 77\nheartbeat_ms = 300\n")
    monkeypatch.setenv("MEND_HEARTBEAT_MS", "400")
    config = mend.MendConfig.from_file(str(path), grace_window_ms=1234)
    assert config.sync_period_steps == 77   # file
    assert config.heartbeat_ms == 400       # environment beats the file
    assert config.grace_window_ms == 1234   # keywords beat both


def embedded_lighthouse():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    return mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                           grace_window_ms=2000, heartbeat_ms=50,
                                           heartbeat_timeout_ms=2000, log_level="warn"))


def run_learners(tmp_path, address, extra=()):
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)
    procs, outs = [], []
    for i, name in enumerate(["learner-a", "learner-b"]):
        out = tmp_path / f"{name}.json"
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "learner.py"), "--lighthouse", address,
             "--id", name, "--seed", str(i + 1), "--out", str(out), *extra[i]],
            env=env))
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return [json.loads(out.read_text()) for out in outs]


def test_a_float_input_model_counts_a_step_as_one_token(tmp_path):
    # The forward gets no integer tensor and nobody reports tokens: the
    # rounds still merge (weighted by steps) instead of failing on weights
    # that sum to 0.
    with embedded_lighthouse() as lighthouse:
        a, b = run_learners(tmp_path, lighthouse.address, (["--one-hot"], ["--one-hot"]))
    for seen in (a, b):
        assert seen["stats"]["rounds"] == 8
        assert seen["stats"]["failed_rounds"] == 0
        assert seen["loss_after"] < seen["loss_before"]
    assert a["globals"] == b["globals"]


@pytest.mark.parametrize("pass_optimizer", [True, False])
def test_two_python_learners_agree_after_every_round(tmp_path, pass_optimizer):
    flag = ["--pass-optimizer"] if pass_optimizer else []
    with embedded_lighthouse() as lighthouse:
        a, b = run_learners(tmp_path, lighthouse.address, (flag, flag))
        status = lighthouse.status()
    # 40 steps, H = 5: a round after steps 5, 10, ..., 40, exactly there.
    for seen in (a, b):
        assert seen["stats"]["rounds"] == 8
        assert sorted(int(s) for s in seen["rounds_at_step"]) == list(range(5, 41, 5))
        assert seen["loss_after"] < seen["loss_before"]
        assert seen["data_ptr"] == seen["data_ptr_after"]  # written in place
        assert seen["quiet_steps"] >= 8 * 3 and seen["quiet_copies"] == 0  # no copy per step
        assert seen["stats"]["parameter_copies"] > 0  # but rounds do copy
    assert a["globals"] == b["globals"]  # bit-identical after every round
    assert len(a["globals"]) == 8
    assert status["summary"]["latest_round_id"] >= 8


def wait_for_file(path, proc, timeout=60):
    import time
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"learner exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"no {path} within {timeout} s"
        time.sleep(0.05)


def test_killed_learner_restarts_heals_and_matches(tmp_path):
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)

    def start(name, seed, out, ready=""):
        return subprocess.Popen(
            [sys.executable, os.path.join(HERE, "learner.py"), "--lighthouse", lighthouse.address,
             "--id", name, "--seed", str(seed), "--out", str(out), "--steps", "60",
             "--min-learners", "1", "--step-sleep", "0.04", "--ready-file", ready, "--schedule"], env=env)

    with embedded_lighthouse() as lighthouse:
        a = start("learner-a", 1, tmp_path / "a.json")
        ready = str(tmp_path / "b.ready")
        b = start("learner-b", 2, tmp_path / "b-first.json", ready)
        wait_for_file(ready, b)  # b has completed a round
        b.kill()                 # SIGKILL mid-run
        b.wait()
        restarted = start("learner-b", 3, tmp_path / "b.json")
        assert a.wait(timeout=120) == 0
        assert restarted.wait(timeout=120) == 0
    seen_a = json.loads((tmp_path / "a.json").read_text())
    seen_b = json.loads((tmp_path / "b.json").read_text())
    assert seen_b["stats"]["heals"] >= 1
    shared = set(seen_a["globals"]) & set(seen_b["globals"])
    assert shared, "the restarted learner shared no round with the other"
    for round_id in shared:
        assert seen_a["globals"][round_id] == seen_b["globals"][round_id], round_id
    # From its heal on, the restarted learner's scheduler is at the job's step:
    # the same learning rate as a's at every job step (torchtitan #4598's bug).
    assert "moved" in seen_b and "moved" not in seen_a, (seen_a.get("moved"), seen_b.get("moved"))
    healed_at = seen_b["moved"][1]
    after = [s for s in seen_b["rates"] if int(s) >= healed_at]
    assert len(after) >= 10, sorted(seen_b["rates"], key=int)
    for step in after:
        assert seen_b["rates"][step] == seen_a["rates"][step], (step, seen_b["rates"][step], seen_a["rates"][step])


def test_ctrl_c_while_waiting_for_a_round_raises_keyboard_interrupt(tmp_path):
    import signal
    import time
    with embedded_lighthouse() as lighthouse:
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN)
        # Alone in a job of at least 2: its first boundary waits for a round.
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "learner.py"), "--lighthouse", lighthouse.address,
             "--id", "lonely", "--out", str(tmp_path / "x.json"), "--period", "2"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(l["id"] == "lonely" and l["state"] == "waiting"
                      for l in lighthouse.status()["learners"]):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # Where it is stuck: its signal masks, its threads' Python stacks, its log.
            with open(f"/proc/{proc.pid}/status") as f:
                masks = "".join(line for line in f if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn")))
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the learner did not exit within 10 s of SIGINT; {masks}its stderr:\n{err[-6000:]}")
        assert proc.returncode == 3 and "interrupted" in out, err[-3000:]
        deadline = time.monotonic() + 10
        while not any(l["id"] == "lonely" and l["state"] == "left"
                      for l in lighthouse.status()["learners"]):
            assert time.monotonic() < deadline, "the learner did not leave the job"
            time.sleep(0.05)


def test_other_python_threads_run_while_a_step_waits():
    import threading
    with embedded_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2,
                                 sync_period_steps=1, concurrent_outer_step=False,
                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")
        models = [torch.nn.Linear(4, 1) for _ in range(2)]
        runtimes = [mend.mend_init(m, config, f"thread-{i}", manual=True) for i, m in enumerate(models)]
        ticks = [0]
        stop = threading.Event()

        def ticker():
            while not stop.is_set():
                ticks[0] += 1

        ticking = threading.Thread(target=ticker)
        ticking.start()
        # Two learners in one process, each on its own thread: a round needs
        # both, so a step that held the GIL while it waits would deadlock.
        errors = []

        def learn(runtime):
            try:
                for _ in range(3):
                    runtime.step(4)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=learn, args=(r,)) for r in runtimes]
        before = ticks[0]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        stop.set()
        ticking.join()
        assert not errors and all(not t.is_alive() for t in threads)
        assert all(r.stats()["rounds"] == 3 for r in runtimes)
        assert ticks[0] > before
        assert torch.equal(runtimes[0].global_state(), runtimes[1].global_state())
        for m in models:
            mend.mend_shutdown(m)


def test_bad_input_gets_a_clear_error():
    with embedded_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1,
                                 log_level="warn")
        with pytest.raises(ValueError, match="'weight' is torch.float64"):
            mend.mend_init(torch.nn.Linear(2, 2).double(), config, "x1")
        with pytest.raises(ValueError, match="no parameters"):
            mend.mend_init(torch.nn.ReLU(), config, "x2")
        with pytest.raises(TypeError, match=r"config must be a MendConfig, not dict \(MendConfig\(\*\*settings\)"):
            mend.mend_init(torch.nn.Linear(2, 2), {"quorum_min_learners": 1}, "x2")
        model = torch.nn.Module()
        model.t = torch.nn.Parameter(torch.zeros(3, 2).t())
        with pytest.raises(ValueError, match="'t' is .*not contiguous"):
            mend.mend_init(model, config, "x3")
        sparse = torch.nn.Module()
        sparse.s = torch.nn.Parameter(torch.zeros(4).to_sparse())
        with pytest.raises(ValueError, match="'s' is sparse"):
            mend.mend_init(sparse, config, "x4")
        ok = torch.nn.Linear(2, 1)
        mend.mend_init(ok, config, "x5")
        with pytest.raises(mend.FailedPreconditionError, match="already has a mend runtime"):
            mend.mend_init(ok, config, "x5")
        mend.mend_shutdown(ok)
        os.environ["MEND_JOB_TOKEN"] = "a-wrong-token-123456"
        try:
            with pytest.raises(mend.MendError, match="token"):
                mend.mend_init(torch.nn.Linear(2, 1), config, "x6")
        finally:
            os.environ["MEND_JOB_TOKEN"] = TOKEN


def test_forked_child_gets_a_clear_error():
    with embedded_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1,
                                 log_level="warn")
        model = torch.nn.Linear(2, 1)
        runtime = mend.mend_init(model, config, "forking", manual=True)
        pid = os.fork()
        if pid == 0:  # the child: a DataLoader worker that calls mend by mistake
            try:
                runtime.step(1)
                os._exit(1)
            except mend.FailedPreconditionError as e:
                os._exit(0 if "forked process" in str(e) else 2)
            except BaseException:  # noqa: BLE001
                os._exit(3)
        _, code = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(code) == 0
        runtime.step(1)  # the parent is unaffected
        mend.mend_shutdown(model)


@pytest.mark.parametrize("late", [False, True], ids=["optimizer-given", "optimizer-made-after-mend-init"])
def test_desloc_averages_the_python_optimizers_own_moments(late):
    # Made after mend_init, the optimizer is found at its first step (torch
    # >= 2.0) or at a training forward (1.13), and its moments handed over alike.
    import threading
    with embedded_lighthouse() as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2,
                                 sync_period_steps=2, momentum_sync_period_steps=2,
                                 second_moment_sync_period_steps=2, concurrent_outer_step=False,
                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")
        assert config.desloc
        models, optimizers = [], []
        for seed in (1, 2):
            torch.manual_seed(seed)
            models.append(torch.nn.Linear(4, 1))
        if late:
            runtimes = [mend.mend_init(m, config, f"desloc-{i}") for i, m in enumerate(models)]
        optimizers = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
        if not late:
            runtimes = [mend.mend_init(m, config, f"desloc-{i}", optimizer=o)
                        for i, (m, o) in enumerate(zip(models, optimizers))]
        errors = []

        def learn(model, optimizer, seed):
            try:
                generator = torch.Generator().manual_seed(seed)
                runtime = mend.get_runtime(model)
                for _ in range(4):  # two rounds
                    runtime.report_tokens(8)  # float inputs: no tokens to count
                    x = torch.randn(8, 4, generator=generator)
                    loss = (model(x) - x.sum(1, keepdim=True) * seed).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=learn, args=(m, o, i + 1))
                   for i, (m, o) in enumerate(zip(models, optimizers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        assert all(r.stats()["steps"] == 4 for r in runtimes)  # each step counted once
        assert all(r.stats()["moment_syncs"] == 4 for r in runtimes)  # 2 rounds x 2 moments
        assert_same_moments(models, optimizers)
        for m in models:
            mend.mend_shutdown(m)


def test_two_torchrun_learners_of_two_ranks_keep_every_replica_identical(tmp_path):
    # A learner is a torchrun (a rack): 2 learners x 2 ranks, DDP inside each
    # over the user's gloo process group, mend's rounds sharded between the
    # ranks. After every round the 4 replicas hold the same model (synchronous
    # rounds: each is the global state), and training got somewhere. Learner
    # 1's ranks all call save_checkpoint at step 12 (collective): one file.
    checkpoint = tmp_path / "on-demand.mend"
    with embedded_lighthouse() as lighthouse:
        # The workers run in this directory: the mend under test must not
        # depend on a relative PYTHONPATH (an installed one would be found).
        path = child_pythonpath()
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1", PYTHONPATH=path)
        procs = []
        master_ports = {1: free_port(), 2: free_port()}
        for learner in (1, 2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
                 "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(master_ports[learner]),
                 os.path.join(HERE, "group_learner.py"), "--lighthouse", lighthouse.address,
                 "--learner", str(learner), "--out", str(tmp_path / f"l{learner}-%r.json")]
                + (["--save-at", "12", "--save-path", str(checkpoint)] if learner == 1 else []),
                env=env, cwd=HERE))
        for proc in procs:
            assert proc.wait(timeout=180) == 0
        # Group rank 0 registered both ranks' data-plane hosts for its group.
        learners = lighthouse.status()["learners"]
        assert len(learners) == 2
        assert all(l["ranks"] == ["127.0.0.1", "127.0.0.1"] for l in learners), learners
    assert checkpoint.stat().st_size > 0
    seen = {}
    for learner in (1, 2):
        for rank in (0, 1):
            seen[learner, rank] = json.loads((tmp_path / f"l{learner}-{rank}.json").read_text())
    for (learner, rank), s in seen.items():
        assert (s["group_size"], s["group_rank"]) == (2, rank)
        # The group's ranks meet and share round decisions in the store its
        # rank 0 serves (mend's own, not torchrun's), whose address reached
        # rank 1 at mend_init.
        assert s["group_store"] == seen[learner, 0]["group_store"]
        assert s["group_store"].startswith("127.0.0.1:")
        assert s["group_store"] != f"127.0.0.1:{master_ports[learner]}"

        assert len(s["rounds"]) == 6  # 30 steps, H = 5
        assert s["rounds"] == seen[1, 0]["rounds"], (learner, rank)  # same round ids, same digests
        assert s["last_loss"] < s["first_loss"]
        assert s["bytes_sent"] > 0  # every rank carries its slice
    assert seen[1, 0]["learner_id"] == seen[1, 1]["learner_id"] == "learner-1"
    assert seen[2, 0]["learner_id"] == seen[2, 1]["learner_id"] != "learner-1"  # group rank 0's HOST-PID


def test_a_rank_that_calls_mend_init_alone_gets_an_error_within_the_quorum_timeout(tmp_path):
    # Under torchrun every rank of the process group is a rank of the learner;
    # a mend_init called on one rank only must not wait for ever (in a
    # collective) for the other: each ends after quorum_timeout_ms (3 s) with
    # an error that names the rank that did not come.
    with embedded_lighthouse() as lighthouse:
        path = child_pythonpath()
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1", PYTHONPATH=path)
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--nproc_per_node", "2",
             "--master_addr", "127.0.0.1",
             "--master_port", str(free_port()), os.path.join(HERE, "one_rank_calls.py"),
             "--lighthouse", lighthouse.address, "--out", str(tmp_path / "r%r.json")],
            env=env, cwd=HERE, capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-4000:]
    alone_0 = json.loads((tmp_path / "r0.json").read_text())["0"]
    alone_1 = json.loads((tmp_path / "r1.json").read_text())["1"]
    # Rank 0 waited for rank 1's data-plane address; rank 1 for rank 0's store address.
    assert alone_0["error"] == "DeadlineExceededError", alone_0
    assert "group rank 1's data-plane address did not come within quorum_timeout_ms = 3000" in alone_0["message"]
    assert alone_1["error"] == "DeadlineExceededError", alone_1
    assert ("group rank 0 of this learner (group_size = 2) did not call mend_init within quorum_timeout_ms = 3000"
            in alone_1["message"])


def test_a_torchrun_group_that_loses_a_rank_is_restarted_and_heals(tmp_path):
    # torchrun --max_restarts: rank 1 of learner 1 exits at its step 12; torchrun
    # restarts both ranks (its restart count keys the group's store entries
    # anew), they heal slice by slice from learner 2's ranks, and from then on
    # all 4 replicas match after every round they share.
    with embedded_lighthouse() as lighthouse:
        path = child_pythonpath()
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1", PYTHONPATH=path)
        procs = []
        for learner, extra in ((1, ["--max_restarts", "1", "--monitor_interval", "1"]), (2, [])):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
                 "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *extra,
                 os.path.join(HERE, "group_learner.py"), "--lighthouse", lighthouse.address,
                 "--learner", str(learner), "--steps", "40", "--out", str(tmp_path / f"l{learner}-%r.json"),
                 *(["--die-at-step", "12"] if learner == 1 else [])],
                env=env, cwd=HERE))
        for proc in procs:
            assert proc.wait(timeout=240) == 0
    seen = {(l, r): json.loads((tmp_path / f"l{l}-{r}.json").read_text()) for l in (1, 2) for r in (0, 1)}
    assert seen[1, 0]["attempt"] == seen[1, 1]["attempt"] == 1  # restarted once
    by_round = {(l, r): {x["round"]: x["digest"] for x in s["rounds"]} for (l, r), s in seen.items()}
    shared = set(by_round[1, 0]) & set(by_round[2, 0])
    assert len(shared) >= 2, (by_round[1, 0].keys(), by_round[2, 0].keys())
    for round_id in shared:
        assert len({by_round[key][round_id] for key in by_round}) == 1, round_id
