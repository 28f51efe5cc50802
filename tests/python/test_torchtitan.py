"""torchtitan's Trainer with mend between learners: two learners, each a
torchrun of two CPU ranks over gloo in which torchtitan 0.2.2 shards
llama3's debug model with FSDP2 (torchtitan_learner.py, which runs
torchtitan's trainer on the CPU with four shims), each learner reading a
text of its own; then the job again from torchtitan's checkpoints.
TORCHTITAN_RANKS=1 runs learners of one rank, as bench/gpu_session.sh does
on one GPU (where torchtitan applies no FSDP)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is in requirements/torch2.txt only")

import torch  # noqa: E402

import mend  # noqa: E402
from job_processes import child_pythonpath, run_torchrun_learners  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LEARNER = os.path.join(HERE, "torchtitan_learner.py")
TOKEN = "torchtitan-test-token-0123456789"
RANKS = int(os.environ.get("TORCHTITAN_RANKS", "2"))


def run_job(tmp_path, job):
    """Both learners, each a torchrun of RANKS ranks saving torchtitan's
    checkpoints (DCP, mend's state in them) every 10 steps into
    learner-I/checkpoint, from which torchtitan resumes when one is there;
    returns results[learner, rank]."""
    path = child_pythonpath()
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"))
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=5000, log_level="warn")) as lighthouse:
        for learner in (1, 2):
            (tmp_path / f"learner-{learner}").mkdir(exist_ok=True)
        run_torchrun_learners(
            LEARNER, RANKS,
            lambda learner: ["--learner", str(learner), "--lighthouse", lighthouse.address,
                             "--assets", str(tmp_path / "assets"),
                             "--out", str(tmp_path / f"learner-{learner}" / f"{job}-%r.json"),
                             "--checkpoint.enable", "--checkpoint.interval", "10", "--checkpoint.folder", "checkpoint"],
            env, tmp_path, lambda learner: tmp_path / f"learner-{learner}" / f"{job}.log", timeout=400)
    return {(l, r): json.loads((tmp_path / f"learner-{l}" / f"{job}-{r}.json").read_text())
            for l in (1, 2) for r in range(RANKS)}


def test_torchtitans_fsdp2_learners_hold_the_same_shards_after_every_round_and_resume_from_its_checkpoints(
        tmp_path):
    subprocess.run([sys.executable, LEARNER, "--make-assets", str(tmp_path / "assets")], check=True, timeout=120)
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    results = run_job(tmp_path, "whole")
    for (learner, rank), result in results.items():
        if RANKS > 1:
            assert result["kinds"] == ["DTensor ('S(0)',)"], result["kinds"]  # torchtitan's FSDP2 shards
        assert result["device"].startswith("cuda" if torch.cuda.is_available() else "cpu"), result["device"]
        stats = result["stats"]
        assert stats["rounds"] == 4 and result["step"] == 20 and stats["heals"] == 0, result
        # A shard is a slice: each rank exchanges its own pieces (4 bytes a
        # value, a round), 1/RANKS of the model.
        assert RANKS * result["local_values"] >= result["model_values"] > (RANKS - 1) * result["local_values"], result
        assert 4 * 4 * result["local_values"] <= stats["bytes_sent"] < 4 * 4 * result["local_values"] * 1.02, result
        # Each learner read its own text, yet after every round each rank's
        # shards are the same on both learners, and so is the final model.
        assert len(result["rounds"]) == 4 and result["rounds"] == results[1, rank]["rounds"], (learner, rank)
        assert result["final"] == results[1, 0]["final"], (learner, rank)
    if RANKS > 1:
        assert results[1, 0]["rounds"]["1"] != results[1, 1]["rounds"]["1"]  # each rank its own shard

    # The job again from its checkpoints at step 10 (torchtitan loads the
    # newest): it trains steps 11-20 in 2 rounds and ends bit for bit where
    # the uninterrupted job ended.
    for learner in (1, 2):
        shutil.rmtree(tmp_path / f"learner-{learner}" / "checkpoint" / "step-20")
    resumed = run_job(tmp_path, "resumed")
    for (learner, rank), result in resumed.items():
        assert result["stats"]["rounds"] == 2 and result["stats"]["steps"] == 20 and result["step"] == 20, result
        assert result["rounds"]["4"] == results[learner, rank]["rounds"]["4"], (learner, rank)
        assert result["final"] == results[learner, rank]["final"], (learner, rank)
