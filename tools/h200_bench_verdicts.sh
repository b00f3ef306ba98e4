#!/bin/bash
# The H200 proof of issue #32: benchmark verdicts on a real GPU. transformers serve (the image's transformers 5.17,
# a ~1 B-parameter bf16 Llama with random weights and a tokenizer trained here: tests/bench/tfserve_model.py, nothing
# downloaded) WITHOUT continuous batching (A) and WITH it (B), each measured by `gpudoctor bench load` at concurrency
# 1, 4 and 16 (--api completions; host health sampled through NVML during every level); then `gpudoctor bench compare
# A B` (verdict per cell, 95 % intervals, the test used), the steady-state window of every level, and the provenance
# of every record with the real SM clock, enforced power limit and clock-event reasons at each level's start and end.
# Nothing on the card is changed. ONE device call, under 9 minutes:
#
#   tools/h200_bench_verdicts.sh SRC OUTDIR        e.g. in a device run: tools/h200_bench_verdicts.sh . "$OUT"
#
# OUTDIR gets (7 files): verdicts.txt (compare's text, then the gate run on it), compare.json, summary.txt (environment,
# steady windows, provenance clocks and power limit per level), report-nocb.md, report-cb.md (bench report: provenance,
# steady state, counters), results-nocb.jsonl, results-cb.jsonl.
# Wheels: .whl/ in SRC (installed with --no-index) must hold gpudoctor's dependencies the image lacks (click, pyyaml,
# psutil, nvidia-ml-py, paramiko, structlog, rich, aiohttp, prometheus-client) and transformers serve's (fastapi,
# uvicorn, openai) if the image lacks those; the script says which import failed (exit 9).
# The CPU path, here: DEVICE=cpu SIZE=tiny MAX_TOKENS=12 TFPY=<lab venv python> GPUDOCTOR=<gpudoctor>
#   tools/h200_bench_verdicts.sh . /tmp/verdicts      (host health then says NVML unavailable; everything else runs)
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-1b}
DTYPE=${DTYPE:-$([ "$DEVICE" = cpu ] && echo float32 || echo bfloat16)}
MAX_TOKENS=${MAX_TOKENS:-64}
TFPY=${TFPY:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
W=$(mktemp -d /tmp/gd-verdicts-XXXX)
S=$O/summary.txt
: > "$S"
say() { echo "$*" | tee -a "$S"; }
if [ -z "${GPUDOCTOR:-}" ]; then
  if [ -d "$SRC/.whl" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$SRC"/.whl/*.whl || exit 9
  fi
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gd "$SRC" || exit 9
  export PYTHONPATH=/tmp/gd:/tmp/site PATH=/tmp/gd/bin:$PATH
  GPUDOCTOR=/tmp/gd/bin/gpudoctor
fi
for mod in click yaml psutil pynvml structlog rich aiohttp prometheus_client; do
  [ "$GPUDOCTOR" != /tmp/gd/bin/gpudoctor ] || python3 -c "import $mod" 2>/dev/null || {
    say "gpudoctor needs the Python module $mod: carry its wheel in .whl/"; exit 9; }
done
for mod in torch transformers tokenizers fastapi uvicorn openai; do
  "$TFPY" -c "import $mod" 2>/dev/null || { say "transformers serve needs the Python module $mod in $TFPY: carry its wheel in .whl/"; exit 9; }
done
cd /tmp  # no stray gpudoctor/ package from the cwd
say "# $($GPUDOCTOR --version 2>&1) on $(hostname); transformers $("$TFPY" -c 'import transformers; print(transformers.__version__)'), torch $("$TFPY" -c 'import torch; print(torch.__version__)')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 | tee -a "$S"
say "== model ($SIZE, $DTYPE on $DEVICE)"
mkdir -p "$W/hf/hub"
HF_HOME=$W/hf timeout 240 "$TFPY" "$SRC/tests/bench/tfserve_model.py" "$W/model" "$SIZE" > "$W/model.log" 2>&1 || { say "model build failed: $(tail -3 "$W/model.log")"; exit 1; }
port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

measure() {  # measure TAG [transformers serve flags...]: one server, levels c1 c4 c16, its report
  local tag=$1; shift
  local p; p=$(port)
  local url=http://127.0.0.1:$p
  HF_HOME=$W/hf setsid "$TFPY" -c 'import sys; from transformers.cli.transformers import main; sys.argv[0] = "transformers"; sys.exit(main())' \
    serve "$W/model" --host 127.0.0.1 --port "$p" \
    --device "$DEVICE" --dtype "$DTYPE" "$@" > "$W/serve-$tag.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do curl -sf -m 2 "$url/health" >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  if ! curl -sf -m 2 "$url/health" >/dev/null; then
    say "transformers serve ($tag) did not come up: $(tail -3 "$W/serve-$tag.log")"; kill -TERM -- -$pid 2>/dev/null; return 1
  fi
  say "== $tag: transformers serve $* (pid $pid)"
  timeout 120 $GPUDOCTOR bench load --server-url "$url" --api completions --concurrency 1 --prompts 2 --max-tokens 8 \
    --ready-timeout 300 --out "$W/warm-$tag" > /dev/null 2>&1
  local c n
  for c in 1 4 16; do
    n=$(( c * 2 > 8 ? c * 2 : 8 ))
    timeout 240 $GPUDOCTOR bench load --server-url "$url" --api completions --concurrency "$c" --prompts "$n" \
      --max-tokens "$MAX_TOKENS" --warmup 0 --label tfserve --server-pid "$pid" --tokenizer-dir "$W/model" \
      --out "$W/$tag" 2>&1 | tail -3 | tee -a "$S"
  done
  kill -TERM -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  cp "$W/$tag/results.jsonl" "$O/results-$tag.jsonl"
  $GPUDOCTOR bench report "$W/$tag" --no-plots > /dev/null 2>&1 && cp "$W/$tag/report.md" "$O/report-$tag.md"
}

if [ "$DEVICE" = cpu ]; then CB=(--continuous-batching --cb-num-blocks 256 --cb-block-size 32 --cb-max-batch-tokens 512)
else CB=(--continuous-batching); fi
measure nocb || exit 1
measure cb "${CB[@]}" || exit 1

say "== bench compare nocb cb"
{ $GPUDOCTOR bench compare "$W/nocb" "$W/cb"; echo "# rc=$?"
  echo "== the gate on it: cb must not be 5 % slower than nocb"
  $GPUDOCTOR bench compare "$W/nocb" "$W/cb" --fail-if "output_tok_per_s < -5%" --fail-if "ttft_ms_p99 > +50%" \
    > "$W/gate.txt" 2>&1; echo "# rc=$?"; grep -E "^GATE|^gate:|^gpudoctor:" "$W/gate.txt"; } > "$O/verdicts.txt" 2>&1
$GPUDOCTOR bench compare "$W/nocb" "$W/cb" --json > "$O/compare.json" 2>/dev/null
cat "$O/verdicts.txt"
python3 - "$W" >> "$S" <<'PY'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for tag in ("nocb", "cb"):
    for line in (w / tag / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        s, p = r.get("steady") or {}, r.get("provenance") or {}
        g = p.get("gpu") or {}
        win = f"{s.get('first')}..{s.get('last')} of {s.get('requests')}" if s.get("status") == "steady" else s.get("status")
        print(f"{tag} c={r['concurrency']}: {r['status']} {r.get('output_tok_per_s') or 0:.1f} tok/s; steady {win} "
              f"({s.get('why')}); steady tok/s {((s.get('metrics') or {}).get('output_tok_per_s') or 0):.1f}")
        for i, one in (g.get("gpus") or {}).items():
            print(f"   GPU{i} {one.get('name')} {one.get('pcie')}: start {one.get('start')} end {one.get('end')}")
        if g.get("status") != "read":
            print(f"   GPUs: {g.get('why')}")
        print(f"   driver {g.get('driver')} CUDA {g.get('cuda')} power limit {g.get('power_limit_w')} W; "
              f"NUMA {p.get('numa')}; server {(p.get('server') or {}).get('engine')} "
              f"{(p.get('server') or {}).get('owned_by')}")
PY
echo "== $O"; ls -la "$O"
