"""Under torchrun, two ranks of one process group, where only one rank calls
mend_init at a time (a user's ``if rank == 0:`` around it): first rank 0
alone, then rank 1 alone. Each call must end within quorum_timeout_ms with
an error that says what is missing, not wait for ever in a collective.
Writes each call's error, by rank, to --out (%r becomes the rank)."""
import argparse
import json
import os

import torch
import torch.distributed as dist

import mend


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = {}
    for caller in (0, 1):
        if rank == caller:
            config = mend.MendConfig(lighthouse=args.lighthouse, job_id=f"alone-{caller}", quorum_timeout_ms=3000,
                                     log_level="error")
            try:
                mend.mend_init(torch.nn.Linear(4, 1), config, "partial")
                seen[caller] = {"error": None}
            except mend.MendError as error:
                seen[caller] = {"error": type(error).__name__, "message": str(error)}
        dist.barrier()  # (the other rank waits here until the caller's mend_init has ended)
    with open(args.out.replace("%r", str(rank)), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
