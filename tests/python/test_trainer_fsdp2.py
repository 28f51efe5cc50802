"""The transformers Trainer with FSDP2 through Accelerate and mend's
MendCallback: two learners, each a torchrun of two CPU ranks over gloo
(trainer_fsdp2.py, with its one CPU shim), then the job again from the
Trainer's checkpoints. TRAINER_FSDP2_RANKS=1 runs learners of one rank, as
bench/gpu_session.sh does on one GPU."""
import json
import os
import shutil

import pytest

pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import torch  # noqa: E402

import mend  # noqa: E402
from job_processes import child_pythonpath, run_torchrun_learners  # noqa: E402


def _fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from accelerate.utils import fsdp2_prepare_model  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 (torch 1.13, or an Accelerate without FSDP2)
        return False


pytestmark = pytest.mark.skipif(not _fsdp2_available(), reason="no FSDP2 in this torch or Accelerate")

HERE = os.path.dirname(os.path.abspath(__file__))
LEARNER = os.path.join(HERE, "trainer_fsdp2.py")
TOKEN = "trainer-fsdp2-test-token-0123456789"
RANKS = int(os.environ.get("TRAINER_FSDP2_RANKS", "2"))
STEPS, PERIOD, SAVE_AT = 12, 3, 6


def run_job(tmp_path, job, resume=False):
    """Both learners, each a torchrun of RANKS ranks with its Trainer's
    output in learner-I/ (checkpoint-SAVE_AT, checkpoint-STEPS); returns
    results[learner, rank]."""
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), OMP_NUM_THREADS="1", MEND_JOB_TOKEN=TOKEN)
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=5000,
                                         log_level="warn"), token=TOKEN) as lighthouse:
        for learner in (1, 2):
            (tmp_path / f"learner-{learner}").mkdir(exist_ok=True)
        run_torchrun_learners(
            LEARNER, RANKS,
            lambda learner: ["--learner", str(learner), "--lighthouse", lighthouse.address,
                             "--out", str(tmp_path / f"learner-{learner}"), "--steps", str(STEPS),
                             "--period", str(PERIOD), "--save-at", str(SAVE_AT), *(["--resume"] if resume else [])],
            env, tmp_path, lambda learner: tmp_path / f"{job}-{learner}.log", timeout=300)
    results = {}
    for learner in (1, 2):
        for rank in range(RANKS):
            path = tmp_path / f"learner-{learner}" / f"result-{rank}.json"
            results[learner, rank] = json.loads(path.read_text())
            path.unlink()
    return results


def test_the_trainers_fsdp2_learners_hold_the_same_shards_after_every_round_and_resume_from_its_checkpoints(
        tmp_path):
    whole = run_job(tmp_path, "whole")
    rounds = STEPS // PERIOD
    for (learner, rank), result in whole.items():
        assert result["kinds"] == ["DTensor ('S(0)',)"], result["kinds"]  # Accelerate's FSDP2 shards
        assert result["device"].startswith("cuda" if torch.cuda.is_available() else "cpu"), result["device"]
        stats = result["stats"]
        assert stats["rounds"] == rounds and stats["steps"] == STEPS and result["global_step"] == STEPS, result
        assert stats["heals"] == 0, result
        # A shard is a slice: each rank sends its own pieces only (4 bytes a
        # value, a round), 1/RANKS of the model, and nothing of the model
        # moves inside the learner (only the ranks' agreements do).
        assert RANKS * result["local_values"] >= result["model_values"] > (RANKS - 1) * result["local_values"], result
        assert 4 * rounds * result["local_values"] <= stats["bytes_sent"] < 4 * rounds * result["local_values"] * 1.02
        assert stats["group_state_bytes_sent"] == 0, result
        # Each learner trained on its own data, yet after every round each
        # rank's shards are the same on both learners, and so is the model
        # after the final merge.
        assert len(result["rounds"]) == rounds and result["rounds"] == whole[1, rank]["rounds"], (learner, rank)
        assert result["final"] == whole[1, 0]["final"], (learner, rank)
        # The Trainer's checkpoints hold mend's state the FSDP2 way: a DCP
        # folder beside the model's and optimizer's.
        for step in (SAVE_AT, STEPS):
            folder = tmp_path / f"learner-{learner}" / f"checkpoint-{step}"
            assert (folder / "mend_state" / ".metadata").is_file(), sorted(os.listdir(folder))
            assert (folder / "pytorch_model_fsdp_0" / ".metadata").is_file(), sorted(os.listdir(folder))
            assert not (folder / "mend_state.pt").exists()
    if RANKS > 1:
        assert whole[1, 0]["rounds"]["1"] != whole[1, 1]["rounds"]["1"]  # each rank its own shard

    # The job again from its checkpoints at SAVE_AT (the Trainer resumes
    # from the newest): it trains the rest in the remaining rounds and ends
    # bit for bit where the uninterrupted job ended.
    for learner in (1, 2):
        shutil.rmtree(tmp_path / f"learner-{learner}" / f"checkpoint-{STEPS}")
    resumed = run_job(tmp_path, "resumed", resume=True)
    last = str(rounds)
    for (learner, rank), result in resumed.items():
        assert result["stats"]["rounds"] == rounds - SAVE_AT // PERIOD, result
        assert result["stats"]["steps"] == STEPS and result["global_step"] == STEPS, result
        assert result["rounds"][last] == whole[learner, rank]["rounds"][last], (learner, rank)
        assert result["final"] == whole[learner, rank]["final"], (learner, rank)
