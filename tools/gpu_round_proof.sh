#!/bin/bash
# The GPU proofs of issues #47 and #51 in ONE device call (about 8 minutes), as root, from the checkout's root:
#   1. tools/deep_speed_proof.sh: install as README line 1 does (offline wheels), `check --deep` interleaved with
#      plain torch, RUNS times (default 5), with the previous code's check beside it when OLD names its tree;
#   2. tools/h200_recovery.sh with the gpudoctor just installed: steps A, B (the restage), C;
#   3. tools/gpu_security_proof.sh --dry-run with that install: the forged server, the hostile working directory,
#      the planted /dev/shm.
# Each proof writes its own directory under WORK (default a new /tmp directory); OUTDIR receives the few files a
# device call brings back: each proof's summary, its log's tail, and one tarball of everything.
# Nothing on the card is changed.
#
#   tools/gpu_round_proof.sh OUTDIR [RUNS]     (env: WHEELS, default ./.whl; OLD, an earlier source tree)
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
RUNS=${2:-5}
W=${WORK:-$(mktemp -d /tmp/gpu-round.XXXXXX)}
export WHEELS=${WHEELS:-$SRC/.whl}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 9; }
step() {  # NAME LIMIT COMMAND...: run it from / with a deadline, keep its log, say its exit status
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  (cd / && timeout "$limit" "$@") > "$W/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$O/steps.txt"
  tail -n 40 "$W/$name.log" > "$O/$name-tail.txt"
}
nvidia-smi -L > "$O/steps.txt" 2>&1
step deep 330 env OLD="${OLD:-}" "$SRC/tools/deep_speed_proof.sh" "$W/deep" "$RUNS"
cp "$W/deep/summary.txt" "$O/deep-summary.txt" 2>/dev/null
step recovery 200 env GPUDOCTOR=/usr/local/bin/gpudoctor "$SRC/tools/h200_recovery.sh" "$W/recovery"
cp "$W/recovery/summary.txt" "$O/recovery-summary.txt" 2>/dev/null
step security 150 "$SRC/tools/gpu_security_proof.sh" --dry-run "$W/security"
cp "$W/security/summary.txt" "$O/security-summary.txt" 2>/dev/null
tar -C "$W" -czf "$O/all.tgz" . 2>/dev/null
grep -h "^FAIL" "$O"/*-summary.txt 2>/dev/null | head -20
