"""host_staging: parameters that cannot be used in place (on a GPU, bfloat16,
float16; every one with host_staging = "always") go through float32 host
buffers at round boundaries. The same job must give the same bits either way."""
import json
import os
import subprocess
import sys

import pytest
torch = pytest.importorskip("torch")  # python3-torch; the torch-less tests are the numpy ones

import mend

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "staging-test-token-0123456789"
sys.path.insert(0, HERE)
from job_processes import child_pythonpath, free_port  # noqa: E402
from job_threads import run_in_threads  # noqa: E402
from learner import TinyLM, train_steps  # noqa: E402


def train_two(config, make_optimizer, steps, name, dtype=torch.float32):
    """Two learners (threads) of ``config``'s job, TinyLMs of seeds 1 and 2,
    ``steps`` inner steps each; their models, optimizers and runtimes."""
    models, optimizers, runtimes = [], [], []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(TinyLM().to(dtype))
        optimizers.append(make_optimizer(models[-1].parameters()))
        runtimes.append(mend.mend_init(models[-1], config, f"{name}-{seed}", optimizer=optimizers[-1]))
    errors = run_in_threads(lambda i: train_steps(models[i], optimizers[i], steps, 10 + i), 2)
    assert not errors, errors
    return models, optimizers, runtimes


def run_job(staging, dtype=torch.float32, desloc=True):
    """Two learners (threads) of one synchronous job, AdamW with DES-LOC's
    moment averaging: returns their models, optimizers and runtimes' stats."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        keys = dict(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=3,
                    concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                    host_staging=staging, log_level="warn")
        if desloc:
            keys.update(momentum_sync_period_steps=3, second_moment_sync_period_steps=6)
        config = mend.MendConfig(**keys)
        models, optimizers, runtimes = train_two(config, lambda p: torch.optim.AdamW(p, lr=0.02), 12, "staging",
                                                 dtype)
        stats = [r.stats() for r in runtimes]
        for m in models:
            mend.mend_shutdown(m)
    return models, optimizers, stats


def test_staging_always_gives_the_bits_of_in_place_parameters_and_moments():
    in_place, in_place_opt, in_place_stats = run_job("auto")
    staged, staged_opt, staged_stats = run_job("always")
    for s in in_place_stats:
        # DES-LOC: the first moment every round (4), the second every other (2).
        assert s["rounds"] == 4 and s["moment_syncs"] == 6 and s["staged_parameters"] == 0
        assert s["staging_copies"] == 0
    values = sum(p.numel() for p in in_place[0].parameters())
    for s in staged_stats:
        assert s["rounds"] == 4 and s["moment_syncs"] == 6 and s["staged_parameters"] == 5
        # float32 host copies of the parameters and both moments, flat (not pinned: no rounding)
        assert s["staging_host_bytes"] == 3 * 4 * values
        # Copies in and out at the 4 boundaries (and once out at the start: none),
        # never on the 8 steps between.
        assert 0 < s["staging_copies"] <= 2 * 4 + 2
    for a, b in zip(in_place, staged):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    for oa, ob, ma, mb in zip(in_place_opt, staged_opt, in_place, staged):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            assert torch.equal(oa.state[pa]["exp_avg"], ob.state[pb]["exp_avg"])
            assert torch.equal(oa.state[pa]["exp_avg_sq"], ob.state[pb]["exp_avg_sq"])
    # Synchronous rounds: both learners hold the global state after the last one.
    for pa, pb in zip(staged[0].parameters(), staged[1].parameters()):
        assert torch.equal(pa, pb)


def qwen2_tensor_bytes(vocab=151936, hidden=1536, intermediate=8960, layers=28, kv=256):
    """The float32 bytes of each parameter of Qwen-2.5-1.5B's shape (tied embeddings), in model order."""
    sizes = [vocab * hidden]
    for _ in range(layers):
        sizes += [hidden * hidden, hidden, kv * hidden, kv, kv * hidden, kv, hidden * hidden,
                  intermediate * hidden, intermediate * hidden, hidden * intermediate, hidden, hidden]
    return [4 * n for n in sizes + [hidden]]


@pytest.mark.parametrize("fragments", [1, 4])
def test_pinned_host_copies_fill_blocks_that_torchs_rounding_leaves_little_of_unused(fragments):
    # torch's pinned host allocator rounds each block up to a power of two:
    # a 1.5 B-parameter model's fragments each in one flat buffer would pin
    # 39% more than they hold; packed in blocks, 4% (1 fragment) to 11% (4).
    from mend._staging import PINNED_BLOCK_BYTES, _pinned_size, pack_blocks
    sizes = qwen2_tensor_bytes()
    assert sum(sizes) // 4 == 1_543_714_304
    pinned = flat = 0
    for fragment in range(fragments):
        mine = [n for i, n in enumerate(sizes) if i % fragments == fragment]
        blocks = pack_blocks(mine)
        assert sorted(k for block in blocks for k in block) == list(range(len(mine)))  # each once
        for block in blocks:
            used = sum(mine[k] for k in block)
            assert used <= max(PINNED_BLOCK_BYTES) or len(block) == 1
            pinned += _pinned_size(used)
        flat += _pinned_size(sum(mine))
    assert pinned <= (1.05 if fragments == 1 else 1.12) * sum(sizes)
    assert flat >= 1.3 * sum(sizes)  # (what one flat buffer per fragment pinned)
    assert [_pinned_size(n) for n in (1, 2, 3, 4096, 4097)] == [1, 2, 4, 4096, 8192]


def test_bfloat16_parameters_go_through_staging_and_agree():
    models, _, stats = run_job("auto", dtype=torch.bfloat16, desloc=False)
    for s in stats:
        assert s["rounds"] == 4 and s["failed_rounds"] == 0 and s["staged_parameters"] == 5
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        assert pa.dtype == torch.bfloat16
        assert torch.equal(pa, pb)


def run_concurrent(staging, dtype=torch.float32, desloc=False, steps=16, **keys):
    """Two learners (threads) of one concurrent job whose launches only read
    (outer_apply = exact) and whose rounds are taken up one step after their
    boundary (overlap_steps = 1: the same step however fast they arrive),
    unless ``keys`` say otherwise: their models and stats, after the final
    merge."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=4,
                                 fragments=2, concurrent_outer_step=True, outer_apply="exact", overlap_steps=1,
                                 total_steps=steps, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                 host_staging=staging, quorum_timeout_ms=20000, log_level="warn").replace(**keys)
        if desloc:
            # (DES-LOC runs with one fragment: a round every 2 steps, as 2 fragments of H = 4 had)
            config = config.replace(desloc=True, fragments=1, sync_period_steps=2, momentum_sync_period_steps=2,
                                    second_moment_sync_period_steps=4)
        models, _, runtimes = train_two(config, lambda p: torch.optim.AdamW(p, lr=0.02), steps,
                                        f"later-{staging}", dtype)
        stats = [r.stats() for r in runtimes]
        assert not run_in_threads(lambda i: mend.mend_shutdown(models[i]), 2)
    return models, stats


def test_a_launch_made_at_the_next_optimizer_step_gives_the_bits_of_in_place(monkeypatch):
    """Staged, a launch that only reads is made at the next optimizer step
    (its copies and snapshot beside the next forward and backward); in place
    at its own. The rounds must be the same, bit for bit. (tau = 1 makes
    two runs comparable, and a round due at the next step is made at once by
    default, test_a_launch_is_made_later_only_when_its_round_keeps_a_step_to_overlap:
    here every launch that only reads is made later, as with tau >= 2.)"""
    monkeypatch.setattr(mend._torch, "STEP_DUE_NEXT", 0)
    in_place, in_place_stats = run_concurrent("auto")
    staged, staged_stats = run_concurrent("always")
    for s in in_place_stats:
        assert s["deferred_steps"] == 0 and s["failed_rounds"] == 0 and s["rounds"] >= 6
    for s in staged_stats:
        assert s["deferred_steps"] >= 6 and s["failed_rounds"] == 0 and s["rounds"] >= 6
    for a, b in zip(in_place, staged):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    for pa, pb in zip(staged[0].parameters(), staged[1].parameters()):
        assert torch.equal(pa, pb)  # the final merge


def test_bfloat16_parameters_and_moments_take_launches_to_the_next_optimizer_step(monkeypatch):
    """bfloat16 parameters (and so AdamW moments) go through staging
    whatever host_staging says, moments included with DES-LOC: their
    launches are made later too, and the learners end equal."""
    monkeypatch.setattr(mend._torch, "STEP_DUE_NEXT", 0)  # (as tau >= 2 would)
    models, stats = run_concurrent("auto", dtype=torch.bfloat16, desloc=True)
    for s in stats:
        assert s["deferred_steps"] >= 6 and s["failed_rounds"] == 0 and s["moment_syncs"] >= 4
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        assert pa.dtype == torch.bfloat16
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("tau", [1, 2])
def test_a_launch_is_made_later_only_when_its_round_keeps_a_step_to_overlap(tau):
    """A launch that only reads is made at the next optimizer step only when
    its round is not due right then (tau >= 2): with tau = 1 the step after
    the boundary would wait for the whole round, which the launch made at
    once overlaps with that step's forward and backward."""
    models, stats = run_concurrent("always", steps=32, sync_period_steps=8, overlap_steps=tau)
    for s in stats:
        assert s["failed_rounds"] == 0 and s["rounds_started"] >= 6
        # Every launch (rounds every 4 steps, taken up by the next boundary) or none.
        assert s["deferred_steps"] == (s["rounds_started"] if tau >= 2 else 0)
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(pa, pb)  # the final merge


class FakeEvent:
    """Stands for a GPU's event after a copy back to the device: done only
    once something waited for it."""

    def __init__(self):
        self.done = False

    def synchronize(self):
        self.done = True


@pytest.mark.parametrize("mode", ["synchronous", "concurrent"])
def test_copies_are_waited_for_only_where_the_host_copies_are_read_or_written(monkeypatch, mode):
    """On a GPU the copies run on the current stream. A copy back to the
    device (after a step that wrote) is not waited for: mend may write the
    host copies again only once it has read them. A concurrent round's launch
    that only reads (outer_apply = exact) is made at the next optimizer step:
    its copies in are left running, and waited for just before it. Here the
    CPU's copies stand in, with fake events. Every step that reads the host
    copies and every call that may write them must find no copy pending; a
    step made later must still see the parameters of its own step (the next
    optimizer step has not changed them yet); after a step that wrote, a copy
    back must be left pending."""
    from mend import _staging, _torch
    from mend._native import FRAGMENTS_PLANNED, STEP_READS
    recorded = []

    def record_events(staging):
        recorded.append(FakeEvent())
        recorded[-1].owner = staging
        return [recorded[-1]]

    def wait_streams(staging):
        for event in recorded:
            if event.owner is staging:  # (the stream ran them all)
                event.done = True
        staging.in_flight.clear()

    monkeypatch.setattr(_staging.Staging, "record_events", record_events)
    monkeypatch.setattr(_staging.Staging, "wait_streams", wait_streams)
    monkeypatch.setattr(_torch, "STEP_DUE_NEXT", 0)  # (tau = 1's launches made later too, as tau >= 2's)
    seen = {"checked": 0, "left_pending": 0}
    broken = []

    def watch(runtime):
        learner = runtime._learner
        planned = [0]
        call_of = {name: getattr(learner, name) for name in ("plan_step", "step", "import_state", "shutdown")}
        # (its own stagings': the other learner's copies are its own business)
        ours = lambda: (runtime._staging, runtime._moment_staging, runtime._buffer_staging)  # noqa: E731

        def pending():
            return any(not event.done and any(event.owner is s for s in ours()) for event in recorded)

        def check(call):
            seen["checked"] += 1
            if pending():
                broken.append(f"{call} with a copy pending")
            fragments = learner.step_fragments(FRAGMENTS_PLANNED)
            for f, pairs in runtime._staging.fragments.items():
                if call == "step" and fragments[f] and any(not torch.equal(t.float(), h) for t, h in pairs):
                    broken.append(f"a step read fragment {f}'s copies after its parameters changed")

        def plan_step():
            if pending():
                seen["left_pending"] += 1  # the last step's copies back were not waited for
            planned[0] = call_of["plan_step"]()
            return planned[0]

        def step(tokens):
            if planned[0] & STEP_READS:
                check("step")
            return call_of["step"](tokens)

        def checked(name):
            def run(*args, **kwargs):
                check(name)
                return call_of[name](*args, **kwargs)
            return run

        learner.plan_step = plan_step
        learner.step = step
        learner.import_state = checked("import_state")
        learner.shutdown = checked("shutdown")

    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        keys = dict(lighthouse=lighthouse.address, quorum_min_learners=2, heartbeat_ms=50,
                    heartbeat_timeout_ms=2000, host_staging="always", log_level="warn")
        if mode == "synchronous":
            keys.update(sync_period_steps=3, concurrent_outer_step=False, momentum_sync_period_steps=3)
        else:
            keys.update(sync_period_steps=4, fragments=2, concurrent_outer_step=True, outer_apply="exact",
                        overlap_steps=1, quorum_timeout_ms=20000)
        config = mend.MendConfig(**keys)
        models, optimizers = [], []
        for seed in (1, 2):
            torch.manual_seed(seed)
            models.append(TinyLM())
            optimizers.append(torch.optim.AdamW(models[-1].parameters(), lr=0.02))
            watch(mend.mend_init(models[-1], config, f"settle-{mode}-{seed}", optimizer=optimizers[-1]))
        errors = run_in_threads(lambda i: train_steps(models[i], optimizers[i], 12, 10 + i), 2)
        assert not errors, errors
        stats = []
        for model in models:
            runtime = mend.get_runtime(model)
            state = runtime.export_state()  # (makes a step left for later first)
            if mode == "synchronous":  # (concurrent: the last launch's round is in flight)
                runtime.import_state(state)
            stats.append(runtime.stats())
        assert not run_in_threads(lambda i: mend.mend_shutdown(models[i]), 2)
    assert broken == []
    assert recorded, "no copy recorded an event"
    for s in stats:
        assert s["failed_rounds"] == 0
        if mode == "synchronous":
            assert s["deferred_steps"] == 0  # (its rounds write at their step)
        else:
            # Every launch (the last at the export) was made later.
            assert s["deferred_steps"] >= 5 and s["rounds"] >= 5
    # Boundaries (their steps read), an import and a shutdown each: every one checked.
    assert seen["checked"] >= 2 * 6
    assert seen["left_pending"] >= 2 * 3  # after steps that wrote, the copies back were left running
    if mode == "synchronous":
        for pa, pb in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(pa, pb)


def run_groups(tmp_path, staging):
    """2 learners x 2 torchrun ranks (group_learner.py); every rank's digests after each round."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        path = child_pythonpath()
        env = dict(os.environ, MEND_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1", PYTHONPATH=path)
        procs = []
        for learner in (1, 2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
                 "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                 os.path.join(HERE, "group_learner.py"), "--lighthouse", lighthouse.address,
                 "--learner", str(learner), "--steps", "15", "--host-staging", staging,
                 "--out", str(tmp_path / f"{staging}-l{learner}-%r.json")],
                env=env, cwd=HERE))
        for proc in procs:
            assert proc.wait(timeout=180) == 0
    return {(l, r): json.loads((tmp_path / f"{staging}-l{l}-{r}.json").read_text()) for l in (1, 2) for r in (0, 1)}


def test_a_group_with_staging_always_keeps_the_bits_of_in_place(tmp_path):
    in_place = run_groups(tmp_path, "auto")
    staged = run_groups(tmp_path, "always")
    for key in in_place:
        assert [r["digest"] for r in in_place[key]["rounds"]] == [r["digest"] for r in staged[key]["rounds"]], key
        assert len(staged[key]["rounds"]) == 3
    # Every replica of both learners holds the same model after each round.
    assert len({tuple(r["digest"] for r in s["rounds"]) for s in staged.values()}) == 1


def test_concurrent_rounds_stage_only_their_own_fragment():
    """fragments = 4, concurrent: a boundary copies in its fragment alone and
    the round taken up copies back its fragment alone (staging by fragment,
    mend_learner_step_fragments); the final merge makes both learners equal."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=8,
                                 fragments=4, concurrent_outer_step=True, overlap_steps=1, total_steps=24,
                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, host_staging="always",
                                 quorum_timeout_ms=20000, log_level="warn")
        models, _, runtimes = train_two(config, lambda p: torch.optim.SGD(p, lr=0.05), 24, "by-fragment")
        stats = [r.stats() for r in runtimes]
        # The final merge is the learners' round: both shut down at once.
        assert not run_in_threads(lambda i: mend.mend_shutdown(models[i]), 2)
    sizes = [p.numel() for p in models[0].parameters()]
    fragment_bytes = [4 * sum(n for i, n in enumerate(sizes) if i % 4 == f) for f in range(4)]
    for s in stats:
        assert s["rounds"] >= 8 and s["staged_parameters"] == 5
        # Before the final merge (whole-model copies at shutdown, not in these stats'
        # steps), every copy was of one fragment: at most the largest one's bytes.
        assert 0 < s["staging_bytes"] <= s["staging_copies"] * max(fragment_bytes)
        assert s["staging_bytes"] < s["staging_copies"] * sum(fragment_bytes)
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        assert torch.isfinite(pa).all()
        assert torch.equal(pa, pb)  # the final merge


def test_a_conversion_through_scratch_gives_the_bits_of_a_whole_copy():
    """The snapshot on a side stream converts a bfloat16 or float16 tensor to
    float32 through a scratch buffer a chunk at a time: tensors smaller than,
    as large as, and several times and a part the scratch's size."""
    from mend import _staging
    torch.manual_seed(0)
    scratch = torch.empty(64)
    for dtype in (torch.bfloat16, torch.float16):
        tensors = [torch.randn(shape).to(dtype) for shape in [(3,), (64,), (8, 8), (5, 41), (1000,)]]
        hosts = [torch.full(t.shape, float("nan")) for t in tensors]
        _staging._convert_through(list(zip(hosts, tensors)), scratch)
        for host, tensor in zip(hosts, tensors):
            assert torch.equal(host, tensor.float())


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))

    def synchronize(self):
        self.log.append(("synchronize", self.name))


def test_the_snapshot_at_a_boundary_goes_on_a_side_stream_after_the_step(monkeypatch):
    """A GPU's copies in that are left running (the snapshot at a boundary)
    go on mend's side stream: it first waits for the device's current stream
    (the optimizer step that made the values), every copy and conversion is
    made while the side stream is current, and the event the caller waits for
    is recorded on it, after them. The buffers' staging (a forward may write
    them) and copies that are waited for stay on the current stream. Stands
    in for CUDA with CPU tensors, fake streams and events."""
    from mend import _staging
    log = []
    current = FakeStream(log, "current")
    state = {"stream": current}

    class FakeEventOnStream:
        def record(self, stream):
            log.append(("record", stream.name))

        def synchronize(self):
            log.append(("event synchronize",))

    class StreamContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            self.saved, state["stream"] = state["stream"], self.stream

        def __exit__(self, *exc):
            state["stream"] = self.saved

    monkeypatch.setattr(_staging, "_SIDE_STREAMS", {})
    monkeypatch.setattr(_staging, "_on_gpu", lambda device: True)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream(log, f"side{device}"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(torch.cuda, "Event", FakeEventOnStream)
    copy_all, convert_through = _staging._copy_all, _staging._convert_through
    monkeypatch.setattr(_staging, "_copy_all", lambda *a: (log.append(("copy", state["stream"].name)),
                                                        copy_all(*a)))
    monkeypatch.setattr(_staging, "_convert_through", lambda *a: (log.append(("convert", state["stream"].name)),
                                                                convert_through(*a)))

    def staged(aside):
        staging = _staging.Staging(aside)
        tensors = [torch.randn(5).bfloat16(), torch.randn(7), torch.randn(3).half()]
        staging.add_all([(t, 0) for t in tensors])
        staging.devices = {torch.device("cuda", 0)}  # (as a GPU's would have)
        for t in tensors:
            t.mul_(2)  # (the optimizer step: the copies must hold these values)
        return staging, tensors

    staging, tensors = staged(True)
    del log[:]
    events = staging.copy_in(None, wait=False)
    assert log == [("wait", "side0", "current"), ("copy", "side0"), ("convert", "side0"), ("record", "side0")]
    assert len(events) == 1 and state["stream"] is current
    for t, (_, host) in zip(tensors, staging.pairs):
        assert torch.equal(host, t.float())
    # Waiting for every copy includes the side stream's.
    del log[:]
    staging.wait_streams()
    assert ("synchronize", "side0") in log and ("synchronize", "current") in log
    # The same stream again, not a second one.
    del log[:]
    staging.copy_in(None, wait=False)
    assert log[0] == ("wait", "side0", "current") and len(_staging._SIDE_STREAMS) == 1

    # The buffers' staging, and a copy in that is waited for: the current stream.
    for aside, wait in ((False, False), (True, True)):
        staging, tensors = staged(aside)
        del log[:]
        staging.copy_in(None, wait=wait)
        assert ("copy", "current") in log
        assert not [entry for entry in log if entry[0] in ("wait", "copy", "convert", "record") and "side0" in entry]
        assert ("record", "current") in log if not wait else ("synchronize", "current") in log
