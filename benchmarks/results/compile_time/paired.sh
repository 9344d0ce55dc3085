#!/usr/bin/env bash
# Interleaved compile-time comparison, REPS rounds of base then new, each a process of its own:
#   base: a worktree of the commit to compare at /tmp/base (git worktree add --detach /tmp/base HEAD);
#   new: this checkout with the change applied (e.g. git apply dedup_sites.patch).
# Run from the repository root: VENV=.venv bash benchmarks/results/compile_time/paired.sh
. "${VENV:-.venv}/bin/activate"
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../.." && pwd)
OUT=${OUT:-$HERE/paired.txt}
cd /tmp  # neither checkout's dsd_jax on the path but through PYTHONPATH
for r in $(seq "${REPS:-3}"); do
  for v in base new; do
    if [ $v = base ]; then PP=/tmp/base; else PP=$REPO; fi
    PYTHONPATH=$PP REPEAT=2 python "$HERE/compile_time.py" ${PAIRS:-0,4 1,4 3,4 3,64} 2>&1 | grep -v Warn \
      | sed "s/^/$v r$r /" >> "$OUT"
  done
done
