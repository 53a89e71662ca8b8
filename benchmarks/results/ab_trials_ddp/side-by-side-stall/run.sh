#!/bin/bash
# The DDP side-by-side trials with the slowdown as a stall both ranks share (`--slowdown-by stall`, meant to
# land as 5% of the step; it landed as 1.6-4.7%, benchmarks/README.md): slowdowns here, the A/A trials (whose commands the injection does not change)
# continued in ../side-by-side-cpu-clock-cal10 to 20 of each, the kinds taken in turn so that the runner's
# drift hits them alike; both plan from the same 10-block calibration (copied here).
# From the repository root (a worktree at a fixed commit, so that edits do not reach running trials):
#   bash benchmarks/results/ab_trials_ddp/side-by-side-stall/run.sh [SLOW_OUT] [AA_OUT]
# SLOW_OUT and AA_OUT start as copies of these two directories (ab_trials.py resumes from trials.jsonl).
slow=${1:-/tmp/abt-ddp-stall}
aa=${2:-/tmp/abt-ddp-cal10}
py=${PY:-.venv/bin/python}
here=benchmarks/results/ab_trials_ddp
[ -d "$slow" ] || cp -r "$here/side-by-side-stall" "$slow"
[ -d "$aa" ] || cp -r "$here/side-by-side-cpu-clock-cal10" "$aa"
trials() {  # KIND N OUT [ARGS]: the trials of KIND up to N (those in OUT/trials.jsonl are kept)
  local kind=$1 n=$2 out=$3
  shift 3
  PYTHONPATH=. $py benchmarks/ab_trials.py --workload ddp --side-by-side --kinds "$kind" --trials "$n" \
    --out "$out" "$@" | grep -E "^$kind "
}
# The cal10 set held 10 A/A and 9 A/A-under-the-burner trials when this set began.
for r in $(seq 1 12); do
  trials slow $((2 * r - 1 < 20 ? 2 * r - 1 : 20)) "$slow" --slowdown-by stall
  trials aa $((10 + r < 20 ? 10 + r : 20)) "$aa"
  trials slow $((2 * r < 20 ? 2 * r : 20)) "$slow" --slowdown-by stall
  trials aa-burner $((9 + r < 20 ? 9 + r : 20)) "$aa"
done
