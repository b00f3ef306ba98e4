#!/usr/bin/env bash
# Run CI (`bash .ci/run`) N times in a row on fresh clones of this checkout while the machine is loaded the way a
# shared CI host is: a busy loop on every core, and another process writing and deleting files in /dev/shm
# throughout. Prints each run's wall time and exit code; exits non-zero when any run failed.
#
#   tools/loaded_ci.sh [RUNS=3] [LOGDIR=/tmp/gpudoctor-loaded-ci]
#
# Needs root on a machine that may run CI (it installs Debian packages the first time, as CI does). Each run
# installs gpudoctor into a venv of its own (with the system's site-packages for the dependencies), so the
# machine's Python is left as it was.
set -uo pipefail
runs=${1:-3}
logdir=${2:-/tmp/gpudoctor-loaded-ci}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$logdir"
cores=$(nproc)

hogs=()
for _ in $(seq "$cores"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
churn_dir=/dev/shm/gpudoctor-loaded-ci-$$
mkdir -p "$churn_dir"
( i=0; while :; do
    dd if=/dev/zero of="$churn_dir/f$((i % 8))" bs=1M count=8 status=none 2>/dev/null
    rm -f "$churn_dir/f$(((i + 4) % 8))"
    i=$((i + 1)); sleep 0.05
  done ) &
hogs+=($!)
trap 'kill "${hogs[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$churn_dir"' EXIT

echo "loaded CI: $runs run(s) of .ci/run on fresh clones of $src ($(git -C "$src" rev-parse --short HEAD)); $cores busy loop(s) + /dev/shm churn"
fail=0
for n in $(seq "$runs"); do
  work=$(mktemp -d /tmp/gpudoctor-ci-XXXXXX)
  git clone -q "$src" "$work/repo"
  python3 -m venv --system-site-packages "$work/venv"
  t0=$(date +%s)
  (cd "$work/repo" && . "$work/venv/bin/activate" && CI=true bash .ci/run) >"$logdir/run$n.log" 2>&1
  rc=$?
  t1=$(date +%s)
  summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$logdir/run$n.log" | tail -1)
  echo "run $n: exit $rc in $((t1 - t0)) s — $summary (log: $logdir/run$n.log)"
  [ $rc -eq 0 ] || fail=1
  rm -rf "$work"
done
exit $fail
