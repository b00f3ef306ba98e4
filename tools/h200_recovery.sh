#!/bin/bash
# The H200 proof of issue #31 (verified return to service), in ONE device call (<= 9 minutes), as root:
#   the shipped daemon watches this machine, a small model staged in /dev/shm and the restage remedy (model.stage)
#   allowed; the active verification is the real deep tier (policy verify: {deep: on}).
#   A  start: never verified -> the passive check passes -> verified under load (deep tier) -> ready
#   B  a shard truncated -> failing -> restaged (healing) -> verifying -> verified -> ready
#   C  the same with a foreign torch GEMM loop (tools/gpu_busy.py) holding the GPU: the verification fails naming its
#      PID and the host stays not ready; the loop ends -> the next verification passes -> ready
# Each step's wall time is printed (summary.txt), with the daemon's own recovery.* events (timeline.txt).
# Everything happens in a private mount namespace (unshare -m) with its own tmpfs on /dev/shm: the machine's real
# /dev/shm is never touched. Nothing on the card is changed (no nvidia-smi -pm/-r/-pl/-ac/-lgc/-c/-mig).
#
#   tools/h200_recovery.sh [OUTDIR]     default: $OUT, else a new /tmp/h200-recovery.XXXXXX
# Env: GPUDOCTOR (an installed gpudoctor command: no install), WHEELS (default .whl: gpudoctor's dependencies and setuptools as wheels; install.sh --wheels, offline; absent:
#      ./install.sh with the machine's pip), DEEP_PYTHON (a python with torch for the deep tier; default python3).
# Without a GPU (this script's CPU path, e.g. on a development machine) the passive checks fail (no driver), so the
# ladder never verifies: A shows the host not ready, B that the daemon restages the shard all the same; it says so and
# stops before C. Exit 0 when every step behaved, 1 when one did not, 2 a precondition failed, 9 the install failed.
set -u
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."
SRC=$(pwd)
O=${1:-${OUT:-}}
[ -n "$O" ] || O=$(mktemp -d /tmp/h200-recovery.XXXXXX)
mkdir -p "$O" && O=$(cd "$O" && pwd)
[ "$(id -u)" = 0 ] || { echo "$0: run as root (unshare -m, the daemon's state, the model in /dev/shm)" >&2; exit 2; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# --- a private mount namespace with its own tmpfs on /dev/shm ---------------------------------------------------
if [ -z "${GD_RECOVERY_NS:-}" ]; then
  if unshare -m --propagation private true 2>/dev/null; then
    exec env GD_RECOVERY_NS=1 unshare -m --propagation private "$SELF" "$O"
  fi
  GD_RECOVERY_NS=none
fi
if [ "$GD_RECOVERY_NS" = 1 ] && mount -t tmpfs -o size=2g,mode=1777 gd-recovery /dev/shm; then
  SHM=/dev/shm/gd-recovery; SHM_NOTE="a private tmpfs on /dev/shm (unshare -m)"
else  # no mount namespace here: a directory of our own, removed at the end; nothing else in /dev/shm is touched
  SHM=/dev/shm/gd-recovery.$$; SHM_NOTE="NO private namespace here (unshare -m failed): our own $SHM only"
fi
mkdir -p "$SHM"
W=$(mktemp -d /tmp/gd-recovery.XXXXXX)
DAEMON= BUSY=
cleanup() {
  [ -n "$BUSY" ] && kill "$BUSY" 2>/dev/null
  [ -n "$DAEMON" ] && kill -TERM "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  [ "$SHM" = /dev/shm/gd-recovery ] || rm -rf "$SHM"
  rm -rf "$W"
}
trap cleanup EXIT
START=$SECONDS; DEADLINE=$((SECONDS + 520))  # the device call's 9 minutes, with room to clean up
FAILED=0
say() { printf '%s\n' "$*" | tee -a "$O/summary.txt"; }
left() { local l=$((DEADLINE - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
: > "$O/summary.txt"
HAVE_GPU=0; nvidia-smi -L >/dev/null 2>&1 && HAVE_GPU=1
GPU=$(nvidia-smi -L 2>/dev/null | head -1); say "# gpudoctor #31 on $(hostname): ${GPU:-no NVIDIA GPU}; $SHM_NOTE"

# --- install as README line 1 does (offline from wheels when given) -------------------------------------------
t0=$SECONDS
if [ -n "${GPUDOCTOR:-}" ]; then  # an installed gpudoctor (the CPU path on a development machine)
  GD=$GPUDOCTOR
else
  export GPUDOCTOR_HOME=$W/venv GPUDOCTOR_BIN=$W/bin
  if [ -d "${WHEELS:-$SRC/.whl}" ]; then
    ./install.sh --wheels "${WHEELS:-$SRC/.whl}" > "$O/install.log" 2>&1
  else
    ./install.sh > "$O/install.log" 2>&1
  fi || { tail -5 "$O/install.log"; exit 9; }
  GD=$W/bin/gpudoctor
fi
say "install: $($GD --version) in $((SECONDS - t0)) s"
PY=${DEEP_PYTHON:-python3}
PYPATH=$(command -v "$PY") || { say "no $PY (DEEP_PYTHON)"; exit 2; }
say "deep tier python: $PYPATH ($($PY -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1))"

# --- the daemon's private state directory, exported BEFORE anything stages: `model stage` writes its stage record
# (the restage's only trusted source pointer) into $GPUDOCTOR_STATE_DIR, and the daemon reads its record there. The
# H100 run of 2026-12-07 staged first and exported after: the record landed in /var/lib/gpudoctor, and step B was
# refused ("no stage record names one").
mkdir -p "$W/state"
export STATE_DIRECTORY=$W/state GPUDOCTOR_STATE_DIR=$W/state

# --- a small model: persistent source on disk, staged into tmpfs with its boot-id marker -----------------------
MODEL=$SHM/tiny
t0=$SECONDS
python3 -c "import sys; sys.path.insert(0, '$SRC/bench'); from synth_shards import write_model; \
write_model('$W/model-src', shards=3, shard_bytes=64 << 20, sparse=False)" || exit 2
$GD model stage --from "$W/model-src" --to "$MODEL" --apply > "$O/stage.log" 2>&1 || { tail -5 "$O/stage.log"; exit 2; }
say "model: 3 x 64 MiB shards staged into $MODEL in $((SECONDS - t0)) s"
SHARD=$(ls "$MODEL"/*00002-of-00003.safetensors)
if ls "$W/state/staged/"*.json >/dev/null 2>&1; then
  say "  stage record: $(ls "$W/state/staged/"*.json) (where the daemon reads it)"
else
  say "  NO stage record in $W/state/staged: the daemon would have no source to restage from"; exit 2
fi

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$W/inventory.yaml" <<YAML
hosts:
  h200:
    address: local
    expect: {model_paths: [$MODEL]}
policy:
  auto_apply: [model.stage]
  budgets: {max_changes_per_hour: 20, backoff_s: 1}
  recovery: {clean_cycles: 1, retry_s: 5, retry_factor: 1, recurrences: 10}
  verify: {deep: "on", serving: "off", deep_python: $PYPATH, timeout_s: 240}
YAML
cp "$W/inventory.yaml" "$O/"
$GD daemon -i "$W/inventory.yaml" --host h200 --interval 5 --state "$W/state/daemon.json" \
  --metrics-addr "127.0.0.1:$PORT" > "$O/daemon.log" 2>&1 &
DAEMON=$!

# wait_for LABEL TIMEOUT CONDITION: poll /healthz every 0.2 s, print every change of the host's recovery state
# (seconds since the step began), until CONDITION (Python over r = {state, ready, since, reason}) holds: rc 0, else 1.
wait_for() {
  python3 - "$PORT" "$1" "$2" "$3" "$STEP_T0" "$O/last-recovery.json" <<'PY' | tee -a "$O/summary.txt"
import json, sys, time, urllib.request
port, label, timeout, cond, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
end, last = time.time() + timeout, None
while time.time() < end:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            body = json.loads(resp.read())
    except Exception as exc:  # 503 (a step runs long) or not up yet
        body = json.loads(exc.read()) if hasattr(exc, "read") else {}
    r = (body.get("hosts") or {}).get("h200", {}).get("recovery")
    if r:
        now = (r["state"], r["reason"])
        if now != last:
            print(f"  t+{time.time() - t0:6.1f} s  {r['state']:<16} ready={int(bool(r['ready']))}  {r['reason'][:300]}")
            last = now
        if eval(cond, {}, {"r": r}):
            print(f"  {label}: reached in {time.time() - t0:.1f} s")
            json.dump(r, open(sys.argv[6], "w"))
            sys.exit(0)
    time.sleep(0.2)
print(f"  {label}: NOT reached in {timeout:.0f} s")
sys.exit(1)
PY
  return "${PIPESTATUS[0]}"
}
step() { say ""; say "## $*"; STEP_T0=$(date +%s.%N); }
verification() {  # the last verification the ladder recorded: each step's status and wall time
  python3 - "$W/state/recovery.json" <<'PY' | tee -a "$O/summary.txt"
import json, sys
try:
    v = (json.load(open(sys.argv[1]))["hosts"]["h200"].get("last_verification") or {})
except (OSError, ValueError, KeyError) as exc:
    print(f"  (no verification recorded: {exc})"); raise SystemExit
print(f"  last verification: {'passed' if v.get('passed') else 'FAILED'} in {v.get('seconds', 0):.1f} s"
      + (f": {v['reason'][:300]}" if v.get("reason") else ""))
for s in v.get("steps") or []:
    print(f"    {s['name']:<9} {s['status']:<8} {s['seconds']:6.1f} s  {s['detail'][:200]}")
PY
}
expect() { local label=$1; shift; if wait_for "$label" "$@"; then :; else FAILED=1; fi; }

step "A  the daemon starts: never verified -> ready only after the deep tier passed"
if [ "$HAVE_GPU" = 1 ]; then
  expect "A ready" "$(left 150)" 'r["state"] == "ready" and r["ready"]'
  verification
else  # the CPU path: the passive checks fail (no driver), so the ladder never gets to verify
  expect "A not ready without a GPU (the CPU path)" "$(left 60)" \
    'r["state"] == "failing" and not r["ready"] and "NVIDIA" in r["reason"]'
fi

step "B  shard 2 truncated to 47 % -> failing -> restaged (model.stage) -> verified -> ready"
truncate -s $(( $(stat -c %s "$SHARD") * 47 / 100 )) "$SHARD"
kill -USR1 "$DAEMON"
if [ "$HAVE_GPU" = 1 ]; then
  expect "B noticed and healing" "$(left 60)" 'not r["ready"] and r["state"] in ("failing", "healing")'
  expect "B ready" "$(left 150)" 'r["state"] == "ready" and r["ready"]'
  verification
else  # still failing for the driver; the model's own fault is healed all the same
  for _ in $(seq 120); do cmp -s "$SHARD" "$W/model-src/$(basename "$SHARD")" && break; sleep 0.5; done
  if cmp -s "$SHARD" "$W/model-src/$(basename "$SHARD")"; then
    say "  shard 2 restaged by the daemon (model.stage) in $(python3 -c "import time; print(f'{time.time() - $STEP_T0:.1f}')") s: identical to its source"
  else
    say "  shard 2 NOT restaged"; FAILED=1
  fi
  expect "B still not ready (no GPU: the passive checks fail)" 5 'not r["ready"]'
  say ""; say "no GPU here: stopping before the verification (it needs the driver and a GPU); A and B ran up to it"
fi

if [ "$HAVE_GPU" = 1 ]; then
  step "C  a foreign GEMM loop holds GPU 0, shard 2 truncated again -> verification fails naming its PID"
  setsid "$PY" "$SRC/tools/gpu_busy.py" --seconds 400 > "$O/gpu_busy.log" 2>&1 &
  BUSY=$!
  for _ in $(seq 150); do grep -q GEMM "$O/gpu_busy.log" 2>/dev/null && break; sleep 0.2; done
  say "  contender: $(head -1 "$O/gpu_busy.log")"
  BUSYPID=$(grep -om1 'gpu_busy pid [0-9]*' "$O/gpu_busy.log" | awk '{print $3}'); BUSYPID=${BUSYPID:-$BUSY}; BUSY=$BUSYPID
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | sed 's/^/  nvidia-smi: /' | tee -a "$O/summary.txt"
  STEP_T0=$(date +%s.%N)
  truncate -s $(( $(stat -c %s "$SHARD") * 47 / 100 )) "$SHARD"
  kill -USR1 "$DAEMON"
  expect "C verification failed naming a process" "$(left 150)" \
    'r["state"] == "verifying" and not r["ready"] and "deep:" in r["reason"] and "pid " in r["reason"]'
  verification
  if grep -q "pid $BUSYPID\b" "$O/last-recovery.json" 2>/dev/null; then
    say "  the reason names the contender's PID $BUSYPID"
  else
    say "  the reason does NOT name the contender's PID $BUSYPID (see last-recovery.json)"; FAILED=1
  fi
  step "C' the contender ends -> the next verification passes -> ready"
  kill "$BUSY"; wait "$BUSY" 2>/dev/null; BUSY=
  expect "C' ready" "$(left 150)" 'r["state"] == "ready" and r["ready"]'
  verification
fi

# --- the daemon's own account, and the metrics -----------------------------------------------------------------
curl -s -m 5 "http://127.0.0.1:$PORT/metrics" > "$O/metrics.txt" 2>/dev/null \
  || python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" > "$O/metrics.txt"
grep -E '^gpudoctor_(ready|recovery_state\{.*\} 1|recovery_transition)' "$O/metrics.txt" | sed 's/^/  /' | tee -a "$O/summary.txt"
python3 - "$O/daemon.log" > "$O/timeline.txt" <<'PY'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if str(e.get("event", "")).startswith(("recovery.", "remedy.", "daemon.heal")):
        what = {k: e[k] for k in ("before", "after", "remedy", "reason", "state") if k in e}
        print(e.get("timestamp", "?"), e["event"], json.dumps(what)[:400])
PY
say ""; say "timeline (the daemon's recovery.* and remedy events): $O/timeline.txt"; sed 's/^/  /' "$O/timeline.txt" | tail -30
say ""; say "total $((SECONDS - START)) s; $([ $FAILED = 0 ] && echo 'every step as expected' || echo 'A STEP DID NOT BEHAVE (above)')"
exit $FAILED
