"""mend for a torch.nn.Module: mend_init, mend_shutdown and the Runtime.

torch is used only through its public Python API, so this serves every
torch >= 1.13. Parameters that are float32, contiguous and on the CPU are
handed to libmend in place (no copy on steps without a round); all others
(on a GPU or another device, bfloat16 or float16; all of them with
host_staging = "always") go through float32 host buffers (pinned for a
GPU): copied in before a step that starts or applies a round, and back
after a call that wrote them, so mend adds no device memory and the round
runs on host memory.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from mend import _attach as attach
from mend import _bindings as bindings
from mend import _native
from mend import _sharding as sharding
from mend._frozen import JOB_SETTING as FROZEN_SETTING
from mend._frozen import job_setting as frozen_setting
from mend._group import join_group, with_group
from mend._schedules import StepFollower
from mend._config import MendConfig, check_config
from mend._learner import GroupStore, Learner, check_tokens, read_token
from mend._staging import Staging, usable_in_place
from mend._native import (FRAGMENTS_PLANNED, FRAGMENTS_WROTE, STEP_DUE_NEXT, STEP_MAY_WRITE, STEP_READS, STEP_WROTE,
                          lib)

_STAGED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Training forwards with no optimizer step seen before mend warns that it is
# not attached to one (gradient accumulation runs several forwards a step).
_FORWARDS_BEFORE_WARNING = 100
# torch 1.13's forward pre-hooks see positional arguments only.
_KEYWORDS_UNSEEN = "" if attach.HOOKS_SEE_KEYWORDS else " among its positional arguments; torch 1.13 shows mend no keyword ones"


class Runtime:
    """What mend_init attaches to a model: one learner of the job.

    In the default (automatic) mode mend runs after every optimizer step by
    itself; ``report_tokens(n)`` sets the tokens of the current step (else
    they are counted from the forward's inputs: see mend_init). With
    ``mend_init(..., manual=True)`` nothing is wrapped and ``step(tokens)``
    is the only step: call it once after each inner step. ``stats()`` (also
    after shutdown: the final ones), ``global_state(fragment)``,
    ``save_checkpoint(path)``, ``export_state()`` / ``import_state(bytes)``,
    ``shutdown()``.
    """

    def __init__(self, model: torch.nn.Module, config: MendConfig, learner_id: str,
                 optimizer: Optional[torch.optim.Optimizer], group_store: Optional[GroupStore] = None,
                 manual: bool = False, scaler: Any = None) -> None:
        named = bindings.named_parameters(model)  # (a torch.compile'd model's: the module's own names)
        if not named:
            raise ValueError("mend_init: the model has no parameters")
        # Frozen parameters (requires_grad = False now) are not exchanged,
        # merged or checkpointed, unless asked for: every learner must hold
        # the same ones, which registration checks by digest (_frozen).
        job_settings: Dict[str, str] = {}
        if not config.exchange_frozen_parameters:
            frozen = frozen_setting([(name, sharding.local_tensor(p)) for name, p in named if not p.requires_grad])
            if frozen is not None:
                job_settings[FROZEN_SETTING] = frozen
            named = [(name, p) for name, p in named if p.requires_grad]
            if not named:
                raise ValueError("mend_init: every parameter of the model is frozen (requires_grad=False): "
                                 "nothing to exchange; set exchange_frozen_parameters=True to exchange them anyway")
        # A model sharded over the group's ranks (FSDP2, TP): each rank's
        # local pieces, and which ranks hold the same ones (_sharding).
        replica_keys = sharding.replica_keys(named, int(config.group_size))
        layout = sharding.layout_setting(named)
        if layout is not None:
            job_settings[sharding.LAYOUT_SETTING] = layout
        # (keep these alive whatever later replaces p's; a DTensor's: its local piece)
        storages = [sharding.local_tensor(p).detach() for _, p in named]
        for (name, _), p in zip(named, storages):
            if p.is_sparse or p.dtype not in _STAGED_DTYPES or not p.is_contiguous():
                raise ValueError(
                    f"mend_init: parameter {name!r} is {'sparse ' if p.is_sparse else ''}"
                    f"{p.dtype} on {p.device}{'' if p.is_contiguous() else ', not contiguous'}; "
                    f"mend needs dense, contiguous float32, bfloat16 or float16 parameters")
        if optimizer is not None:
            optimizer, wrapper_scaler = attach.unwrap_optimizer(optimizer)
            scaler = scaler if scaler is not None else wrapper_scaler
        if optimizer is not None and not attach.holds_any(optimizer, [p for _, p in named]):
            raise ValueError("mend_init: the optimizer holds none of the model's parameters")
        self.model = model
        self.config = config
        self.learner_id = learner_id
        self.manual = manual
        self._group_store = group_store
        self._parameters = [p for _, p in named]
        self._names = [name for name, _ in named]
        # The sharded state_dict()s' tensors, which DCP loads in place (see load_state_dict).
        self._own_states: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self._always_stage = config.host_staging == "always"
        self._staging = Staging()
        self._moment_staging = Staging()
        # Each parameter's Adam moments as handed over (None: none yet).
        self._moments: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * len(self._parameters)
        self._optimizer_tracked = False  # its betas and step count handed over
        self._moments_in_place = False   # some moments handed over in place (CPU float32)
        self._buffers_in_place = False   # some buffers likewise
        # A step that only reads the staged copies, made at the next optimizer
        # step (before it changes the parameters): (tokens, its copies' events).
        self._deferred: Optional[Tuple[int, List[Any]]] = None
        self._deferred_steps = 0
        self._step_handed = 0            # the step count last put into the learner
        self._job_step = 0               # the job's step as of the calls made (stats()["steps"])
        # The LR schedulers and a trainer's step counter, when mend moves the job's step.
        self._follower = StepFollower()
        self._pid = os.getpid()
        self._tokens: Optional[int] = None
        self._counted_tokens = attach.TokenCount()  # of the forwards since the last step
        self._warned_no_tokens = False
        self._count_forwards = True      # (a trainer integration counts its batches instead)
        self._steps_taken = 0            # the optimizer steps mend ran after
        self._skipped_steps = 0          # and those a GradScaler skipped
        self._tokens_stepped = 0         # the tokens of the steps mend ran
        self._scaler: Optional[attach.ScalerAttachment] = None
        self._training_forwards = 0
        self._stepped = False
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._attachment: Optional[attach.StepAttachment] = None
        self._later: Optional[attach.LaterOptimizer] = None
        self._hooks = []
        self._attached = [bindings.Attached("parameter", name, p) for name, p in named]
        # Parameter i is fragment i mod fragments's: the staged ones' host
        # copies flat by fragment.
        fragments = max(1, int(config.fragments))
        staged = [i for i, data in enumerate(storages) if not usable_in_place(data, self._always_stage)]
        self._all_parameters_staged = len(staged) == len(storages)
        tensors = list(storages)
        for i, host in zip(staged, self._staging.add_all([(storages[i], i % fragments) for i in staged])):
            tensors[i] = host
        entries = [(name, tensor.data_ptr(), tensor.numel(), tuple(storage.shape))
                   for (name, _), tensor, storage in zip(named, tensors, storages)]
        self._learner = Learner._from_addresses(config, entries, learner_id, read_token(config), 0,
                                                keep=storages, job_settings=job_settings,
                                                replica_keys=replica_keys)
        for i in staged:
            if self._learner.parameter_fragment(i) != i % fragments:
                raise RuntimeError(f"mend: libmend puts parameter {i} in fragment "
                                   f"{self._learner.parameter_fragment(i)}, not {i % fragments}: "
                                   "install the matching libmend.so")
        self._buffer_staging = Staging(aside=False)  # (a forward may write them: see Staging.aside)
        if config.sync_buffers:
            self._hand_over_buffers(model)
        self._after_call()  # (a resume from a checkpoint moved the job's step)
        self._hooks.append(attach.register_forward_pre_hook(model, attach.ForwardHook(self, "_forward")))
        if manual:
            # Its moments (desloc, heal_inner_optimizer) and its schedulers
            # (without it, the optimizer of the parameters is looked for at a
            # move of the job's step: _follow_schedules).
            self._optimizer = optimizer
            self._follower.follow(self._optimizer, final=False)
            return
        runtime_ref = weakref.ref(self)

        def stepped() -> None:
            runtime = runtime_ref()
            if runtime is not None and not runtime.closed:
                runtime._step(None)

        def skipped() -> None:
            runtime = runtime_ref()
            if runtime is not None and not runtime.closed:
                runtime._skipped()

        def before_step() -> None:
            runtime = runtime_ref()
            if runtime is not None and not runtime.closed:
                runtime._finish_deferred()
                runtime._follower.follow(runtime._optimizer, final=False)
                if runtime._later is not None and runtime._later.found_by_hook:
                    runtime._later.detach()  # (its global hook: from here, not from inside it)
                    runtime._later = None

        self._stepped_callback = stepped
        self._before_step_callback = before_step
        if scaler is not None:
            self._scaler = attach.ScalerAttachment(
                scaler, self._parameters, lambda: getattr(runtime_ref(), "_steps_taken", 0), skipped)
        optimizer = optimizer or attach.find_optimizer(self._parameters)
        if optimizer is not None:
            self._attach(optimizer)
        else:  # created after mend_init
            self._later = attach.LaterOptimizer(self._parameters, self._attach, stepped)

    # -- wiring ----------------------------------------------------------
    def _attach(self, optimizer: torch.optim.Optimizer) -> None:
        if self._optimizer is optimizer:
            return
        self._optimizer = optimizer
        self._attachment = attach.StepAttachment(optimizer, self._stepped_callback, self._before_step_callback)

    def _forward(self, module: torch.nn.Module, inputs: Any, kwargs: Dict[str, Any]) -> None:
        if not module.training:
            return
        if self._count_forwards:
            self._counted_tokens.add(attach.count_tokens(module, inputs, kwargs))
        if self._stepped or self.manual:
            return
        if self._later is not None:
            self._later.look()
        self._training_forwards += 1
        if self._training_forwards == _FORWARDS_BEFORE_WARNING:
            warnings.warn(
                f"mend: {_FORWARDS_BEFORE_WARNING} training forwards and no optimizer step that mend saw: it runs "
                "after the steps of a torch.optim optimizer holding the model's parameters. Pass "
                "mend_init(..., optimizer=opt), or use mend_init(..., manual=True) and call runtime.step(tokens) "
                "after each inner step.", RuntimeWarning, stacklevel=2)

    def _hand_over_buffers(self, model: torch.nn.Module) -> None:
        """sync_buffers: the state_dict's floating-point buffers (BatchNorm's
        running statistics) averaged at every round, integer ones (its batch count)
        taken from the round's first member; CPU float32 ones in place, the
        others through float32 host copies."""
        kinds: Dict[bool, list] = {False: [], True: []}
        keep = []
        buffers = [(name, buffer) for name, buffer in bindings.state_buffers(model)
                   if not (buffer is None or buffer.is_sparse or buffer.dtype == torch.bool or buffer.is_complex())]
        datas = [buffer.detach() for _, buffer in buffers]
        tensors = list(datas)
        staged = [k for k, data in enumerate(datas) if not usable_in_place(data, self._always_stage)]
        for k, host in zip(staged, self._buffer_staging.add_all([(datas[k], 0) for k in staged])):
            tensors[k] = host  # (their host copies at once: one batched copy)
        self._buffers_in_place = len(staged) < len(datas)
        for (name, buffer), data, tensor in zip(buffers, datas, tensors):
            kinds[not buffer.is_floating_point()].append((name, tensor.data_ptr(), tensor.numel(),
                                                          tuple(buffer.shape)))
            keep.append(data)
            self._attached.append(bindings.Attached("buffer", name, buffer))
        for from_first_member, entries in kinds.items():
            if entries:
                self._learner._set_buffer_addresses(entries, from_first_member, keep)

    def _hand_over_moments(self) -> None:
        """Gives the reducer each parameter's Adam moments once the optimizer
        has made them (at its first step), with its betas, and again when
        the optimizer replaced them (its load_state_dict); cheap when
        nothing changed."""
        if self._optimizer is None:
            return
        now = [bindings.adam_moments(self._optimizer, p) for p in self._parameters]
        if all(bindings.same_moments(a, b) for a, b in zip(now, self._moments)):
            return
        if not self._optimizer_tracked and any(m is not None for m in now):
            self._learner.set_optimizer(*bindings.adam_betas(self._optimizer, self._parameters))
            self._optimizer_tracked = True
        # Every parameter's anew, into new host copies where staged: the
        # library holds the old addresses until each is replaced here.
        staging = Staging()
        views = [None if moments is None else [sharding.local_tensor(m).detach() for m in moments]
                 for moments in now]
        in_place = any(usable_in_place(v, self._always_stage) for pair in views if pair for v in pair)
        staged = [(i, j) for i, pair in enumerate(views) if pair for j, v in enumerate(pair)
                  if not usable_in_place(v, self._always_stage)]
        # (every host copy at once: one batched copy, and pinned blocks for a GPU's)
        for (i, j), host in zip(staged, staging.add_all([(views[i][j], 0) for i, j in staged])):
            views[i][j] = host
        for index, pair in enumerate(views):
            if pair is None:
                self._learner._set_moment_addresses(index, None, None, ())
            else:
                self._learner._set_moment_addresses(index, pair[0].data_ptr(), pair[1].data_ptr(), ())
        staging.copies, staging.seconds = self._moment_staging.copies, self._moment_staging.seconds
        self._moment_staging.settle()  # (its host copies go: no copy may still read them)
        self._moment_staging = staging
        self._moments_in_place = in_place
        self._moments = now

    def _before_call(self, fragments: Optional[List[bool]] = None, wait: bool = True) -> List[Any]:
        """Staged copies current before a call that may read them: the
        parameters of ``fragments`` (None: all), the moments and buffers.
        With ``wait`` False the copies are left running (a GPU's): returns
        their events, to wait for before the call."""
        self._settle()
        events = self._staging.copy_in(fragments, wait)
        for staging in (self._moment_staging, self._buffer_staging):
            events += staging.copy_in(None, wait)
        if self._optimizer_tracked:
            self._step_handed = bindings.optimizer_step(self._optimizer, self._parameters)
            self._learner.optimizer_step = self._step_handed
        return events

    def _settle(self) -> None:
        """The copies back to the device done reading the host copies: before
        a call that may write them."""
        for staging in (self._staging, self._moment_staging, self._buffer_staging):
            staging.settle()

    def _after_call(self) -> None:
        """The host copies back where the call wrote them; the job's step
        followed where the call moved it (a heal, a resume, the final merge)."""
        if self._learner.last_flags & STEP_WROTE:
            if self._staging.fragments:  # only the fragments it wrote
                self._staging.copy_out(self._learner.step_fragments(FRAGMENTS_WROTE))
            for staging in (self._moment_staging, self._buffer_staging):
                staging.copy_out()
            if self._optimizer_tracked and self._learner.optimizer_step != self._step_handed:
                # A heal brought its source's step count with the moments.
                self._step_handed = self._learner.optimizer_step
                bindings.set_optimizer_step(self._optimizer, self._parameters, self._step_handed)
            steps = int(self._learner.stats()["steps"])
            self._follower.add(steps - self._job_step)
            self._job_step = steps

    def _follow_schedules(self) -> None:
        """After an optimizer step: its schedulers follow a move of the job's
        step (_schedules.StepFollower)."""
        if self._follower.pending:
            self._follower.follow(self._optimizer or attach.find_optimizer(self._parameters), final=True)

    # -- the user's calls -----------------------------------------------
    def report_tokens(self, tokens: int) -> None:
        """The tokens of the current inner step (else counted from the forward's input)."""
        self._check_process()
        self._check_open("runtime.report_tokens()")
        self._tokens = check_tokens(tokens, "report_tokens")

    def step(self, tokens: Optional[int] = None) -> None:
        """With mend_init(..., manual=True): one inner step done, with the
        tokens it processed; a round starts or is applied at its boundary."""
        self._check_process()
        self._check_open("runtime.step()")
        if not self.manual:
            raise _native.ERRORS[9](
                "mend: runtime.step() with mend_init(manual=False): mend already runs after every optimizer "
                "step, so this would count the step twice. Call runtime.report_tokens(n) to give the step's "
                "tokens, or use mend_init(..., manual=True) to call runtime.step(tokens) yourself.")
        self._step(None if tokens is None else check_tokens(tokens, "runtime.step"))

    def _skipped(self) -> None:
        """A step the GradScaler skipped (inf/NaN gradients): an inner step
        that moved nothing, so it counts with no tokens (those of its
        forwards, or reported for it, are dropped)."""
        self._skipped_steps += 1
        self._counted_tokens.drop()
        self._tokens = None
        self._step(0)

    def _count_batch(self, batch: Any) -> None:
        """A trainer integration's batch: its tokens (attach.batch_tokens)
        count for the step, instead of the forward calls'."""
        self._count_forwards = False
        self._counted_tokens.add(attach.batch_tokens(batch))

    def _step(self, tokens: Optional[int]) -> None:
        self._finish_deferred()
        self._stepped = True
        self._steps_taken += 1
        if tokens is None:
            counted = self._counted_tokens.take()
            tokens = self._tokens if self._tokens is not None else counted
            if tokens == 0:
                # Nothing to count (the forward got no integer tensor, e.g. a
                # float-input model) and nothing reported: a step counts as 1,
                # so the merge weighs learners by steps rather than failing on
                # weights that sum to 0.
                if not self._warned_no_tokens:
                    self._warned_no_tokens = True
                    warnings.warn("mend: no token count for this inner step (the model's forward got no "
                                  "integer tensor" + _KEYWORDS_UNSEEN + " and report_tokens() was not called); "
                                  "counting 1 per step, "
                                  "so learners are weighted by steps. Call runtime.report_tokens(n) before "
                                  "the optimizer step (or runtime.step(n) with manual=True) to weight them by "
                                  "tokens.", RuntimeWarning, stacklevel=3)
                tokens = 1
        else:
            self._counted_tokens.take()  # (given: what the forwards counted is dropped)
        self._tokens = None
        learner = self._learner
        plan = learner.plan_step()
        reads = plan & STEP_READS
        # The moments once the optimizer has made them, and before a step
        # that reads them (they may have been replaced since).
        if (self.config.desloc or self.config.heal_inner_optimizer) and (reads or not self._optimizer_tracked):
            self._hand_over_moments()
        if not reads:
            learner.step(int(tokens))
            self._job_step += 1
            self._tokens_stepped += int(tokens)  # (a step refused is not counted)
            return
        bindings.check_attached(self.model, self._attached)
        fragments = learner.step_fragments(FRAGMENTS_PLANNED) if self._staging.fragments else None
        if not plan & (STEP_MAY_WRITE | STEP_DUE_NEXT) and self._may_defer():
            # It only reads the staged copies (a round's launch): copied now
            # (left running on a GPU), made at the next optimizer step, before
            # that changes the parameters, so that the copies and mend's
            # snapshot of them overlap the next forward and backward. (Not a
            # round due at the next step, tau = 1: made then, it would
            # overlap no step and that step would wait for all of it.)
            self._deferred = (int(tokens), self._before_call(fragments, wait=False))
            return
        self._before_call(fragments)
        learner.step(int(tokens))
        self._job_step += 1
        self._after_call()
        self._follow_schedules()
        self._tokens_stepped += int(tokens)

    def _may_defer(self) -> bool:
        """Whether a step that only reads may be made at the next optimizer
        step: automatic mode with the optimizer's steps seen, and every
        parameter, moment and buffer mend reads staged (one used in place
        could change before then: a BatchNorm buffer in the next forward)."""
        return (not self.manual and self._attachment is not None and self._all_parameters_staged
                and not self._moments_in_place and not self._buffers_in_place)

    def _finish_deferred(self) -> None:
        """Makes the step left for later, once its copies are in (before the
        optimizer's next step, or any call that needs the learner up to date)."""
        if self._deferred is None:
            return
        tokens, events = self._deferred
        self._deferred = None
        for event in events:
            event.synchronize()
        self._learner.step(tokens)
        self._job_step += 1
        self._after_call()  # (it wrote nothing: libmend logs an error if it did)
        self._tokens_stepped += tokens
        self._deferred_steps += 1

    def stats(self) -> Dict[str, Any]:
        """The learner's counters (rounds, bytes, heals, ...); after shutdown, the final ones."""
        stats: Dict[str, Any] = dict(self._learner.stats())
        stats["skipped_steps"] = self._skipped_steps
        stats["tokens"] = self._tokens_stepped
        if self._deferred is not None:  # (counted as done: it is, but for mend's part)
            stats["steps"] += 1
            stats["tokens"] += self._deferred[0]
        stats["deferred_steps"] = self._deferred_steps
        stats["staged_parameters"] = len(self._staging.pairs)
        stats["staging_copies"] = self._staging.copies
        stats["staging_bytes"] = self._staging.bytes
        stats["staging_seconds"] = self._staging.seconds + self._moment_staging.seconds
        stats["staging_host_bytes"] = sum(s.host_bytes for s in (self._staging, self._moment_staging,
                                                                 self._buffer_staging))
        return stats

    @property
    def finished(self) -> bool:
        """Whether this learner has trained the job's ``total_steps``, by the
        job's step count (``stats()["steps"]``, heals included). A learner
        that restarts heals onto the others' step, so a loop of its own
        count runs past the job's end (and misses the final merge): stop
        when this is True. Always False with ``total_steps = 0``."""
        total = int(self.config.total_steps)
        return total > 0 and self.stats()["steps"] >= total

    def round_phases(self) -> Dict[str, float]:
        """Where the rounds' time went, by phase (see Learner.round_phases)."""
        return self._learner.round_phases()

    def global_state(self, fragment: int = 0) -> torch.Tensor:
        """The job's global parameters of ``fragment`` after the last round (flat,
        a copy); for a rank of a learner of several, that rank's slice of them."""
        return self._learner.global_state_into(fragment, lambda n: torch.empty(n, dtype=torch.float32))

    def save_checkpoint(self, path: str) -> None:
        """Writes the global state (parameters and outer momentum, by name) to
        ``path``. For a learner of several ranks it is collective, like
        torch.distributed.checkpoint.save: every rank calls it at the same
        step, and group rank 0 writes the file."""
        self._check_process()
        self._finish_deferred()
        self._learner.save_checkpoint(path)

    def export_state(self) -> bytes:
        """The outer state as bytes (collective for a group: rank 0 gets them)."""
        self._check_process()
        self._finish_deferred()
        return self._learner.export_state()

    def import_state(self, state: bytes) -> None:
        """Makes exported bytes (or a checkpoint file's) the global state and
        the model's parameters; the step becomes the state's."""
        self._check_process()
        self._finish_deferred()
        bindings.check_attached(self.model, self._attached)
        self._settle()
        self._learner.import_state(state)
        self._after_call()
        self._follow_schedules()

    def on_step_moved(self, callback: Callable[[int], None]) -> None:
        """``callback(steps)`` whenever a heal (or an import) moves the job's
        step by ``steps``, right after the learner's LR schedulers moved:
        for a training loop's own step counter (torchtitan's
        ``trainer.step``; the transformers and Lightning callbacks move
        theirs this way)."""
        if not callable(callback):
            raise TypeError(f"mend: on_step_moved() takes a callable, not {type(callback).__name__}")
        self._follower.listeners.append(callback)

    def state_dict(self) -> Dict[str, Any]:
        """mend's outer state (global parameters, outer momentum, error
        feedback, round, this learner's step and tokens since its rounds) in
        a form ``torch.save`` writes and ``torch.load`` reads back. Save it
        beside the model's and the optimizer's ``state_dict()``;
        ``load_state_dict`` then goes on exactly where this left off. For a
        learner of several ranks it is collective (every rank calls it at the
        same step); rank 0's holds the whole model (the others' are empty), and
        every rank loads rank 0's.

        A sharded model's (FSDP2, tensor parallelism: DTensor parameters)
        holds each rank's own: the global parameters and outer momentum of its
        pieces as DTensors of its parameters' meshes and placements (version
        2). Save it with torch.distributed.checkpoint beside the model's and
        the optimizer's sharded state dicts; the runtime is a ``Stateful``::

            dcp.save({"model": model.state_dict(), "mend": runtime}, checkpoint_id=path)
            dcp.load({"model": model.state_dict(), "mend": runtime}, checkpoint_id=path)

        A load with another number of ranks per learner reshards it, as DCP
        does the model's."""
        self._check_process()
        self._finish_deferred()
        if self.sharded:
            values = self._learner.own_values()
            global_state = torch.empty(values, dtype=torch.float32)
            momentum = torch.empty(values, dtype=torch.float32)
            described = self._learner.export_own_state(global_state.data_ptr(), momentum.data_ptr(), values)
            state: Dict[str, Any] = {"format": "mend outer state", "version": 2, "described": described}
            state.update(sharding.own_state(self._names, self._parameters, global_state, momentum))
            for part in ("global", "outer_momentum"):
                self._own_states.update((id(t), t) for t in state[part].values())
            return state
        return {"format": "mend outer state", "version": 1, "state": self._learner.export_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores what ``state_dict()`` saved; the model's parameters are
        not touched (load them with the model's own state_dict). Between
        rounds: right after mend_init, before the first step."""
        self._check_process()
        if not isinstance(state_dict, dict) or state_dict.get("format") != "mend outer state":
            raise ValueError("mend: load_state_dict() takes what runtime.state_dict() returned (a dict with "
                             "format 'mend outer state')")
        version = state_dict.get("version")
        if version not in (1, 2):
            raise ValueError(f"mend: a mend outer state of version {version!r}; this mend reads 1 and 2")
        sharded = self.sharded
        if sharded != (version == 2):
            raise ValueError(f"mend: load_state_dict(): a {'sharded' if version == 2 else 'whole'} model's outer state "
                             f"(version {version}), and this learner's model is "
                             f"{'sharded (DTensor parameters)' if sharded else 'not sharded'}")
        self._finish_deferred()
        self._settle()
        if version == 2:
            # Each rank's pieces are its own: only DCP, loading in place into
            # what state_dict() gave, brings every rank its own (or resharded)
            # pieces. A state pickled whole (torch.save, or a trainer that
            # saves callback states from rank 0 alone) holds one rank's.
            parts = [state_dict.get("global"), state_dict.get("outer_momentum")]
            if not all(isinstance(part, dict) and all(self._own_states.get(id(t)) is t for t in part.values())
                       for part in parts):
                raise ValueError(
                    "mend: load_state_dict(): a sharded model's outer state is each rank's own and must be loaded "
                    "with torch.distributed.checkpoint, in place: dcp.load({'mend': runtime}, checkpoint_id=path) "
                    "(or load into runtime.state_dict()'s tensors, then pass them here). This one was not made by "
                    "this runtime's state_dict(): saved with torch.save, or by a trainer that saves callback "
                    "states from rank 0 alone, it holds one rank's pieces")
            values = self._learner.own_values()
            global_state, momentum = sharding.flat_own_state(state_dict, self._names, self._parameters, values)
            self._learner.import_own_state(global_state.data_ptr(), momentum.data_ptr(), values,
                                           state_dict.get("described", b""))
        else:
            self._learner.import_state(state_dict["state"], keep_parameters=True)
        # The step is the saved one; the schedulers are where the checkpoint
        # beside this one put them (nothing follows).
        self._job_step = int(self._learner.stats()["steps"])

    @property
    def closed(self) -> bool:
        return self._learner.closed

    @property
    def sharded(self) -> bool:
        """Whether the model's parameters are DTensors (FSDP2, tensor
        parallelism): its state_dict() is each rank's own, for
        torch.distributed.checkpoint."""
        return sharding.any_dtensor(self._parameters)

    def shutdown(self) -> None:
        """Finishes the round in flight and leaves the job. Idempotent."""
        if os.getpid() != self._pid:
            return
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for attachment in (self._attachment, self._later, self._scaler):
            if attachment is not None:
                attachment.detach()
        self._attachment = self._later = self._scaler = None
        if self._learner.closed:
            return
        try:
            bindings.check_attached(self.model, self._attached)
            self._finish_deferred()
        except _native.MendError:
            # Leave without a final merge: its values would not be the model's
            # (or the last step failed).
            self._learner.leave()
            raise
        self._before_call()
        try:
            self._learner.shutdown()
        finally:
            self._after_call()
            self._follow_schedules()
            if self._group_store is not None:
                self._group_store.stop()

    def _check_open(self, call: str) -> None:
        if self._learner.closed:
            raise _native.ERRORS[9](
                f"mend: {call} after mend_shutdown(model): this runtime has left its job, and the step "
                "would count nowhere; call mend_init(model, config) again to train with mend")

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise _native.ERRORS[9](
                f"mend: this runtime belongs to process {self._pid}; the forked process "
                f"{os.getpid()} (a DataLoader worker?) cannot use it")


_runtimes: "weakref.WeakKeyDictionary[torch.nn.Module, Runtime]" = weakref.WeakKeyDictionary()
_starting: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # mend_init under way
_lock = threading.Lock()  # guards both; never held across a call that waits for peers


def mend_init(model: torch.nn.Module, config: Optional[MendConfig] = None,
              rank_id: Optional[str] = None, *,
              optimizer: Optional[torch.optim.Optimizer] = None, manual: bool = False,
              scaler: Any = None) -> Runtime:
    """Makes ``model``'s process a learner of the job and returns its Runtime.

    By default mend runs once after every inner optimizer step, by itself:
    after ``optimizer``'s steps, or (without it) after those of the
    torch.optim optimizer that holds the model's parameters, found now or at
    its first step if it is created later (torch >= 2.0: step post-hooks;
    torch 1.13: ``optimizer.step`` wrapped in a way LR schedulers accept, and
    looks for a later optimizer at training forwards until found). With
    ``manual=True`` nothing is wrapped: call ``runtime.step(tokens)`` once
    after each inner step (a hand-written update, or your own loop);
    ``optimizer=`` then only names whose Adam moments DES-LOC averages.
    A trainer's wrapper of the optimizer (Accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) may be
    given: mend attaches to the torch optimizer inside it.

    Mixed precision: give mend the ``GradScaler`` (``scaler=``; the one
    inside an Accelerate optimizer is found). A step it skipped (inf or NaN
    gradients: the parameters stay as they were) is still an inner step,
    so every learner's boundaries stay at the same iterations as the
    trainer's step count and ``total_steps``, but it counts no tokens: those
    counted or reported for it are dropped, since its batch moved nothing.
    Without ``scaler=`` mend never sees a skipped step: its step count falls
    behind the iterations and its tokens count with the next step taken.
    Tokens per step: ``runtime.report_tokens(n)`` (or ``runtime.step(n)``
    in manual mode), else counted from the model's forward calls: with
    ``input_ids`` and an ``attention_mask`` of their shape (a transformers
    model's call, by keyword or position), the mask's sum (padding is not a
    token); else the element count of the input ids or of the first integer
    tensor; else (a float-input model) 1 per step, with a warning. torch
    1.13's forward pre-hooks see positional arguments only: a keyword call
    counts nothing there.
    The learner id is ``rank_id``, else MEND_LEARNER_ID, else HOST-PID. A
    second learner of the same lighthouse, job, id and group rank in this
    process (two models' mend_init with the default id) is refused with
    AlreadyExistsError while the first is open: a second model is a job of
    its own (its own job_id and lighthouse).

    Parameters may live on any device and be float32, bfloat16 or float16:
    those that are not CPU float32 go through float32 host buffers (pinned
    for a GPU) at round boundaries (``host_staging``).

    A learner may be a group of ranks (a rack's hosts, training with their
    own DDP): under torchrun with torch.distributed initialized, every rank
    of the default process group is one rank of this learner (group_size =
    world size, group_rank = rank) unless the config sets group_size. Group
    rank 0 speaks for the group and serves the group's store; rank r takes
    slice r of the cross-rack exchange on mend's own Gloo connections (never
    the user's process group). Rank 0's store address and, without rank_id or
    MEND_LEARNER_ID, its HOST-PID as the learner id reach the other ranks
    once, here: one broadcast on the default process group, or torchrun's
    store.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError("mend_init: model must be a torch.nn.Module")
    if config is not None:
        check_config(config, "mend_init")
    if manual and scaler is not None:
        raise ValueError("mend_init: scaler= with manual=True; in manual mode call runtime.step(tokens) after "
                         "each step the GradScaler took and runtime.step(0) after each it skipped")
    config = with_group(config or MendConfig())
    with _lock:
        if (model in _runtimes and not _runtimes[model].closed) or model in _starting:
            raise _native.ERRORS[9](
                "mend_init: this model already has a mend runtime; call mend_shutdown(model) first")
        _starting.add(model)
    # Joining a group waits for its other ranks (threads of this process, too).
    try:
        config, learner_id, server = join_group(config, rank_id or os.environ.get("MEND_LEARNER_ID"))
        try:
            runtime = Runtime(model, config, learner_id, optimizer, server, manual, scaler)
        except BaseException:
            if server is not None:
                server.stop()
            raise
        with _lock:
            _runtimes[model] = runtime
    finally:
        with _lock:
            _starting.discard(model)
    if config.group_size > 1:
        _native.log("info", f"mend_init: this process is group rank {config.group_rank} of {config.group_size} of "
                            f"learner {learner_id!r} (group store {config.group_store})")
    else:
        _native.log("info", f"mend_init: this process is learner {learner_id!r} (one rank)")
    return runtime


def get_runtime(model: torch.nn.Module) -> Optional[Runtime]:
    """The Runtime mend_init attached to ``model``, or None."""
    return _runtimes.get(model)


def mend_shutdown(model: torch.nn.Module) -> None:
    """Finishes the round in flight and leaves the job. Idempotent; also at exit."""
    runtime = _runtimes.get(model)
    if runtime is not None:
        runtime.shutdown()


def shutdown_all() -> None:
    for runtime in list(_runtimes.values()):
        try:
            runtime.shutdown()
        except Exception:  # noqa: BLE001 (at exit, one failure must not stop the rest)
            pass
