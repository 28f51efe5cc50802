"""Two learners of one job over numpy arrays, with no torch in the process
(any import of torch fails): mend.Learner, an embedded mend.Lighthouse, two
threads. Prints a JSON line with what it saw."""
import json
import sys
import threading

sys.modules["torch"] = None  # `import torch` anywhere now raises ImportError

import numpy as np  # noqa: E402

import mend  # noqa: E402

TOKEN = "numpy-test-token-0123456789"


def main():
    config = mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, sync_period_steps=4,
                             concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                             log_level="warn")
    lighthouse = mend.Lighthouse(config, token=TOKEN)
    config = config.replace(lighthouse=lighthouse.address)
    rng = [np.random.default_rng(seed) for seed in (1, 2)]
    params = [{"w": r.standard_normal((8, 4)).astype(np.float32), "b": np.zeros(4, np.float32)} for r in rng]
    learners = [mend.Learner(config, list(p.items()), f"numpy-{i}", token=TOKEN) for i, p in enumerate(params)]
    after_rounds = [[], []]
    errors = []

    def train(i):
        try:
            target = np.full((8, 4), float(i + 1), np.float32)
            for step in range(1, 13):
                params[i]["w"] -= np.float32(0.1) * (params[i]["w"] - target)  # in place: mend sees it
                params[i]["b"] += np.float32(0.01)
                learners[i].step(32)
                if step % 4 == 0:
                    after_rounds[i].append(params[i]["w"].tobytes().hex())
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stats = [learner.stats() for learner in learners]
    phases = [learner.round_phases() for learner in learners]
    globals_ = [learner.global_state().tobytes().hex() for learner in learners]
    state = learners[0].export_state()
    for learner in learners:
        learner.shutdown()
    lighthouse.shutdown()
    print(json.dumps({"errors": errors, "stats": stats, "phases": phases, "after_rounds": after_rounds,
                      "globals": globals_,
                      "state_bytes": len(state), "torch_loaded": sys.modules.get("torch") is not None,
                      "version": mend.__version__}))


if __name__ == "__main__":
    main()
