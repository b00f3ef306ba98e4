#!/usr/bin/env bash
# The H200 proof of issue #25: gpudoctor as shipped against Hugging Face `transformers serve` 5.17 (continuous
# batching, a ~1 B-parameter bf16 Llama with random weights and a tokenizer trained here, nothing downloaded),
# --api completions and chat, concurrency 1/4/16 and open loop 2 and 8 req/s; each level held against the wire:
# the loopback packets of the same requests (tools/wire_compare.py, AF_PACKET with kernel timestamps; root).
#
#   sudo tools/h200_transformers_wire.sh [OUTDIR]        # on the H200 (copy OUTDIR/wire_report.txt into docs/)
#   sudo DEVICE=cpu SIZE=tiny MAX_TOKENS=16 LEVELS="c1 c4 r2" tools/h200_transformers_wire.sh   # the CPU path
#
# Env: VENV (a venv with torch, transformers[serving]==5.17.0, requests, tokenizers; built when missing),
# GPUDOCTOR (the gpudoctor command, default: gpudoctor on PATH), TOL (default 0.01: 1 %).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d /tmp/h200-tfwire.XXXXXX)}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-1b}
DTYPE=${DTYPE:-$([ "$DEVICE" = cpu ] && echo float32 || echo bfloat16)}
MAX_TOKENS=${MAX_TOKENS:-256}
LEVELS=${LEVELS:-"c1 c4 c16 r2 r8"}
TOL=${TOL:-0.01}
GPUDOCTOR=${GPUDOCTOR:-gpudoctor}
VENV=${VENV:-$(python3 -c 'from tests.bench.transformers_lab import venv_dir; print(venv_dir())')}
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "$0: needs root (the wire capture opens an AF_PACKET socket on lo)" >&2; exit 3; }
if [ ! -f "$VENV/.complete" ]; then
  echo "== building $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0 'transformers[serving]==5.17.0' requests tokenizers
  touch "$VENV/.complete"
fi
export HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
mkdir -p "$HF_HOME/hub"
echo "== model ($SIZE) in $OUT/model"
[ -f "$OUT/model/config.json" ] || "$VENV/bin/python" tests/bench/tfserve_model.py "$OUT/model" "$SIZE"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
CB=(--continuous-batching)
[ "$DEVICE" = cpu ] && CB+=(--cb-num-blocks 256 --cb-block-size 32)
setsid "$VENV/bin/transformers" serve "$OUT/model" --host 127.0.0.1 --port "$PORT" --device "$DEVICE" \
  --dtype "$DTYPE" "${CB[@]}" >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM -- -$SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf -m 2 "$URL/health" >/dev/null && break; sleep 0.5; done
echo "== warm-up (not compared)"
$GPUDOCTOR bench load --server-url "$URL" --api completions --concurrency 1 --prompts 2 --max-tokens 16 \
  --ready-timeout 600 --out "$OUT/warmup" >/dev/null 2>&1 || true
report=$OUT/wire_report.txt
{ echo "# transformers serve 5.17 on $DEVICE ($SIZE, $DTYPE), gpudoctor $($GPUDOCTOR --version 2>/dev/null || true)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$report"
rc=0
for api in completions chat; do
  for lv in $LEVELS; do
    case $lv in
      c*) load=(--concurrency "${lv#c}" --prompts $(( ${lv#c} * 4 > 8 ? ${lv#c} * 4 : 8 )));;
      r*) load=(--request-rate "${lv#r}" --prompts $(( ${lv#r} * 10 > 16 ? ${lv#r} * 10 : 16 )));;
    esac
    dir=$OUT/$api-$lv
    python3 tools/wire_compare.py capture --port "$PORT" --out "$dir.wire.jsonl" -- \
      $GPUDOCTOR bench load --server-url "$URL" --api "$api" "${load[@]}" --max-tokens "$MAX_TOKENS" --warmup 0 \
      --tokenizer-dir "$OUT/model" --out "$dir" >"$dir.log" 2>&1 || { echo "bench load failed: $dir.log" >>"$report"; rc=1; }
    python3 tools/wire_compare.py compare --wire "$dir.wire.jsonl" --results "$dir/results.jsonl" \
      --max-tokens "$MAX_TOKENS" --tol "$TOL" >>"$report" || rc=1
  done
done
cat "$report"
echo "== $report (rc $rc)"
exit $rc
