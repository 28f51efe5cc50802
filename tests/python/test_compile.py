"""torch.compile: mend_init on a compiled module names the parameters as the
module does (no ``_orig_mod.``), so a compiled and an uncompiled learner
are in one job, end a synchronous round bit-identical, and take each
other's state (export_state / import_state by name). torch >= 2.0, on the
CPU (inductor compiles with the machine's g++)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile"):
    pytest.skip("torch.compile is torch >= 2.0", allow_module_level=True)

import mend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import run_in_threads  # noqa: E402
from learner import TinyLM, train_steps  # noqa: E402

TOKEN = "compile-test-token-0123456789"


def test_a_compiled_and_an_uncompiled_learner_share_names_rounds_and_state():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=3,
                                 concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                 quorum_timeout_ms=120000, log_level="warn")
        torch.manual_seed(1)
        plain = TinyLM()
        torch.manual_seed(1)
        compiled = torch.compile(TinyLM())
        models = [compiled, plain]
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        runtimes = [mend.mend_init(m, config, f"compile-{i}", optimizer=o)
                    for i, (m, o) in enumerate(zip(models, optimizers))]
        names = [r._learner.names for r in runtimes]
        assert names[0] == names[1] == [name for name, _ in plain.named_parameters()]

        def learn(i):
            train_steps(models[i], optimizers[i], 6, 10 + i)

        errors = run_in_threads(learn, 2, timeout=600)
        assert not errors, errors
        stats = [r.stats() for r in runtimes]
        # The last step ended a synchronous round: both hold its result.
        for pa, pb in zip(compiled.parameters(), plain.parameters()):
            assert torch.equal(pa, pb)
        # The compiled learner's state is the uncompiled one's, by name.
        state = runtimes[0].export_state()
        runtimes[1].import_state(state)
        for m in models:
            mend.mend_shutdown(m)
    assert all(s["rounds"] == 2 and s["failed_rounds"] == 0 for s in stats)
