#!/bin/bash
# The DDP side-by-side trials with the thread-clock injection: slowdowns here, and the A/A trials (whose
# commands no clock changes) continued in ../side-by-side-cpu-clock-cal10, one of each kind in turn so that
# the runner's drift hits them alike; both plan from the same 10-block calibration (copied here).
# From the repository root (a worktree at a fixed commit, so that edits do not reach running trials):
#   bash benchmarks/results/ab_trials_ddp/side-by-side-thread-clock/run.sh [SLOW_OUT] [AA_OUT]
# SLOW_OUT and AA_OUT start as copies of these two directories (ab_trials.py resumes from trials.jsonl).
slow=${1:-/tmp/abt-ddp-thread}
aa=${2:-/tmp/abt-ddp-cal10}
py=${PY:-.venv/bin/python}
here=benchmarks/results/ab_trials_ddp
[ -d "$slow" ] || cp -r "$here/side-by-side-thread-clock" "$slow"
[ -d "$aa" ] || cp -r "$here/side-by-side-cpu-clock-cal10" "$aa"
for n in $(seq 1 20); do
  PYTHONPATH=. $py benchmarks/ab_trials.py --workload ddp --side-by-side --slowdown-clock thread --kinds slow \
    --trials "$n" --out "$slow" | grep -E "^slow"
  PYTHONPATH=. $py benchmarks/ab_trials.py --workload ddp --side-by-side --kinds aa,aa-burner \
    --trials "$n" --out "$aa" | grep -E "^aa"
done
