#!/bin/bash
# DDP pilot: 10 A/A blocks one after another, then 10 side by side (each run's 2 ranks on one core), same hour.
# Run on 12-04 12:24-12:35 UTC from a worktree at b5fa7e3 with OUT=/tmp/ddp-pilot; seq.json and sbs.json here
# are its --json files. From the repository root: bash benchmarks/results/ab_trials_ddp/side-by-side-pilot/run.sh [OUT]
out=${1:-/tmp/ddp-pilot}
py=${PY:-.venv/bin/python}
cmd="$py -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ab_workload.py --steps 100 --slowdown 0"
mkdir -p "$out"
for mode in seq sbs; do
  extra=""; [ $mode = sbs ] && extra="--side-by-side"
  start=$(date +%s)
  $py -m tuneup bench --ab --baseline-cmd "$cmd" --cmd "$cmd" --calibrate-blocks 0 --blocks 10 --looks 1 \
     --metrics throughput,step_time,peak_memory --timeout 300 --out "$out/$mode" --json "$out/$mode.json" $extra \
     > "$out/$mode.log" 2>&1
  echo "$mode exit $? $(( $(date +%s) - start )) s $(date -u +%H:%M:%S)"
done
