"""A learner of several ranks under torch.distributed: its group (size and
rank from the default process group unless the config sets them), its
store and its learner id, passed from group rank 0 to the others once.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from mend import _native
from mend._config import MendConfig
from mend._learner import GroupStore, default_learner_id, read_token


def _torch_group() -> Optional[Tuple[int, int]]:
    """(world size, rank) of torch.distributed's default group, when there is one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_world_size(), dist.get_rank()
    return None


def with_group(config: MendConfig) -> MendConfig:
    """The learner's group: the config's group_size, else (under torchrun with a
    process group) every rank of torch.distributed's default group."""
    given: Dict[str, Any] = {}
    group = _torch_group()
    if config.group_size == 1 and "group_size" not in config._given and group is not None:
        given["group_size"], given["group_rank"] = group
    elif config.group_size > 1 and "group_rank" not in config._given and group is not None:
        given["group_rank"] = group[1]
    return config.replace(**given) if given else config


# mend_init's shares completed in this process, by group rank (a share that
# timed out is not counted, so that its retry meets rank 0's keys): the same
# sequence on every rank keys each share apart.
_group_shares: Dict[int, int] = {}


def _share_from_rank0(config: MendConfig, values: Dict[str, str]) -> Dict[str, str]:
    """Rank 0's `values` on every rank of the group, once, through a store
    of torch.distributed: the default process group's when it is the group,
    else torchrun's (MASTER_ADDR:MASTER_PORT). A rank waits up to
    quorum_timeout_ms for rank 0's: a rank that never calls mend_init (one
    guarded by ``if rank == 0``) must not hold the others for ever."""
    import torch.distributed as dist
    from datetime import timedelta
    timeout = timedelta(milliseconds=config.quorum_timeout_ms)
    store = None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == config.group_size:
        default_store = getattr(dist.distributed_c10d, "_get_default_store", None)
        store = default_store() if default_store is not None else None
        if store is None:  # (a torch without it: one broadcast, which waits as the process group does)
            box = [values if config.group_rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            return box[0]
    else:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not (host and port):
            raise ValueError(
                f"mend_init: a learner of group_size = {config.group_size} needs group_store (rank 0's address, "
                "on every rank), or torch.distributed initialized over the group's ranks, or torchrun's "
                "MASTER_ADDR and MASTER_PORT, to pass rank 0's store address and learner id to the other ranks")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"mend/{config.job_id}/group/{config.group_generation}.{restart}/{_group_shares.get(config.group_rank, 0)}/"
    keys = [prefix + key for key in values]
    if config.group_rank == 0:
        for key, value in zip(keys, values.values()):
            store.set(key, value)
    else:
        try:
            store.wait(keys, timeout)
        except RuntimeError as error:  # (torch's DistStoreError is one)
            raise _native.ERRORS[4](
                f"mend_init: group rank 0 of this learner (group_size = {config.group_size}) did not call "
                f"mend_init within quorum_timeout_ms = {config.quorum_timeout_ms}. Every rank of a learner "
                "calls mend_init (under torchrun every rank of the default process group is one, unless the "
                f"config sets group_size). ({error})") from None
    shared = {key: store.get(full).decode() for key, full in zip(values, keys)}
    _group_shares[config.group_rank] = _group_shares.get(config.group_rank, 0) + 1
    return shared


def join_group(config: MendConfig, learner_id: Optional[str]) -> Tuple[MendConfig, str, Optional[GroupStore]]:
    """For a learner of several ranks: its store (served by rank 0 unless the
    config names one) and its id, agreed by every rank."""
    if config.group_size <= 1:
        return config, str(learner_id or default_learner_id()), None
    server = None
    if config.group_store and learner_id:
        return config, str(learner_id), None
    values = {"learner_id": str(learner_id or default_learner_id()), "group_store": config.group_store}
    if config.group_rank == 0 and not config.group_store:
        server = GroupStore(config, read_token(config), f"{config.dataplane_host}:0")
        values["group_store"] = server.address
    try:
        shared = _share_from_rank0(config, values if config.group_rank == 0 else {k: "" for k in values})
    except BaseException:
        if server is not None:
            server.stop()
        raise
    if not config.group_store:
        config = config.replace(group_store=shared["group_store"])
    return config, str(learner_id or shared["learner_id"]), server
