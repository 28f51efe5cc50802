"""What the Python tests that start learner processes (torchrun) share,
and what those learners share."""
import hashlib
import os
import socket


def free_port():
    """A TCP port free on 127.0.0.1 now, for torchrun's --master_port
    (torchrun does not take port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pythonpath():
    """This process's PYTHONPATH with every entry absolute, for a child
    started in another working directory."""
    return os.pathsep.join(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)


def local(tensor):
    """A DTensor's local tensor (this rank's piece), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def digest(tensors):
    """A SHA-256 of the tensors' bytes, in order, as they are (bf16 too)."""
    import torch
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def run_torchrun_learners(script, ranks, arguments, env, cwd, log_path, timeout):
    """Learners 1 and 2, each a torchrun of `ranks` ranks of `script` with
    arguments(learner), on loopback, its output in log_path(learner); waits
    for both (`timeout` seconds each) and asserts that both exit 0, with the
    end of their logs."""
    import subprocess
    import sys
    procs = []
    for learner in (1, 2):
        with open(log_path(learner), "w") as log:  # (the child keeps its own descriptor)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                 "--master_addr", "127.0.0.1", "--master_port", str(free_port()), script, *arguments(learner)],
                env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT))
    codes = [proc.wait(timeout=timeout) for proc in procs]
    assert codes == [0, 0], [open(log_path(learner)).read()[-4000:] for learner in (1, 2)]
