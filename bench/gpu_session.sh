#!/usr/bin/env bash
# One session on a GPU machine (the device tool), prepared here and run
# there once: the wheel from scripts/wheel.sh unpacked beside the machine's
# own Python and torch (pip --target, on PYTHONPATH; the machine has no
# package registry: the wheel travels in the working tree, carry "dist"),
# then, with learners of RANKS ranks each (2 where the machine has 2 GPUs or
# more, else 1: one NCCL communicator takes one process a GPU):
#   1. sharded learners against DDP on the GPU (bench/gpu_sharded_check.py:
#      FSDP2 on CUDA, with a bf16 MixedPrecisionPolicy and with
#      CPUOffloadPolicy; SHARDED_TIMEOUT seconds, default 120);
#   2. torchtitan's trainer with mend between two learners, and their resume
#      from its checkpoints (tests/python/test_torchtitan.py, in
#      TORCHTITAN_TIMEOUT seconds, default 240; it needs dist/torchtitan,
#      below);
#   3. the transformers Trainer with FSDP2 through Accelerate and mend's
#      callback, two learners and their resume
#      (tests/python/test_trainer_fsdp2.py, without the CPU shim it needs
#      here; TRAINER_TIMEOUT seconds, default 180);
#   4. the delay sweep's learners sharded by FSDP2, each over one rank
#      (--fsdp2: FSDP2_RUNS, default local#1,concurrent@2000#1, in
#      FSDP2_BUDGET seconds, default 300; its CSV gpu_delay_sweep_fsdp2.csv);
#   (1-4 outside BUDGET) then the runs of bench/gpu_delay_sweep.py in order
# of value until the budget is spent. The sweep writes its CSV after every
# run, so a budget cut short keeps the runs before it.
#
#   scripts/wheel.sh                                   # here: dist/mend-*.whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d dist/torchtitan torchtitan==0.2.2 torchdata==0.11.0 \
#     datasets==4.7.0 tyro==1.0.17 typeguard==4.6.1 docstring_parser==0.18.0 dill==0.4.1 \
#     multiprocess==0.70.19                            # here: what the GPU machine lacks of torchtitan's (1.6 MB)
#   BUDGET=500 bash bench/gpu_session.sh               # there (OUT: where results go)
#   BUDGET=120 SWEEP_ARGS="--tiny --cpu --steps 24 --sync-every 8" bash bench/gpu_session.sh   # a check here
#
# Environment: BUDGET (seconds for the sweep, default 500), RUN_TIMEOUT (seconds
# one run may take, default 300), OUT (default
# bench-results/gpu), RUNS (the sweep's --runs, default below), SWEEP_ARGS
# (more arguments for the sweep), PYTHON (default python3), RANKS_PER_LEARNER
# (default above).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${BUDGET:-500}
out=${OUT:-bench-results/gpu}
python=${PYTHON:-python3}
# The issue's headline first (local, then both modes at 2000 ms), then both
# modes without the outer warm-up (in a job of 160 steps every round of the
# default's is a warm-up round, which a concurrent round applies as a late
# average: docs/benchmarks.md, "Concurrent against synchronous loss"), then
# the other delays, then a second seed.
runs=${RUNS:-local#1,concurrent@2000#1,synchronous@2000#1,concurrent@2000#1+outer_warmup_steps=0,synchronous@2000#1+outer_warmup_steps=0,concurrent@0#1,concurrent@1000#1,concurrent@500#1,local#2,concurrent@2000#2,synchronous@2000#2}
mkdir -p "$out"

wheel=$(ls dist/mend-*.whl 2>/dev/null | head -1)
if [[ -z "$wheel" ]]; then
  echo "gpu_session: no dist/mend-*.whl: run scripts/wheel.sh first and carry dist" >&2
  exit 2
fi
site=$(mktemp -d)
if ! "$python" -m pip install -q --no-index --no-deps --target "$site" "$wheel"; then
  # No pip: a wheel is a zip archive of the package.
  "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$wheel" "$site" || exit 2
fi
if ls dist/torchtitan/*.whl > /dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --target "$site" dist/torchtitan/*.whl ||
    echo "gpu_session: dist/torchtitan's wheels did not install; torchtitan's check will be skipped" >&2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi 2>&1 || echo "nvidia-smi: none"
  "$python" - <<'EOF'
import platform, torch, mend
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("mend", mend.__version__ if hasattr(mend, "__version__") else "?", mend.__file__)
try:
    import transformers
    print("transformers", transformers.__version__)
except ImportError:
    print("transformers: none (the sweep's own decoder)")
EOF
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

# Ranks a learner: 2 where the machine has 2 GPUs or more, else 1 (one NCCL
# communicator takes one process a GPU; the two learners' communicators may
# share the GPUs). RANKS_PER_LEARNER overrides it.
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2> /dev/null || echo 0)
ranks=${RANKS_PER_LEARNER:-$(( gpus >= 2 ? 2 : 1 ))}
echo "gpu_session: $gpus GPUs, learners of $ranks ranks" | tee -a "$out/machine.txt"

# Sharded learners first (short, and what no CPU here can run: CUDA meshes,
# the offload policy's host shards).
timeout --kill-after=10 "${SHARDED_TIMEOUT:-120}" "$python" bench/gpu_sharded_check.py --ranks "$ranks" \
  --csv "$out/gpu_sharded_check.csv" 2>&1 | tee "$out/gpu_sharded_check.log"
# torchtitan's trainer with mend (pytest says "skipped" without dist/torchtitan).
TORCHTITAN_RANKS=$ranks timeout --kill-after=10 "${TORCHTITAN_TIMEOUT:-240}" "$python" -m pytest -q -p no:cacheprovider \
  -rs tests/python/test_torchtitan.py 2>&1 | tee "$out/torchtitan.log"
# The transformers Trainer's FSDP2 (Accelerate's, on CUDA) with mend's callback.
TRAINER_FSDP2_RANKS=$ranks timeout --kill-after=10 "${TRAINER_TIMEOUT:-180}" "$python" -m pytest -q -p no:cacheprovider \
  -rs tests/python/test_trainer_fsdp2.py 2>&1 | tee "$out/trainer_fsdp2.log"
# The sweep's columns for learners sharded by FSDP2 (each over a process
# group of its own: one GPU takes one NCCL rank).
# shellcheck disable=SC2086
timeout --kill-after=10 "${FSDP2_BUDGET:-300}" "$python" bench/gpu_delay_sweep.py --fsdp2 \
  --runs "${FSDP2_RUNS:-local#1,concurrent@2000#1}" --run-timeout "${RUN_TIMEOUT:-300}" \
  --csv "$out/gpu_delay_sweep_fsdp2.csv" ${SWEEP_ARGS:-} 2>&1 | tee "$out/gpu_delay_sweep_fsdp2.log"
pkill -f "gpu_delay_sweep.py --worker" 2> /dev/null || true

# shellcheck disable=SC2086
# A run that hangs stops at RUN_TIMEOUT (one at 2000 ms took about 140 s on
# the H100), not at the budget's end.
timeout --kill-after=10 "$budget" "$python" bench/gpu_delay_sweep.py --runs "$runs" \
  --run-timeout "${RUN_TIMEOUT:-300}" --eval-every 20 --csv "$out/gpu_delay_sweep.csv" ${SWEEP_ARGS:-} 2>&1 | tee "$out/gpu_delay_sweep.log"
status=${PIPESTATUS[0]}
# What the budget cut short leaves behind.
pkill -f "gpu_delay_sweep.py --worker" 2> /dev/null || true
if [[ $status == 124 ]]; then
  # A budget's end is the plan (the runs are ordered by what matters most).
  echo "gpu_session: the budget ($budget s) ended the sweep; the CSV holds the runs before it"
  exit 0
fi
# Otherwise the sweep's own status: nonzero when a run failed (its row says why).
exit "$status"
