#!/bin/bash
# DDP pilot: 10 A/A blocks one after another, then 10 side by side (each run's 2 ranks on one core), same hour.
cd /tmp/wt-sbs
export PYTHONPATH=/tmp/wt-sbs
py=/work/main/.venv/bin/python
cmd="$py -m torch.distributed.run --standalone --nproc-per-node 2 /tmp/wt-sbs/benchmarks/ab_workload.py --steps 100 --slowdown 0"
for mode in seq sbs; do
  extra=""; [ $mode = sbs ] && extra="--side-by-side"
  start=$(date +%s)
  $py -m tuneup bench --ab --baseline-cmd "$cmd" --cmd "$cmd" --calibrate-blocks 0 --blocks 10 --looks 1 \
     --metrics throughput,step_time,peak_memory --timeout 300 --out /tmp/ddp-pilot/$mode --json /tmp/ddp-pilot/$mode.json $extra \
     > /tmp/ddp-pilot/$mode.log 2>&1
  echo "$mode exit $? $(( $(date +%s) - start )) s $(date -u +%H:%M:%S)"
done
