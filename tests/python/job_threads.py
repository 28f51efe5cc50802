"""What the in-process Python tests share: learners on threads of this process."""
import threading
import time


def learner_state(lighthouse, learner_id):
    """The lighthouse's word on ``learner_id`` ("waiting", "training", ...; "" when unknown)."""
    for learner in lighthouse.status()["learners"]:
        if learner["id"] == learner_id:
            return learner["state"]
    return ""


def wait_for(condition, timeout=60.0):
    """Checks ``condition`` every 20 ms until it holds (True) or ``timeout`` s pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def run_in_threads(work, count, timeout=120):
    """Runs work(i) for i in range(count), each on a thread of its own (a
    round needs them all at once); returns the exceptions they raised."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except Exception as error:  # noqa: BLE001 (reported to the test)
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert all(not thread.is_alive() for thread in threads), f"a learner's thread ran past {timeout} s"
    return errors


def train_then_leave(models, learn, timeout=120):
    """Runs learn(i) for every model at once (run_in_threads), then returns
    each one's runtime stats and shuts each down (mend_shutdown)."""
    import mend
    errors = run_in_threads(learn, len(models), timeout)
    assert not errors, errors
    stats = [mend.get_runtime(m).stats() for m in models]
    for m in models:
        mend.mend_shutdown(m)
    return stats


def assert_same_moments(models, optimizers):
    """Both learners' Adam optimizers hold equal moments, parameter by parameter."""
    import torch
    for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
        s0, s1 = optimizers[0].state[p0], optimizers[1].state[p1]
        assert torch.equal(s0["exp_avg"], s1["exp_avg"])
        assert torch.equal(s0["exp_avg_sq"], s1["exp_avg_sq"])


def run_processes(commands, timeout=300):
    """Starts every (argv, Popen keywords) at once, stdout and stderr
    together; waits for all (killing any still running after `timeout` s)
    and returns each one's output, asserting that each exited 0."""
    import subprocess
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **keywords)
                 for argv, keywords in commands]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for i, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, f"process {i} exited {process.returncode}:\n{output[-6000:]}"
    return outputs
