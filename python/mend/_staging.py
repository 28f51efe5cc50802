"""Host staging for a torch learner: float32 host copies of the parameters
that mend cannot use in place (on a GPU or another device, bfloat16 or
float16; all of them with host_staging = "always"), pinned for a GPU, in
blocks that pin little more than they hold; copies in and out, batched,
on a side stream where the device has one.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch

# Batched copies between a staged tensor and its host copy where torch has them.
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


# torch's allocator of pinned (page-locked) host memory rounds every block up
# to a power of two: a fragment's host copies in one flat buffer of 6.2 GB (a
# 1.5 B-parameter model) would pin 8.6 GB. Pinned copies go into blocks of at
# most one of these sizes instead (a larger tensor's alone), filled first fit
# in decreasing size, of the size that pins the least.
PINNED_BLOCK_BYTES = (1 << 28, 1 << 29, 1 << 30)


def pack_blocks(sizes: List[int], blocks: Tuple[int, ...] = PINNED_BLOCK_BYTES) -> List[List[int]]:
    """The indices of ``sizes`` (bytes) grouped into blocks of at most one of
    ``blocks`` bytes (a larger one alone), first fit in decreasing size; of
    the block sizes, the one whose groups pin the least; each group in
    increasing index."""
    best: List[List[int]] = []
    pinned = None
    for block in blocks:
        members: List[List[int]] = []
        room: List[int] = []
        for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
            for b, free in enumerate(room):
                if sizes[k] <= free:
                    members[b].append(k)
                    room[b] -= sizes[k]
                    break
            else:
                members.append([k])
                room.append(max(block, sizes[k]) - sizes[k])
        total = sum(_pinned_size(sum(sizes[k] for k in m)) for m in members)
        if pinned is None or total < pinned:
            best, pinned = [sorted(m) for m in members], total
    return best


# The scratch buffer, per device, through which the snapshot on a side stream
# converts a bfloat16 or float16 tensor to float32 a chunk at a time.
ASIDE_SCRATCH_BYTES = 64 << 20
_SIDE_STREAMS: Dict[int, Any] = {}  # a CUDA device's index: mend's side stream there


def _on_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def _side_stream(device: torch.device) -> Any:
    """mend's side stream on a CUDA device (made at its first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def _copy_all(into: List[torch.Tensor], out_of: List[torch.Tensor]) -> None:
    """One batched copy where torch has it (torch >= 2.2), else one per tensor;
    asynchronous where torch can make it so (a GPU's, with pinned host memory)."""
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(into, out_of, non_blocking=True)
    else:
        for target, source in zip(into, out_of):
            target.copy_(source, non_blocking=True)


def _convert_through(pairs: List[Tuple[torch.Tensor, torch.Tensor]], scratch: torch.Tensor) -> None:
    """Each (host, tensor) pair's tensor into its host copy of another dtype,
    converted into ``scratch`` (on the tensor's device) a chunk at a time and
    copied from there: no device memory beyond ``scratch``. On one stream the
    next chunk's conversion runs after the previous chunk's copy has read it."""
    room = scratch.numel()
    for host, tensor in pairs:
        source, target = tensor.detach().reshape(-1), host.view(-1)
        for at in range(0, source.numel(), room):
            n = min(room, source.numel() - at)
            scratch[:n].copy_(source[at:at + n])
            target[at:at + n].copy_(scratch[:n], non_blocking=True)


def _pinned_size(nbytes: int) -> int:
    """What torch's pinned host allocator takes for ``nbytes``: the next power of two."""
    return 1 << max(0, nbytes - 1).bit_length()


class Staging:
    """float32 host copies of the tensors that cannot be used in place, by
    fragment: copied in and out a fragment at a time (the ones a step
    touches), each time in one batched copy. add_all() lays a fragment's
    copies out in one flat host buffer, or for a GPU's tensors in pinned
    blocks (pack_blocks)."""

    def __init__(self, aside: bool = True) -> None:
        self.fragments: Dict[int, List[Tuple[torch.Tensor, torch.Tensor]]] = {}  # (tensor, host copy)
        self.devices = set()
        # A GPU's copies in that are left running (the snapshot at a boundary)
        # go on a side stream (copy_aside): not for tensors that the next
        # forward may write (a BatchNorm's running statistics), which the
        # copy must read before that forward runs.
        self.aside = aside
        self.copies = 0
        self.bytes = 0  # float32 bytes copied, both ways
        # The training thread's time in the copies: for a copy in that is
        # waited for, enqueuing it and then from the end of the work queued
        # before it (the step's kernels) to the end of the copy; a GPU's copies
        # left running (out, or in for a step made later): enqueuing them.
        self.seconds = 0.0
        self.in_flight: List[Any] = []  # events of copies out that may still read the host copies
        self.host_bytes = 0  # host memory allocated for the copies (pinned blocks as rounded)

    @property
    def pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        return [pair for fragment in sorted(self.fragments) for pair in self.fragments[fragment]]

    def add(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.add_all([(tensor, 0)])[0]

    def add_all(self, tensors: List[Tuple[torch.Tensor, int]]) -> List[torch.Tensor]:
        """Host copies of ``tensors`` (each with its fragment), holding their
        values now (one batched copy, waited for); returns each one's copy,
        in its shape."""
        hosts: List[Optional[torch.Tensor]] = [None] * len(tensors)
        added: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for fragment in sorted({f for _, f in tensors}):
            members = [k for k, (_, f) in enumerate(tensors) if f == fragment]
            pin = any(tensors[k][0].device.type == "cuda" for k in members)
            sizes = [4 * tensors[k][0].numel() for k in members]
            blocks = pack_blocks(sizes) if pin else [list(range(len(members)))]
            for block in blocks:
                flat = torch.empty(sum(sizes[j] for j in block) // 4, dtype=torch.float32, pin_memory=pin)
                self.host_bytes += _pinned_size(4 * flat.numel()) if pin else 4 * flat.numel()
                at = 0
                for j in block:
                    tensor = tensors[members[j]][0]
                    hosts[members[j]] = flat[at:at + tensor.numel()].view(tensor.shape)
                    at += tensor.numel()
            for k in members:  # (in the tensors' order, whatever their block)
                tensor = tensors[k][0]
                self.fragments.setdefault(fragment, []).append((tensor, hosts[k]))
                added.append((tensor, hosts[k]))
                if tensor.device.type == "cuda":
                    self.devices.add(tensor.device)
        self._copy_pairs(added, True, True, count=False)
        return hosts

    def copy_in(self, fragments: Optional[List[bool]] = None, wait: bool = True) -> List[Any]:
        """The tensors' values into the host copies (before mend reads them):
        of every fragment, or of those marked in ``fragments``. With ``wait``
        False (a GPU's) the copies are left running: returns their events."""
        return self._copy(True, fragments, wait)

    def copy_out(self, fragments: Optional[List[bool]] = None) -> None:
        """The host copies back into the tensors (after mend wrote them)."""
        self._copy(False, fragments)

    def _copy(self, into_host: bool, fragments: Optional[List[bool]], wait: bool = True) -> List[Any]:
        pairs = [pair for f, members in self.fragments.items()
                 if fragments is None or (f < len(fragments) and fragments[f]) for pair in members]
        return self._copy_pairs(pairs, into_host, wait)

    def _copy_pairs(self, pairs: List[Tuple[torch.Tensor, torch.Tensor]], into_host: bool, wait: bool,
                    count: bool = True) -> List[Any]:
        if not pairs:
            return []
        started = time.perf_counter()
        tensors = [tensor.detach() for tensor, _ in pairs]
        hosts = [host for _, host in pairs]
        into, out_of = (hosts, tensors) if into_host else (tensors, hosts)
        # A copy in that is waited for: the work queued before it (the step's
        # kernels) is not the copy's time (see seconds).
        before = self.record_events() if into_host and wait and count else []
        aside = into_host and not wait and self.aside and bool(self.devices)
        events: List[Any] = []
        with torch.no_grad():
            if aside:
                events = self.copy_aside(into, out_of)
            else:
                _copy_all(into, out_of)
        # The copies are asynchronous on a GPU, on the current stream (but for
        # copy_aside's). Into the host copies, mend reads them next: wait for
        # that stream (not for the whole device: other streams, a DDP's, go
        # on). Back to the device, the stream runs them before its next
        # kernels (the next forward reads the tensors after them: a side
        # stream would only add a wait), and the training thread goes on at
        # once: settle() waits for them before anything writes the host copies
        # again. A copy in for a step made later (wait False) is waited for
        # then, by its events.
        enqueued = time.perf_counter()
        if into_host and wait:
            for event in before:
                event.synchronize()
            queued_done = time.perf_counter()
            self.wait_streams()
            started += queued_done - enqueued  # (the part of the wait that was the step's)
        elif into_host:
            if not aside:
                events = self.record_events()
        else:
            self.in_flight += self.record_events()
        if count:
            self.copies += 1
            self.bytes += 4 * sum(host.numel() for host in hosts)
            self.seconds += time.perf_counter() - started
        return events

    def settle(self) -> None:
        """Waits until the copies out have read the host copies (their
        events only), before mend or a copy in writes those."""
        for event in self.in_flight:
            event.synchronize()
        self.in_flight.clear()

    def copy_aside(self, hosts: List[torch.Tensor], tensors: List[torch.Tensor]) -> List[Any]:
        """A GPU's tensors into their host copies on mend's side stream of
        their device, left running (the snapshot at a boundary); returns an
        event after them on each such stream. The side stream first waits for
        the work queued so far on the device's current stream (the optimizer
        step that made the values); the training thread then queues the next
        forward and backward there, which run beside the copies. The caller
        waits for the events before anything changes the tensors (the next
        optimizer step) and before mend reads the host copies. A bfloat16 or
        float16 tensor is converted on the device through one scratch buffer
        of ASIDE_SCRATCH_BYTES (_convert_through): converted whole, a tensor
        would take float32 device memory of its size (0.9 GB for
        Qwen-2.5-1.5B's embedding), which torch's allocator then keeps for
        the side stream, out of the reach of the current stream's forward.
        Tensors on the CPU are copied at once."""
        by_device: Dict[Any, List[Tuple[torch.Tensor, torch.Tensor]]] = {}
        for host, tensor in zip(hosts, tensors):
            by_device.setdefault(tensor.device, []).append((host, tensor))
        events: List[Any] = []
        for device, pairs in by_device.items():
            if not _on_gpu(device):
                _copy_all([host for host, _ in pairs], [tensor for _, tensor in pairs])
                continue
            side = _side_stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                same = [(host, tensor) for host, tensor in pairs if host.dtype == tensor.dtype]
                if same:
                    _copy_all([host for host, _ in same], [tensor for _, tensor in same])
                converted = [(host, tensor) for host, tensor in pairs if host.dtype != tensor.dtype]
                if converted:
                    scratch = torch.empty(ASIDE_SCRATCH_BYTES // 4, dtype=torch.float32, device=device)
                    _convert_through(converted, scratch)
                event = torch.cuda.Event()
                event.record(side)
                events.append(event)
        return events

    def wait_streams(self) -> None:
        """Waits for every copy so far (the current stream of each device,
        and mend's side stream there)."""
        for device in self.devices:
            torch.cuda.current_stream(device).synchronize()
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index in _SIDE_STREAMS:
                _SIDE_STREAMS[index].synchronize()
        self.in_flight.clear()

    def record_events(self) -> List[Any]:
        """An event after the copies just enqueued, on each device's current stream."""
        events = []
        for device in self.devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return events


def usable_in_place(tensor: torch.Tensor, always_stage: bool) -> bool:
    return (not always_stage and tensor.device.type == "cpu" and tensor.dtype == torch.float32
            and tensor.is_contiguous())
