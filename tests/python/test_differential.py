"""mend's synchronous fp32 DiLoCo against DiLoCo written in plain
torch.distributed (examples/train_gpt.py --mode diloco-torch): the same
script, model, data, seeds and schedule; after 3 rounds the parameters must
agree within float tolerance. The first round is an outer warm-up round
(plain averaging), the next two take the outer Nesterov step."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")  # python3-torch; the torch-less tests are the numpy ones

from job_processes import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_gpt.py")


def train(mode, tmp_path):
    out = tmp_path / f"{mode}.pt"
    env = dict(os.environ, MEND_JOB_TOKEN="differential-token-0123456789")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
         "--nproc_per_node", "2", "--master_port", str(free_port()), EXAMPLE, "--mode", mode,
         "--steps", "30", "--sync-every", "10", "--dim", "32", "--layers", "1", "--heads", "2",
         "--context", "32", "--batch", "4", "--eval-batches", "2", "--outer-warmup-steps", "10",
         "--save-params", str(out)],
        env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return torch.load(out)


def test_mend_matches_plain_pytorch_diloco_after_three_rounds(tmp_path):
    mend = train("mend", tmp_path)
    plain = train("diloco-torch", tmp_path)
    local = train("local", tmp_path)
    assert mend.keys() == plain.keys()
    for name in mend:
        assert torch.allclose(mend[name], plain[name], rtol=1e-5, atol=1e-6), name
    # The exchange did something: training alone ends elsewhere.
    assert any(not torch.allclose(mend[n], local[n], atol=1e-4) for n in mend)
