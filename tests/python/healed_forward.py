"""Two learners over numpy arrays, one of which starts late and heals onto
the other's step: learner a trains 4 steps alone (rounds at 2 and 4), then
waits until learner b's first join is pending, so that a's round at step 6
heals b, whose step 2 becomes the job's step 6. Both loops run either to
the job's end (`while not learner.finished`) or for a fixed count of their
own (`for _ in range(TOTAL)`, as a loop that does not follow the job's
step). Prints a JSON line with what it saw; libmend's log goes to stderr.

    healed_forward.py finished|fixed
"""
import json
import sys
import threading
import time

import numpy as np

import mend

TOKEN = "numpy-test-token-0123456789"
PERIOD, TOTAL = 2, 12


def main():
    loop = sys.argv[1]
    # A quorum of one, and a grace window that waits for the other learner once it is alive.
    lighthouse_config = mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1, heartbeat_ms=50,
                                        heartbeat_timeout_ms=3000, grace_window_ms=120000,
                                        grace_window_adaptive=False, log_level="warn")
    lighthouse = mend.Lighthouse(lighthouse_config, token=TOKEN)
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=PERIOD,
                             total_steps=TOTAL, concurrent_outer_step=False, heartbeat_ms=50,
                             heartbeat_timeout_ms=3000, quorum_timeout_ms=30000, log_level="info")
    a_is_ahead = threading.Event()
    seen = {"errors": [], "iterations": {}, "stats": {}, "final": {}, "finished_before": {}, "finished_after": {}}

    def b_is_waiting():
        learners = mend.status(lighthouse.address, TOKEN)["learners"]
        return any(learner["id"] == "b" and learner["state"] == "waiting" for learner in learners)

    def train(name):
        try:
            w = np.full(16, 1.0 if name == "a" else 5.0, np.float32)
            if name == "b":
                a_is_ahead.wait(timeout=60)
            learner = mend.Learner(config, [("w", w)], name, token=TOKEN)
            seen["finished_before"][name] = learner.finished
            iterations = 0
            while (not learner.finished) if loop == "finished" else iterations < TOTAL:
                if name == "a" and iterations == 4:
                    a_is_ahead.set()
                    deadline = time.monotonic() + 60
                    while not b_is_waiting():
                        assert time.monotonic() < deadline, "b's join never showed as waiting"
                        time.sleep(0.01)
                w -= np.float32(0.01) * np.float32(iterations + 1)
                learner.step(100)
                iterations += 1
            seen["iterations"][name] = iterations
            seen["stats"][name] = learner.stats()
            learner.shutdown()
            seen["finished_after"][name] = learner.finished  # (the final counters)
            seen["final"][name] = w.tobytes().hex()
        except Exception as error:  # noqa: BLE001 (reported to the test)
            seen["errors"].append(f"{name}: {error!r}")
            a_is_ahead.set()

    threads = [threading.Thread(target=train, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    lighthouse.shutdown()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
