"""FSDP2's fully_shard after mend_init (run by test_replaced_storage.py in a
process of its own): every parameter becomes a DTensor of new storage, so
the step at the first boundary and mend_shutdown refuse by name. Exit 77:
this torch has no FSDP2."""
import os
import socket
import sys

import torch

import mend


def main():
    try:
        from torch.distributed import fsdp
    except Exception as error:  # noqa: BLE001 (torch 1.13's fails to import on Python 3.11)
        print(f"torch.distributed.fsdp does not import here: {error}")
        return 77
    if not hasattr(fsdp, "fully_shard"):
        print("this torch has no FSDP2 (fully_shard)")
        return 77
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                             log_level="warn")) as lighthouse:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
            # (group_size=1: the process group is FSDP's, not a learner's ranks.) manual=True:
            # the optimizer made for the sharded parameters is not one mend_init saw.
            config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=2,
                                     group_size=1, log_level="warn")
            runtime = mend.mend_init(model, config, "fsdp2", manual=True)
            fsdp.fully_shard(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            refused = None
            try:
                for s in range(2):
                    x = torch.sin(torch.arange(32, dtype=torch.float32) + s).reshape(4, 8)
                    loss = (model(x) - 1).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    runtime.step(4)
            except mend.FailedPreconditionError as error:
                refused = str(error)
            assert refused and "a DTensor" in refused and "mend_init" in refused, refused
            assert runtime.stats()["steps"] == 1  # (the boundary's step was refused)
            try:
                mend.mend_shutdown(model)
                raise AssertionError("mend_shutdown did not refuse")
            except mend.FailedPreconditionError as error:
                assert "parameter '0.weight'" in str(error), error
            print("refused: " + refused.split(" is not")[0].replace("mend: ", ""))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
