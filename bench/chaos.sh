#!/bin/sh
# The chaos benchmark: a 30-minute `mend chaos` run (3 learners, the demo's
# model, an emulated 100 Mbit/s link with 20 ms latency, a fault every ~20 s
# on average) and the fault-free run of the same job. Prints the summary and
# appends a row to bench-results/chaos.csv; the full report (every fault,
# heal and stall) goes to bench-results/chaos-report-<seed>.json.
# Usage: bench/chaos.sh [MEND] [SEED]   (default build/mend, seed 1)
set -eu
mend=${1:-build/mend}
seed=${2:-1}
mkdir -p bench-results
exec "$mend" chaos --learners 3 --steps 20000 --sync-every 50 --dim 128 --layers 2 --batch 16 \
  --seed "$seed" --mean-gap-s 20 --stop-min-s 4 --stop-max-s 8 --slow-s 12 --lighthouse-down-s 2 \
  --set link_rate_mbit=100 --set link_latency_ms=20 \
  --csv bench-results/chaos.csv --report "bench-results/chaos-report-$seed.json" --timeout-s 7200
