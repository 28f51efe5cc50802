#!/bin/sh
# The chaos benchmark: a `mend chaos` run of about 20-40 minutes (3 learners,
# the demo's model, an emulated 100 Mbit/s link with 20 ms latency, a fault
# every ~20 s on average) and the fault-free run of the same job. Prints the
# summary and appends a row to bench-results/chaos.csv; the full report
# (every fault, heal and stall) goes to bench-results/chaos-report-<seed>.json
# (chaos-report-<seed>-r<ranks>.json for learners of several ranks).
# Usage: bench/chaos.sh [MEND] [SEED] [RANKS]   (default build/mend, seed 1, 1 rank)
#   RANKS > 1: learners of that many ranks, faults against single ranks;
#   the job is then 6,500 steps (about 20 minutes here), else
#   20,000. STEPS=<n> in the environment overrides it.
set -eu
mend=${1:-build/mend}
seed=${2:-1}
ranks=${3:-1}
if [ "$ranks" -gt 1 ]; then
  steps=${STEPS:-6500}
  report="bench-results/chaos-report-$seed-r$ranks.json"
else
  steps=${STEPS:-20000}
  report="bench-results/chaos-report-$seed.json"
fi
mkdir -p bench-results
exec "$mend" chaos --learners 3 --ranks-per-learner "$ranks" --steps "$steps" --sync-every 50 \
  --dim 128 --layers 2 --batch 16 \
  --seed "$seed" --mean-gap-s 20 --stop-min-s 4 --stop-max-s 8 --slow-s 12 --lighthouse-down-s 2 \
  --set link_rate_mbit=100 --set link_latency_ms=20 \
  --csv bench-results/chaos.csv --report "$report" --timeout-s 7200
