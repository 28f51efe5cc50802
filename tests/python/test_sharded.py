"""Learners whose model is sharded over their ranks: two torchruns of two
(or four) ranks each on gloo, the model sharded with FSDP2, tensor
parallelism, or both on a 2-D mesh (sharded_learner.py), against learners of
the same ranks in DDP."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import mend
from job_processes import child_pythonpath, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "sharded-test-token-0123456789"
MODEL_VALUES = 16 * 256 + 256 + 2 * 256 + 256 * 7 + 7  # sharded_learner.py's model


def _sharding_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 (torch 1.13's fsdp fails to import on Python 3.11)
        return False


pytestmark = pytest.mark.skipif(not _sharding_available(), reason=f"torch {torch.__version__} has no FSDP2 "
                                                                  "or tensor parallelism")


def run_job(tmp_path, layouts, mode, ranks=2, timeout=240, extra=lambda learner: [], torchrun=lambda learner: []):
    """Two learners, learner l a torchrun (with torchrun(l)'s arguments) of
    `ranks` ranks in layouts[l - 1] (with extra(l)'s arguments); returns
    (exit codes, outputs, results[learner][rank] or None)."""
    out_dir = tmp_path / f"{'-'.join(layouts)}-{mode}"
    out_dir.mkdir()
    path = child_pythonpath()
    env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1", PYTHONPATH=path)
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 grace_window_ms=2000, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                                 log_level="warn"))
    procs, logs = [], []
    with lighthouse:
        for learner, layout in enumerate(layouts, start=1):
            log = open(out_dir / f"torchrun-{learner}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                 "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *torchrun(learner),
                 os.path.join(HERE, "sharded_learner.py"), "--lighthouse", lighthouse.address,
                 "--learner", str(learner), "--layout", layout, "--mode", mode,
                 "--out", str(out_dir / f"l{learner}-%r.json"), *extra(learner)],
                env=env, cwd=HERE, stdout=log, stderr=subprocess.STDOUT))
        # (A learner that fails leaves the other waiting for a quorum: it is stopped.)
        deadline = time.monotonic() + timeout
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            if any(proc.poll() not in (None, 0) for proc in procs):
                for proc in procs:
                    if proc.poll() is None:
                        proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        codes = [proc.wait(timeout=60) for proc in procs]
    for log in logs:
        log.close()
    outputs = [(out_dir / f"torchrun-{learner}.log").read_text() for learner in (1, 2)]
    results = {}
    for learner in (1, 2):
        for rank in range(ranks):
            path = out_dir / f"l{learner}-{rank}.json"
            results[learner, rank] = json.loads(path.read_text()) if path.exists() else None
    return codes, outputs, results


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    codes, outputs, results = run_job(tmp_path_factory.mktemp("ddp"), ["ddp", "ddp"], "fixed")
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return results


# (fsdp2 over 1 rank: a mesh of one cuts nothing, and the learner is one rank.)
@pytest.mark.parametrize("layout,ranks", [("fsdp2", 1), ("fsdp2", 2), ("tp", 2), ("2d", 4)])
def test_sharded_learners_merge_exactly_as_ddp_learners_and_move_only_their_shards(
        tmp_path, ddp_reference, layout, ranks):
    # Every inner step changes each value by the same elementwise rule in
    # every layout, so the rounds' results must be DDP's bit for bit (fp32,
    # elementwise outer math).
    codes, outputs, results = run_job(tmp_path, [layout, layout], "fixed", ranks)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    reference = ddp_reference[1, 0]
    ddp_sent = sum(ddp_reference[1, r]["stats"]["bytes_sent"] for r in (0, 1))
    for (learner, rank), result in results.items():
        # (Tensor parallelism leaves the LayerNorm a plain parameter, whole on every rank.)
        plain = {"1.weight", "1.bias"} if layout == "tp" else set()
        assert {name for name, kind in result["kinds"].items() if kind == "Parameter torch.float32"} == plain
        assert set(result["kinds"].values()) - {"Parameter torch.float32"} == {"DTensor torch.float32"}, result["kinds"]
        assert result["stats"]["rounds"] == 4
        assert result["model"] == reference["model"], f"learner {learner} rank {rank} ends unlike DDP's"
        # After every round: rank r's own pieces are the same on both
        # learners, and the gathered model on every rank of both.
        assert [r["own"] for r in result["rounds"]] == [r["own"] for r in results[1, rank]["rounds"]]
        assert [r["whole"] for r in result["rounds"]] == [r["whole"] for r in results[1, 0]["rounds"]]
        # Across racks each rank sends its 1/R of the model (with its own
        # headers); inside the learner no copy of the model travels, where
        # DDP's ranks all-gather theirs after every round. (The state bytes
        # leave out the ranks' agreements, whose count depends on how long
        # rank 0 polls for a quorum.)
        assert result["stats"]["bytes_sent"] <= 1.1 * ddp_sent / ranks, result["stats"]
        ddp_state = ddp_reference[1, 0]["stats"]["group_state_bytes_sent"]
        assert ddp_state >= 4 * 4 * MODEL_VALUES // 2, ddp_reference[1, 0]["stats"]  # half the model, 4 rounds
        # What moves inside: each rank's half of the pieces it shares with one
        # other rank (tp: the LayerNorm and the last bias, on both ranks; 2d:
        # its dp row of them, on its tp peer's too), to that rank only, after
        # each of the 4 rounds (with a header each); fsdp2: nothing.
        shared = {"fsdp2": 0, "tp": 2 * 256 + 7, "2d": 256 + 4}[layout]
        state = result["stats"]["group_state_bytes_sent"]
        assert 4 * 4 * shared // 2 - 8 <= state <= (4 * (4 * shared // 2 + 64) if shared else 0), result["stats"]
        assert state <= result["stats"]["group_bytes_sent"]
    # Each value crosses racks once a round from each learner, a piece the
    # ranks share (the LayerNorm: 8% of the model) included: twice would be
    # 1.08 times the model's bytes.
    sent = sum(results[1, r]["stats"]["bytes_sent"] for r in range(ranks))
    assert 4 * 4 * MODEL_VALUES < sent < 1.02 * 4 * 4 * MODEL_VALUES, (sent, 4 * 4 * MODEL_VALUES, ddp_sent)
    assert sent <= 1.02 * ddp_sent


@pytest.mark.parametrize("layout,settings", [
    ("fsdp2", []), ("fsdp2-mp", []),
    # DES-LOC averages the AdamW moments' shards too (each rank's own).
    ("fsdp2", ["desloc=true", "momentum_sync_period_steps=5", "second_moment_sync_period_steps=10"]),
    # sync_buffers: a BatchNorm's running statistics, whole on each rank
    # (FSDP2 shards parameters only), agree with the same rank's elsewhere.
    ("fsdp2-bn", []),
])
def test_fsdp2_training_keeps_each_shard_the_same_on_every_learner_after_every_round(tmp_path, layout, settings):
    # Real FSDP2 training: forward, backward and AdamW on the shards, mend
    # after every optimizer step (found by itself); synchronous rounds. With
    # a bf16 MixedPrecisionPolicy mend works on the fp32 shards.
    extra = [a for s in settings for a in ("--set", s)]
    codes, outputs, results = run_job(tmp_path, [layout, layout], "train", extra=lambda learner: extra)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for rank in (0, 1):
        a, b = results[1, rank], results[2, rank]
        assert a["stats"]["rounds"] == b["stats"]["rounds"] == 4
        assert a["rounds"] == b["rounds"]  # round ids, steps and digests (DES-LOC: of the first moments too)
        assert all(("exp_avg" in r) == bool(settings) for r in a["rounds"])
        assert all(("buffers" in r) == (layout == "fsdp2-bn") for r in a["rounds"])
        assert a["local_values"] < sum(len(torch.tensor(v).flatten()) for v in a["model"].values())
        assert set(a["kinds"].values()) == {"DTensor torch.float32"}, a["kinds"]
    assert results[1, 0]["rounds"][0]["own"] != results[1, 1]["rounds"][0]["own"]  # each rank its own shard


@pytest.fixture(scope="module")
def saved_at_step_10(tmp_path_factory):
    """saved_at_step_10(layout): two learners of 2 ranks in `layout` train 10
    of the 20 steps, and each saves its model and mend's outer state with
    torch.distributed.checkpoint (once a layout); returns the folder."""
    saved = {}

    def save(layout):
        if layout not in saved:
            where = tmp_path_factory.mktemp(f"saved-{layout}")
            codes, outputs, results = run_job(where, [layout, layout], "fixed", 2,
                                              extra=lambda l: ["--steps", "10", "--save", str(where / f"dcp-{l}")])
            assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
            assert all(result["stats"]["rounds"] == 2 for result in results.values())
            saved[layout] = where
        return saved[layout]

    return save


# (fsdp2 onto 1 rank: the two ranks' shards resharded into one rank's by
# DCP; tp: pieces the ranks share, the LayerNorm, saved and loaded too.)
@pytest.mark.parametrize("layout,ranks", [("fsdp2", 2), ("fsdp2", 1), ("tp", 2)])
def test_sharded_learners_resumed_with_dcp_go_on_exactly_with_the_same_or_another_rank_count(
        tmp_path, ddp_reference, saved_at_step_10, layout, ranks):
    # A new job (a new lighthouse): each learner loads its checkpoint right
    # after mend_init, and trains steps 10-19. It ends bit for bit as the
    # uninterrupted job of 20 steps does: the outer momentum, the round and
    # the tokens came back with the parameters. (The transformers Trainer's
    # checkpoints, mend's state in each: test_trainer_fsdp2.py.)
    saved = saved_at_step_10(layout)
    codes, outputs, results = run_job(
        tmp_path, [layout, layout], "fixed", ranks,
        extra=lambda l: ["--start-step", "10", "--load", str(saved / f"dcp-{l}")])
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for (learner, rank), result in results.items():
        assert result["stats"]["rounds"] == 2 and result["stats"]["steps"] == 20, result["stats"]
        assert result["model"] == ddp_reference[1, 0]["model"], f"learner {learner} rank {rank} ends unlike DDP's"


def test_a_sharded_learner_that_loses_a_rank_restarts_and_heals_each_shard_from_the_same_rank(tmp_path):
    # Chaos with a sharded learner: rank 1 of FSDP2 learner 1 exits at its
    # step 12; torchrun restarts both ranks, which heal their shards from
    # the same ranks of learner 2 (the model is built afresh: a heal, not a
    # resume). From then on each rank's shards match learner 2's after every
    # round they share, and the final merge ends both with the same model.
    codes, outputs, results = run_job(
        tmp_path, ["fsdp2", "fsdp2"], "train",
        extra=lambda l: ["--steps", "40", "--set", "total_steps=40"] + (["--die-at-step", "12"] if l == 1 else []),
        torchrun=lambda l: ["--max_restarts", "1", "--monitor_interval", "1"] if l == 1 else [])
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for rank in (0, 1):
        restarted, other = results[1, rank], results[2, rank]
        assert restarted["attempt"] == 1 and other["attempt"] == 0
        assert restarted["stats"]["heals"] >= 1 and other["stats"]["heals"] == 0
        assert restarted["stats"]["steps"] == other["stats"]["steps"] == 40
        mine = {r["round"]: r["own"] for r in restarted["rounds"]}
        theirs = {r["round"]: r["own"] for r in other["rounds"]}
        shared = set(mine) & set(theirs)
        assert len(shared) >= 3, (sorted(mine), sorted(theirs))
        assert all(mine[r] == theirs[r] for r in shared), f"rank {rank}'s shards differ after a shared round"
        assert restarted["model"] == other["model"]  # the final merge


def test_a_sharded_outer_state_loaded_into_a_whole_model_is_refused_naming_both(tmp_path):
    # (One process: a learner of one rank whose model is plain tensors.)
    state = {"format": "mend outer state", "version": 2, "described": b"", "global": {}, "outer_momentum": {}}
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                                 log_level="warn"))
    with lighthouse:
        model = torch.nn.Linear(2, 2)
        runtime = mend.mend_init(model, mend.MendConfig(lighthouse=lighthouse.address, log_level="warn"),
                                 "learner-solo", manual=True)
        try:
            with pytest.raises(ValueError, match="sharded model's outer state.*not sharded"):
                runtime.load_state_dict(state)
        finally:
            mend.mend_shutdown(model)


def test_learners_of_different_layouts_are_refused_naming_both(tmp_path):
    codes, outputs, _ = run_job(tmp_path, ["fsdp2", "tp"], "fixed", timeout=180)
    refused = [i for i, code in enumerate(codes) if code != 0]
    assert refused, "two layouts trained in one job"
    text = "\n".join(outputs[i] for i in refused)
    assert "model_layout" in text, text[-3000:]
    assert "mesh [2] dp" in text and "mesh [2] tp" in text, text[-3000:]  # both layouts


def _lightning_model_parallel():
    try:
        from pytorch_lightning.strategies import ModelParallelStrategy  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _lightning_model_parallel(), reason="no Lightning with ModelParallelStrategy")
def test_lightning_model_parallel_strategy_with_mend_callback_keeps_each_shard_the_same(tmp_path):
    # Two learners, each a Lightning Trainer of 2 CPU ranks whose module
    # shards itself with FSDP2 (ModelParallelStrategy, configure_model), and
    # mend's Lightning callback: after every round each rank's shards are
    # the same on both learners, and each rank's differ from the other's.
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    path = child_pythonpath()
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 grace_window_ms=2000, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                                 log_level="warn"))
    with lighthouse:
        procs = []
        for learner in (1, 2):
            env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
            log = open(tmp_path / f"learner-{learner}.log", "w")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "lightning_sharded.py"), "--learner", str(learner),
                 "--lighthouse", lighthouse.address, "--out", str(tmp_path / f"l{learner}-%r.json"),
                 "--save", str(tmp_path / f"checkpoints-{learner}")],
                env=env, cwd=HERE, stdout=log, stderr=subprocess.STDOUT))
        codes = [proc.wait(timeout=300) for proc in procs]
    outputs = [(tmp_path / f"learner-{learner}.log").read_text()[-3000:] for learner in (1, 2)]
    assert codes == [0, 0], outputs
    results = {(l, r): json.loads((tmp_path / f"l{l}-{r}.json").read_text()) for l in (1, 2) for r in (0, 1)}
    for (learner, rank), result in results.items():
        assert result["kinds"] == ["DTensor ('S(0)',)"], result["kinds"]
        assert result["stats"]["rounds"] == 4 and result["global_step"] == 20, result
        assert result["rounds"] == results[1, rank]["rounds"], f"learner {learner} rank {rank}"
        assert len(result["rounds"]) == 4
    assert results[1, 0]["rounds"]["1"] != results[1, 1]["rounds"]["1"]  # each rank its own shard
    # Lightning keeps callback states from rank 0 only: mend's sharded state
    # stays out of its checkpoints, and every rank says so, once.
    for learner in (1, 2):
        log = (tmp_path / f"learner-{learner}.log").read_text()
        assert log.count("Lightning's checkpoints hold callback states from rank 0 only") == 2, log[-3000:]
