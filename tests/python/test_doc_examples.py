"""The complete examples of docs/python.md ("Trainers: transformers,
Accelerate, Lightning"), run as they are written there: each block marked
``<!-- example: NAME -->`` as a learner's script, two learners of one job,
with the lighthouse's address, the token and the learner id in the
environment as the docs say."""
import os
import re
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import run_processes  # noqa: E402

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "python.md")
TOKEN = "doc-examples-token-0123456789"
NEEDS = {"transformers": "transformers", "accelerate": "accelerate", "lightning": "pytorch_lightning"}


def examples():
    with open(DOCS) as f:
        text = f.read()
    return dict(re.findall(r"<!-- example: (\w+) -->\n```python\n(.*?)```", text, re.S))


def test_the_docs_have_every_example():
    assert sorted(examples()) == sorted(NEEDS)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_a_docs_example_trains_two_learners_to_the_same_model(name, tmp_path):
    pytest.importorskip(NEEDS[name])
    script = tmp_path / f"train_{name}.py"
    script.write_text(examples()[name])
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         log_level="warn")) as lighthouse:
        env = dict(os.environ, MEND_LIGHTHOUSE=lighthouse.address, MEND_JOB_TOKEN=TOKEN,
                   MEND_DATAPLANE_HOST="127.0.0.1", MEND_LOG_LEVEL="warn", ACCELERATE_USE_CPU="1",
                   PYTHONDONTWRITEBYTECODE="1")
        outputs = run_processes([([sys.executable, str(script)],
                                  {"cwd": tmp_path, "env": dict(env, MEND_LEARNER_ID=learner)})
                                 for learner in ("a", "b")])
    stats = []
    for output in outputs:
        line = [text for text in output.splitlines() if text.startswith("mend: ")]
        assert line, output[-3000:]
        stats.append(eval(line[-1][len("mend: "):], {}))  # (a dict of numbers, as printed)
    for s in stats:
        assert s["rounds"] >= 2 and s["failed_rounds"] == 0, s
        assert s["tokens"] > 0
    if name == "transformers":  # the saved merged models are the same
        from safetensors.torch import load_file
        a, b = (load_file(str(tmp_path / f"out-hf-{learner}" / "final" / "model.safetensors")) for learner in "ab")
        assert sorted(a) == sorted(b)
        assert all(torch.equal(a[key], b[key]) for key in a)
