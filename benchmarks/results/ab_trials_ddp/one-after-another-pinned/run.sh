#!/bin/bash
# The DDP trials one after another with each rank pinned to its own CPU (`--pin-ranks`, both sides and the
# calibration), the slowdown the compute trials' (5% of the step's wall time, burned after the optimizer:
# with a core to each rank it lands where it runs). The kinds in turn, trial by trial.
# From the repository root (a worktree at a fixed commit, so that edits do not reach running trials):
#   bash benchmarks/results/ab_trials_ddp/one-after-another-pinned/run.sh [OUT]
# OUT starts as a copy of this directory (ab_trials.py resumes from trials.jsonl).
out=${1:-/tmp/abt-ddp-pin}
py=${PY:-.venv/bin/python}
[ -d "$out" ] || cp -r benchmarks/results/ab_trials_ddp/one-after-another-pinned "$out"
PYTHONPATH=. $py benchmarks/ab_trials.py --workload ddp --pin-ranks --trials 20 --out "$out"
