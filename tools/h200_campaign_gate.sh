#!/bin/bash
# A campaign's gate judged in process on a real GPU host (issue #11): gpudoctor installed as a package from SRC, a
# small safetensors model in /dev/shm, the SGLang stand-in as the server, `gate: gpudoctor gate --profile benchmark`.
# Run 1: the model complete -> the gate passes on the real driver, nodes and CUDA, the levels are measured.
# Run 2: the configuration's model is an empty directory -> the campaign stops before it with the gate's blocker.
# Beside them, `gpudoctor gate` itself on the same host and model. Nothing on the card is changed.
#
#   tools/h200_campaign_gate.sh SRC OUTDIR
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
WHL=$SRC/.whl
cd /tmp  # no ./inventory.yaml, no stray source tree on sys.path
export PYTHONUNBUFFERED=1
if [ -d "$WHL" ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 9; fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gd "$SRC" || exit 9
export PYTHONPATH=/tmp/gd:/tmp/site PATH=/tmp/gd/bin:$PATH
GD=/tmp/gd/bin/gpudoctor
W=/dev/shm/gd-campaign-gate
rm -rf "$W"; mkdir -p "$W/empty"
python3 -c "import sys; sys.path.insert(0, '$SRC'); from pathlib import Path
from tests.model.modelfiles import write_model; write_model(Path('$W/model'), shards=2, elems=4096)" || exit 9
campaign() {  # campaign FILE MODEL
  cat > "$1" <<EOF
name: h200 gate
model: $2
server:
  command: [python3, -m, gpudoctor.bench.standin, --decode-tok-s, "400", --ttft-ms, "10"]
  port: 30123
  env: {PYTHONPATH: "$PYTHONPATH"}
gate:
  command: gpudoctor gate --profile benchmark
tp: [1]
concurrency: [1, 2]
timeouts: {ready_s: 60, stall_s: 15, stop_s: 5, gpu_release_s: 30}
workloads:
  - name: chat
    max_tokens: [24]
    num_prompts: 4
methods:
  baseline: {baseline: true}
EOF
}
{
  echo "# $($GD --version) on $(hostname), $(nvidia-smi -L | head -1)"
  echo; echo "## gpudoctor gate --profile benchmark --model $W/model"
  t0=$(date +%s.%N); $GD gate --profile benchmark --model "$W/model"; echo "# rc=$? in $(python3 -c "import time; print(f'{time.time()-$t0:.2f}')") s"
  for run in complete empty; do
    model=$W/model; [ $run = empty ] && model=$W/empty
    campaign "$W/$run.yaml" "$model"
    echo; echo "## bench run, the model $run ($model)"
    t0=$(date +%s.%N)
    $GD bench run "$W/$run.yaml" --out "$W/out-$run" 2>&1 | grep -E "gate|campaign|level|records|gpudoctor:" | head -20
    echo "# rc=${PIPESTATUS[0]} in $(python3 -c "import time; print(f'{time.time()-$t0:.2f}')") s"
    [ -f "$W/out-$run/results.jsonl" ] && python3 -c "
import json; rs = [json.loads(l) for l in open('$W/out-$run/results.jsonl')]
print('# records:', [(r['label'], r['concurrency'], r['status']) for r in rs])"
  done
} > "$O/campaign-gate.txt" 2>&1
cat "$O/campaign-gate.txt"
rm -rf "$W"
