"""mend in processes with another allocator preloaded, as many PyTorch users
run (LD_PRELOAD of jemalloc or tcmalloc) and as glibc's malloc checker
debugs: a two-learner job (allocator_job.py) whose learners import mend and
torch in both orders, every process (lighthouse, learners) exiting 0, the
learners bit-identical. The suite runs it for the package in the build tree
under Debian's torch and the torch 2 venv, and for the wheel installed into
the torch 2 venv (scripts/test.sh)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARIES = "/usr/lib/x86_64-linux-gnu"
ALLOCATORS = {  # (Debian's packages: libjemalloc2, libtcmalloc-minimal4, libc6)
    "jemalloc": ("libjemalloc.so.2", {}),
    "tcmalloc": ("libtcmalloc_minimal.so.4", {}),
    "glibc-checker": ("libc_malloc_debug.so.0", {"MALLOC_CHECK_": "3"}),
}


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_a_job_runs_with_a_preloaded_allocator_whatever_the_import_order(allocator):
    library, extra = ALLOCATORS[allocator]
    path = os.path.join(LIBRARIES, library)
    assert os.path.exists(path), f"{path} is missing: scripts/setup.sh installs it"
    env = dict(os.environ, LD_PRELOAD=path, PYTHONDONTWRITEBYTECODE="1", **extra)
    run = subprocess.run([sys.executable, os.path.join(HERE, "allocator_job.py"), "job"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    output = run.stdout.decode(errors="replace")
    assert run.returncode == 0, f"exit {run.returncode} under {library}:\n{output[-6000:]}"
    assert "bit-identical" in output, output[-3000:]


def test_a_torch_loaded_into_the_global_scope_with_a_gloo_of_its_own_is_named_not_crashed():
    # TORCH_USE_RTLD_GLOBAL=1 puts torch's libraries into the global scope. A
    # pip torch carries a Gloo of its own inside libtorch_cpu.so, which would
    # stand in for libmend's: mend refuses at import, naming what to do. Debian's
    # torch links Debian's libgloo, the one libmend uses: mend works with it.
    import torch
    bundles_gloo = not torch.__file__.startswith("/usr/lib/python3/dist-packages/")  # (not Debian's)
    env = dict(os.environ, TORCH_USE_RTLD_GLOBAL="1")
    code = "import torch, mend; print('loaded', mend.__version__)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if bundles_gloo:
        assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
        assert "ImportError: mend: this process's global symbol scope already holds Gloo" in run.stderr, run.stderr
        assert "Import mend before torch, or unset TORCH_USE_RTLD_GLOBAL" in run.stderr
    else:
        assert run.returncode == 0 and "loaded" in run.stdout, (run.returncode, run.stdout, run.stderr)
    mend_first = subprocess.run([sys.executable, "-c", "import mend, torch; print('loaded')"], env=env,
                                capture_output=True, text=True, timeout=120)
    assert mend_first.returncode == 0 and "loaded" in mend_first.stdout, mend_first.stderr
