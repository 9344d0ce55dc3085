#!/bin/bash
# alternating plain B=1 runs of two checkouts: OLD=<s21 worktree> NEW=<head worktree> ./pairs_b1.sh
cd "$(dirname "$0")"
for r in 1 2 3 4; do
  for v in ${OLD:-/tmp/old} ${NEW:-/tmp/new}; do
    PYTHONPATH=$v python plain_b1_fast.py "$r $(cd $v && git rev-parse --short HEAD)" 2>/dev/null
  done
done
