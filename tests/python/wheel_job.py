"""A two-learner job of learner.py processes under this interpreter (the
wheel test runs it from a venv): prints the mend it used and checks that
the learners agree after every round."""
import json
import os
import subprocess
import sys
import tempfile

import mend

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "wheel-test-token-0123456789"


def main():
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with tempfile.TemporaryDirectory() as work, \
            mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                            heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")) as lh:
        outs = [os.path.join(work, f"{name}.json") for name in ("a", "b")]
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "learner.py"), "--lighthouse", lh.address,
                                   "--id", f"wheel-{i}", "--seed", str(i + 1), "--out", out])
                 for i, out in enumerate(outs)]
        codes = [proc.wait(timeout=120) for proc in procs]
        assert codes == [0, 0], codes
        seen = [json.load(open(out)) for out in outs]
    assert all(s["stats"]["rounds"] == 8 for s in seen), [s["stats"] for s in seen]
    assert seen[0]["globals"] == seen[1]["globals"]
    print(f"wheel job: mend {mend.__version__} from {mend.__file__}, library {mend._native.LIBRARY_PATH}, "
          f"8 rounds, learners bit-identical")


if __name__ == "__main__":
    main()
