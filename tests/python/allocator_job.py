"""A two-learner job in which every process imports mend and torch in the
order it is told, for a process with an allocator preloaded (LD_PRELOAD:
jemalloc, tcmalloc, glibc's malloc checker) as a user's would have:

    allocator_job.py job                      the lighthouse, and the two learners:
                                              learner-a imports mend first, learner-b torch
    allocator_job.py learner ID ORDER ADDRESS OUT

Each learner trains a small model (H = 2, 6 steps, total_steps = 6), calls
mend_shutdown and writes its parameters; the job checks that every process
exited 0 and that the learners ended bit-identical. Exits 0 when all held.
"""
import json
import os
import subprocess
import sys
import tempfile

TOKEN = "allocator-test-token-0123456789"


def imported(order):
    """mend and torch, imported in ``order`` ("mend" first, or "torch" first)."""
    if order == "mend":
        import mend
        import torch
    else:
        import torch
        import mend
    return mend, torch


def learner(learner_id, order, address, out):
    mend, torch = imported(order)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = mend.MendConfig(lighthouse=address, quorum_min_learners=2, sync_period_steps=2, total_steps=6,
                             concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=5000,
                             log_level="warn", dataplane_host="127.0.0.1")
    runtime = mend.mend_init(model, config, learner_id, optimizer=optimizer)
    generator = torch.Generator().manual_seed(sum(map(ord, learner_id)))
    for _ in range(6):
        x = torch.randint(0, 32, (8,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mend.mend_shutdown(model)
    stats = runtime.stats()
    with open(out, "w") as f:
        json.dump({"parameters": [p.detach().reshape(-1).tolist() for p in model.parameters()],
                   "rounds": stats["rounds"], "steps": stats["steps"]}, f)


def job():
    mend, _ = imported("mend")
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    here = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as work, \
            mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                            heartbeat_timeout_ms=5000, log_level="warn")) as lighthouse:
        outs = {name: os.path.join(work, f"{name}.json") for name in ("learner-a", "learner-b")}
        processes = [subprocess.Popen([sys.executable, here, "learner", name, order, lighthouse.address, outs[name]])
                     for name, order in (("learner-a", "mend"), ("learner-b", "torch"))]
        codes = [process.wait(timeout=240) for process in processes]
        if codes != [0, 0]:
            print(f"allocator job: the learners exited {codes}", file=sys.stderr)
            return 1
        seen = [json.load(open(outs[name])) for name in sorted(outs)]
    if seen[0]["parameters"] != seen[1]["parameters"] or [s["steps"] for s in seen] != [6, 6]:
        print(f"allocator job: the learners ended apart: {[(s['steps'], s['rounds']) for s in seen]}",
              file=sys.stderr)
        return 1
    print(f"allocator job under LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}: both learners "
          f"{seen[0]['rounds']} rounds, bit-identical")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "learner":
        learner(*sys.argv[2:6])
    else:
        sys.exit(job())
