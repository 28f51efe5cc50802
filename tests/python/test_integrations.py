"""The trainer integrations, each with two learner processes on the CPU and
a tiny random LlamaForCausalLM (tests/python/trainer_job.py): the
transformers Trainer with MendCallback, a plain Accelerate loop (its
wrapped optimizer, gradient accumulation, accelerator.save_state), and a
Lightning Trainer with MendCallback. Each job's learners leave every round
and the final merge bit-identical, count the real tokens (padding is not
one), log mend's counters, and a run resumed from the checkpoint saved
mid-period goes on exactly as the uninterrupted one did."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import run_processes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "integrations-test-token-0123456789"
STEPS, PERIOD, SAVE_AT = 14, 4, 6  # (the last round at 12, the final merge at 14)
FRAMEWORKS = {"transformers": "transformers", "accelerate": "accelerate", "lightning": "pytorch_lightning"}


def run_job(framework, address, root, resume=False):
    """Both learners' processes at once; what each wrote."""
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false")
    commands, results = [], []
    for i in range(2):
        out = os.path.join(root, f"learner-{i}")
        os.makedirs(out, exist_ok=True)
        results.append(os.path.join(root, f"result-{i}.pt"))
        commands.append(([sys.executable, os.path.join(HERE, "trainer_job.py"), framework, "--learner", str(i),
                          "--lighthouse", address, "--out", out, "--result", results[-1], "--steps", str(STEPS),
                          "--period", str(PERIOD), "--save-at", str(SAVE_AT)] + (["--resume"] if resume else []),
                         {"env": env}))
    run_processes(commands)
    return [torch.load(path, weights_only=False) for path in results]


def saved_state(framework, learner):
    """What the uninterrupted run saved at SAVE_AT, by path under the learner's folder."""
    return {"transformers": f"checkpoint-{SAVE_AT}", "accelerate": "saved",
            "lightning": f"step={SAVE_AT}.ckpt"}[framework]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_two_learners_stay_identical_count_real_tokens_and_resume_exactly(framework, tmp_path):
    pytest.importorskip(FRAMEWORKS[framework])
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=3000, log_level="warn")) as lighthouse:
        whole = run_job(framework, lighthouse.address, str(tmp_path / "whole"))
        for i in range(2):
            name = saved_state(framework, i)
            source = tmp_path / "whole" / f"learner-{i}" / name
            target = tmp_path / "resumed" / f"learner-{i}" / name
            target.parent.mkdir(parents=True)
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        resumed = run_job(framework, lighthouse.address, str(tmp_path / "resumed"), resume=True)

    rounds = list(range(PERIOD, STEPS + 1, PERIOD))
    for run in (whole, resumed):
        # Every round and the final merge leave the learners bit-identical.
        for step in run[0]["after_rounds"]:
            assert torch.equal(run[0]["after_rounds"][step], run[1]["after_rounds"][step]), step
        assert torch.equal(run[0]["final"], run[1]["final"])
        for result in run:
            # The tokens mend gave its steps are the forwards' real tokens, fewer than their positions.
            assert result["stats"]["tokens"] == result["tokens"] > 0
            assert result["stats"]["skipped_steps"] == 0
            # No heal moved a learner: nothing says one did (Lightning's callback said so at its last step).
            assert not [w for w in result["mend_warnings"] if "heal" in w], result["mend_warnings"]
            assert any("rounds" in str(entry) for entry in result["logged"]) or framework == "accelerate"
    for result in whole:
        assert sorted(result["after_rounds"]) == rounds
        assert result["stats"]["steps"] == STEPS
        assert result["tokens"] < STEPS * 4 * 12  # (BATCH x LENGTH positions a step)
        assert result["stats"]["rounds"] == len(rounds) + 1  # (and the final merge)
    # The resumed run: the rounds after SAVE_AT and the final merge, as the uninterrupted run had them.
    for i in range(2):
        later = [step for step in rounds if step > SAVE_AT]
        assert sorted(resumed[i]["after_rounds"]) == later
        for step in later:
            assert torch.equal(resumed[i]["after_rounds"][step], whole[i]["after_rounds"][step]), (i, step)
        assert torch.equal(resumed[i]["final"], whole[i]["final"]), i
        assert resumed[i]["stats"]["steps"] == STEPS


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_a_trainer_healed_forward_follows_the_jobs_step_and_schedule_to_the_final_merge(framework, tmp_path):
    # learner-0 trains alone (round at 4) and after its step 5 lets learner-1
    # start; its round at 8 heals learner-1, whose step 4 becomes the job's
    # step 8. learner-1's Trainer moves with it: its step count (so it stops
    # after its own 10 steps, at the job's 14, for the final merge with
    # learner-0) and its learning-rate schedule (the same rate as learner-0
    # at every job step from the heal on).
    pytest.importorskip(FRAMEWORKS[framework])
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false")
    ahead = str(tmp_path / "ahead")
    # (A quorum of one, and a grace window that waits for the other learner once it is alive.)
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1, heartbeat_ms=50,
                                         heartbeat_timeout_ms=3000, grace_window_ms=120000,
                                         grace_window_adaptive=False, log_level="warn"),
                         token=TOKEN) as lighthouse:
        commands, results = [], []
        for i, role in enumerate([["--ahead-at", "5", "--ahead-file", ahead], ["--start-after", ahead]]):
            results.append(str(tmp_path / f"result-{i}.pt"))
            commands.append(([sys.executable, os.path.join(HERE, "trainer_job.py"), framework, "--learner", str(i),
                              "--lighthouse", lighthouse.address, "--out", str(tmp_path / f"learner-{i}"),
                              "--result", results[-1], "--steps", str(STEPS), "--period", str(PERIOD),
                              "--save-at", str(SAVE_AT), "--min-learners", "1", "--schedule"] + role,
                             {"env": env}))
        run_processes(commands)
    first, late = [torch.load(path, weights_only=False) for path in results]
    assert late["stats"]["heals"] == 1
    assert first["trainer_steps"] == STEPS and late["trainer_steps"] == STEPS - 4
    assert first["stats"]["steps"] == late["stats"]["steps"] == STEPS
    assert first["global_step"] == late["global_step"] == STEPS  # the trainer's own count moved too
    assert sorted(late["rates"]) == [1, 2, 3] + list(range(8, STEPS + 1)), sorted(late["rates"])
    for step in range(8, STEPS + 1):  # the rate after each job step, from the heal on
        assert late["rates"][step] == first["rates"][step], (step, late["rates"][step], first["rates"][step])
    assert len(set(first["rates"].values())) > STEPS // 2  # (a schedule, not a constant rate)
    assert not [w for w in late["mend_warnings"] if "does not follow" in w], late["mend_warnings"]
    for step in (8, 12):
        assert torch.equal(first["after_rounds"][step], late["after_rounds"][step]), step
    assert torch.equal(first["final"], late["final"])  # both took part in the final merge


def test_the_integrations_import_their_framework_only_when_used():
    code = ("import sys, mend, mend.integrations, mend.integrations._common; "
            "print(sorted(m for m in ('transformers', 'pytorch_lightning', 'lightning', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_resumed_trainer_is_told_where_mends_state_was_looked_for(tmp_path):
    from types import SimpleNamespace

    from mend.integrations.transformers import STATE_FILE, MendCallback
    args = SimpleNamespace(output_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"resumes at step 8, but .*checkpoint-8/mend_state\.pt does not "
                                                r"exist.*MendCallback\(resume_from="):
        MendCallback()._saved_state_file(args, 8)
    assert MendCallback(resume_from=False)._saved_state_file(args, 8) is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / STATE_FILE).write_bytes(b"")
    assert MendCallback(resume_from=str(elsewhere))._saved_state_file(args, 8) == str(elsewhere / STATE_FILE)
    with pytest.raises(TypeError, match="config must be a mend.MendConfig, not dict"):
        MendCallback({"lighthouse": "x"})


def test_a_total_steps_a_trainer_derived_that_the_job_refuses_says_where_it_came_from():
    # The user set no total_steps: the callback took the trainer's own count
    # (its epochs over this learner's data). Another learner's count differs:
    # the refusal says so, and how to fix it.
    from mend.integrations._common import Attachment
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                         log_level="error")) as lighthouse:
        keys = dict(lighthouse=lighthouse.address, quorum_min_learners=1, log_level="error")
        first = torch.nn.Linear(4, 1)
        mend.mend_init(first, mend.MendConfig(total_steps=40, **keys), "forty", manual=True)
        with pytest.raises(mend.InvalidArgumentError, match=r"total_steps = 36 is its trainer's own step count.*"
                                                            r"MendConfig\(total_steps=N\)"):
            Attachment(mend.MendConfig(**keys), "thirty-six").start(torch.nn.Linear(4, 1), None, total_steps=36)
        mend.mend_shutdown(first)
