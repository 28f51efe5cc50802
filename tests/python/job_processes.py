"""What the Python tests that start learner processes (torchrun) share."""
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
