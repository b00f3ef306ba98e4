#!/bin/bash
# The deep tier's proof on a real GPU host (issue #27, item 6). Nothing on the card is changed.
#   1. healthy: `gpudoctor check --deep --json` (its wall time: <= 30 s per GPU) beside a plain torch measurement
#      (tools/deep_reference.py) in the same run: H2D/D2H pinned, pageable, device copy and GEMM within 5 %; a deep
#      snapshot of it (tests replay it).
#   2. contention: tools/deep_contend.py runs GEMMs and copies on GPU 0; `check --deep` refuses to measure the held
#      GPU; `check --deep --force` measures it and names the contender's PID as the root cause; a snapshot of that.
#   3. placement: the check again under `taskset` on CPUs of another NUMA node and under `numactl --membind` of a
#      remote node, where the machine has one (a one-node VM: said so, not faked).
#
#   tools/h200_deep.sh SRC OUTDIR
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd /tmp  # no ./inventory.yaml, no stray source tree on sys.path
export PYTHONUNBUFFERED=1
GDDIR=/tmp/gd-deep.$$
if python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$GDDIR" "$SRC" >/dev/null 2>&1; then
  export PYTHONPATH=$GDDIR PATH=$GDDIR/bin:$PATH
  GD=$GDDIR/bin/gpudoctor
else  # no wheel builder here: run from the source tree
  export PYTHONPATH=$SRC
  GD="python3 -m gpudoctor"
fi
PY=${DEEP_PYTHON:-python3}   # a python with torch (the deep tier falls back to CUDA through ctypes without one)
CONTENDER=
cleanup() { [ -n "$CONTENDER" ] && kill "$CONTENDER" 2>/dev/null; wait 2>/dev/null; rm -rf "$GDDIR"; }
trap cleanup EXIT
timed() {  # timed LABEL OUTFILE CMD...: run CMD, keep its stdout in OUTFILE, log rc and wall time
  local label=$1 out=$2; shift 2
  local t0; t0=$(date +%s.%N)
  "$@" > "$out" 2> "$out.err"; local rc=$?
  echo "## $label: rc=$rc in $(python3 -c "import time; print(f'{time.time()-$t0:.2f}')") s ($*)"
}
compare() {  # compare CHECK_JSON REFERENCE_JSON: each figure of GPU 0 against plain torch, within 5 %
  python3 - "$1" "$2" <<'PYEOF'
import json, sys
doc, ref = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
if "error" in ref:
    print("# reference:", ref["error"]); raise SystemExit(0)
got = {f["data"]["kind"]: f["data"] for f in doc["findings"] if f["id"] == "fabric.deep.figure"
       and f["data"].get("gpu") == 0 and "kind" in f["data"]}
for kind in ("h2d", "d2h", "h2d_pageable", "d2h_pageable", "d2d", "gemm"):
    g, r = got.get(kind), ref.get(kind)
    if g is None or r is None:
        print(f"{kind:14s} check {g and g['value']} reference {r}: missing"); continue
    dev = (g["value"] - r) / r
    print(f"{kind:14s} check {g['value']:9.1f} {g['unit']:8s} reference {r:9.1f}  {dev:+.1%}  "
          f"ratio {g['ratio']} floor {g['floor']}  {'ok' if abs(dev) <= 0.05 else 'OFF BY MORE THAN 5 %'}")
print("verdict", doc["verdict"], "root cause", (doc["root_cause"] or {}).get("key"))
PYEOF
}
{
  echo "# $($GD --version) on $(hostname), $(nvidia-smi -L 2>&1 | head -1), $($PY -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)"
  echo; echo "# 1. healthy"
  timed "check --deep" "$O/deep-healthy.json" $GD check --deep --deep-python "$PY" --json
  timed "plain torch reference" "$O/reference-healthy.json" $PY "$SRC/tools/deep_reference.py" 0
  compare "$O/deep-healthy.json" "$O/reference-healthy.json"
  timed "snapshot --deep" "$O/snapshot.out" $GD snapshot --deep --deep-python "$PY" -o "$O/h200-deep-healthy.snapshot.json"
  $GD check --snapshot "$O/h200-deep-healthy.snapshot.json" | grep -E "deep|Root cause|WARN|FAIL" | head -20

  echo; echo "# 2. contention"
  $PY "$SRC/tools/deep_contend.py" 0 240 > "$O/contender.out" 2>&1 &
  CONTENDER=$!
  sleep 15; echo "contender pid $CONTENDER: $(head -1 "$O/contender.out")"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  timed "check --deep (held GPU, no --force)" "$O/deep-held.json" $GD check --deep --deep-python "$PY" --json
  python3 -c "import json; d=json.load(open('$O/deep-held.json')); print([f['summary'] for f in d['findings'] if f['id']=='fabric.deep.figure'])"
  timed "check --deep --force" "$O/deep-contended.json" $GD check --deep --force --deep-python "$PY" --json
  python3 -c "import json; d=json.load(open('$O/deep-contended.json')); r=d['root_cause'] or {}; print('root cause', r.get('key'), '|', r.get('summary'))"
  timed "snapshot --deep --force (contended)" "$O/snapshot2.out" $GD snapshot --deep --force --deep-python "$PY" -o "$O/h200-deep-contended.snapshot.json"
  kill "$CONTENDER"; wait "$CONTENDER" 2>/dev/null; CONTENDER=
  timed "check --deep after the contender ended" "$O/deep-after.json" $GD check --deep --deep-python "$PY" --json
  python3 -c "import json; d=json.load(open('$O/deep-after.json')); print('verdict', d['verdict'], 'root', (d['root_cause'] or {}).get('key'))"

  echo; echo "# 3. placement"
  nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
  echo "NUMA nodes: $nodes; GPU 0 numa_node: $(cat /sys/bus/pci/devices/*/numa_node 2>/dev/null | head -1)"
  if [ "$nodes" -gt 1 ] && command -v numactl >/dev/null; then
    timed "numactl --membind=1 --cpunodebind=1 check --deep" "$O/deep-numa1.json" numactl --membind=1 --cpunodebind=1 $GD check --deep --deep-python "$PY" --json
    compare "$O/deep-numa1.json" "$O/reference-healthy.json"
  else
    echo "one NUMA node (or no numactl): a remote node cannot be shown here; the replayed snapshots show it"
  fi
  timed "taskset -c 0 check --deep" "$O/deep-taskset0.json" taskset -c 0 $GD check --deep --deep-python "$PY" --json
  compare "$O/deep-taskset0.json" "$O/reference-healthy.json"
} > "$O/h200-deep.txt" 2>&1
cat "$O/h200-deep.txt"
