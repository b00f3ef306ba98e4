#!/bin/bash
# Host health on a real GPU (issue #26, item 7): a campaign whose server is the SGLang stand-in plus a torch GEMM
# loop of its own (tools/gpu_busy.py, in the server's session: the server's load on the GPU), host_health sampled
# through the real NVML at 2 Hz during every level. While the campaign's third level runs, a FOREIGN torch GEMM loop
# is started in a session of its own: that level -- and only it -- must be recorded suspect, naming the foreign PID.
# Then the sampler's cost on the client (bench/health_cost.py, real NVML) and --rerun-suspect. Nothing on the card
# is changed; both loops end by themselves.
#
#   tools/h200_health_suspect.sh SRC OUTDIR          (OUTDIR gets results, report.md, the log; copy it to docs/h200)
# Without a GPU (CPU path) it runs too: NVML is unavailable there, so the verdict says "NOT VERIFIED" and why.
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ! $PY -c "import gpudoctor" 2>/dev/null; then
  $PY -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gd-health "$SRC" || exit 9
  export PYTHONPATH=/tmp/gd-health
fi
W=$(mktemp -d /tmp/gd-health-XXXX); mkdir -p "$W/model"
PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
cat > "$W/c.yaml" <<YAML
name: h200 host health
model: $W/model
server:
  command: [sh, -c, "$PY $SRC/tools/gpu_busy.py --seconds 600 & exec $PY -m gpudoctor.bench.standin \"\$@\"", sh,
            --decode-tok-s, "60", --ttft-ms, "20"]
  port: $PORT
  env: {PYTHONPATH: "${PYTHONPATH:-}"}
gate:
  command: null
tp: [1]
concurrency: [1, 2, 4, 8]
timeouts: {ready_s: 120, stall_s: 30, stop_s: 10, gpu_release_s: 60}
health: {interval_s: 0.5}
methods:
  baseline: {baseline: true}
workloads:
  - name: chat
    max_tokens: [512]
    num_prompts: 8
YAML
{
  echo "# $($PY -m gpudoctor --version) on $(hostname), $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "## bench run (server: stand-in + its own GEMM loop; a foreign GEMM loop during the third level)"
  $PY -m gpudoctor bench run "$W/c.yaml" --out "$O/run" 2>&1 &
  RUN=$!
  while [ "$(wc -l 2>/dev/null < "$O/run/results.jsonl" || echo 0)" -lt 2 ] && kill -0 $RUN 2>/dev/null; do sleep 0.2; done
  sleep 1  # the third level (concurrency 4: 2 rounds of 512 tokens at 60 tok/s, ~17 s) has just begun
  setsid $PY "$SRC/tools/gpu_busy.py" --seconds 3 > "$O/foreign.log" 2>&1 &  # CUDA start-up + 3 s: inside it
  FOREIGN=$!
  echo "foreign GEMM loop started: pid $FOREIGN"
  wait $RUN; echo "# bench run rc=$?"
  wait $FOREIGN
  $PY -m gpudoctor bench report "$O/run" --no-plots
  echo "## verdict"
  $PY - "$O/run/results.jsonl" "$FOREIGN" <<'PYEOF'
import json, sys
recs = [json.loads(x) for x in open(sys.argv[1])]
pid = int(sys.argv[2])
for r in recs:
    h = r.get("host_health") or {}
    print(f"c={r['concurrency']}: {r['status']} {r.get('output_tok_per_s') or 0:.1f} tok/s, host_health "
          f"{h.get('status')} ({h.get('samples', 0)} samples, sampler {h.get('sampler_cpu_s', 0) * 1000:.1f} ms CPU), "
          f"suspect: {[s['reason'] for s in r.get('suspect') or []]}")
if any((r.get("host_health") or {}).get("status") != "sampled" for r in recs):
    print("NOT VERIFIED: host_health not sampled:", {(r.get('host_health') or {}).get('reason') for r in recs})
    sys.exit(0)
sus = [r["concurrency"] for r in recs if r.get("suspect")]
named = [r["concurrency"] for r in recs if any(f"pid {pid}" in s["reason"] for s in r.get("suspect") or [])]
print("VERIFIED" if sus == named == [4] else "FAILED", f": suspect levels {sus}, naming pid {pid}: {named}")
PYEOF
  echo "## --rerun-suspect (no foreign process now)"
  $PY -m gpudoctor bench run "$W/c.yaml" --out "$O/run" --rerun-suspect 2>&1; echo "# rc=$?"
  echo "## sampler cost, real NVML"
  $PY "$SRC/bench/health_cost.py" --seconds 20
} 2>&1 | tee "$O/h200_health_suspect.log"
rm -rf "$W"
