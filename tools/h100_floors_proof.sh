#!/bin/bash
# Issue #42's GPU proof in one run, on an H100 (or an H200: the script says which card gave each number),
# gpudoctor installed as README line 1 installs it, offline (`./install.sh --wheels DIR`, as root: venv /opt/gpudoctor,
# command /usr/local/bin/gpudoctor):
#   1. `gpudoctor check --deep` as installed, no python with torch to be found: exit 0 or 1, never 3; GEMM "not
#      measured" with the reason; the copies judged against their floors;
#   2. `gpudoctor check --deep --deep-python PYTHON` (the host's python3 with torch): every figure measured and judged
#      against the SKU table's floors — for the H100 SXM the floors measured on 2026-12-05 (docs/deep.md) — each ok;
#   3. three `gpudoctor snapshot --deep --deep-python PYTHON` (three healthy runs, the rule's minimum), each replayed
#      through the installed command to the same figures; tools/sku_from_snapshots.py derives the SKU's entry from
#      them (and from them plus the committed capture), to hold against the shipped one.
# Nothing on the card is changed. Each line of OUTDIR/summary.txt is PASS, FAIL or INFO with what was seen.
#
#   tools/h100_floors_proof.sh OUTDIR        (wheels from $WHEELS, default ./.whl: docs/install.md "Offline")
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
WHEELS=${WHEELS:-$SRC/.whl}
: > "$O/summary.txt"
say() { echo "$1 $2" | tee -a "$O/summary.txt"; }
ok() { if eval "$2"; then say PASS "$1"; else say FAIL "$1"; fi; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

[ -d "$WHEELS" ] || { echo "no wheel directory $WHEELS (docs/install.md, Offline)" >&2; exit 9; }
TORCHPY=$(command -v python3)
"$TORCHPY" -c 'import torch' >/dev/null 2>&1 || { echo "python3 on PATH ($TORCHPY) has no torch" >&2; exit 9; }
t0=$(now)
(cd "$SRC" && ./install.sh --wheels "$WHEELS") > "$O/install.log" 2>&1; rc=$?
ok "install.sh --wheels: rc $rc in $(secs "$t0") s" '[ $rc = 0 ]'
[ $rc = 0 ] || { tail -20 "$O/install.log"; exit 1; }
HOMEDIR=$(cd "$SRC" && ./install.sh --where)
GD=/usr/local/bin/gpudoctor
GPY=$HOMEDIR/bin/python
cd /tmp || exit 9  # no ./inventory.yaml, no source tree on sys.path
export GPUDOCTOR_INVENTORY=
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo "# $("$GD" --version 2>&1) at $GD (python $GPY)"
  echo "# card: $(nvidia-smi -L 2>&1 | head -1)"
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max,memory.total \
    --format=csv 2>&1 | sed 's/^/# /'
  echo "# torch python: $TORCHPY $("$TORCHPY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
  echo "# venv torch: $("$GPY" -c 'import importlib.util as u; print(bool(u.find_spec("torch")))' 2>&1)"
  echo "# cores: $(nproc); date: $(date -u +%FT%TZ)"
} | tee "$O/versions.txt"
say INFO "card: $CARD"

summary() {  # the deep figures of a check's JSON: status, key, summary; and the verdict
  "$GPY" - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("verdict", d["verdict"], "exit", d["exit_code"], "root", (d["root_cause"] or {}).get("key"))
for f in d["findings"]:
    if f["id"] == "fabric.deep.figure" or f["id"] == "fabric.nccl.allreduce":
        x = f.get("data") or {}
        print(f"{f['status']:8s} {f['key']}: {f['summary']}"
              + (f" [ratio {x.get('ratio')} floor {x.get('floor')} healthy {x.get('healthy')}]" if x.get("floor") else ""))
EOF
}

# --- 1. --deep as installed: no python with torch anywhere it looks --------------------------------------------
NOTORCH=$(mktemp -d /tmp/gd-notorch.XXXXXX)
printf '#!/bin/sh\nexec %s "$@"\n' "$GPY" > "$NOTORCH/python3"; chmod 755 "$NOTORCH/python3"
t0=$(now)
PATH=$NOTORCH:/usr/local/bin:/usr/bin:/bin "$GD" check --deep --json > "$O/deep-installed.json" 2> "$O/deep-installed.err"
rc=$?; s=$(secs "$t0")
PATH=$NOTORCH:/usr/local/bin:/usr/bin:/bin "$GD" check --deep -a > "$O/deep-installed.txt" 2>&1
summary "$O/deep-installed.json" > "$O/deep-installed.summary" 2>&1
ok "check --deep as installed (no torch): exit $rc in $s s (0 or 1, never 3)" '[ $rc = 0 ] || [ $rc = 1 ]'
ok "as installed: GEMM not measured, with why" 'grep -q "gemm.*not measured" "$O/deep-installed.summary"'
ok "as installed: no traceback" '! grep -q Traceback "$O/deep-installed.json" "$O/deep-installed.err"'

# --- 2. --deep with torch, judged against the SKU's floors -------------------------------------------------------
t0=$(now)
"$GD" check --deep --deep-python "$TORCHPY" --json > "$O/deep-torch.json" 2> "$O/deep-torch.err"; rc=$?; s=$(secs "$t0")
"$GD" check --deep --deep-python "$TORCHPY" -a > "$O/deep-torch.txt" 2>&1
summary "$O/deep-torch.json" > "$O/deep-torch.summary" 2>&1
cat "$O/deep-torch.summary"
ok "check --deep with torch ($TORCHPY): exit $rc in $s s" '[ $rc = 0 ]'
for k in h2d d2h d2d gemm; do
  line=$(grep -m1 "fabric.deep.figure\[GPU 0 $k\]" "$O/deep-torch.summary")
  ok "with torch, $k: ${line:-not found}" '[[ "$line" == ok* ]] && [[ "$line" == *floor* ]]'
done
ok "the SKU is named in the device copy and GEMM lines (no 'no limit known')" \
   'grep -q "GPU 0 d2d\].*of the .*memory bandwidth" "$O/deep-torch.summary" && ! grep -q "no limit known" "$O/deep-torch.summary"'

# --- 3. three deep snapshots: replayed, and the SKU entry the rule derives from them -----------------------------
snaps=()
for i in 1 2 3; do
  t0=$(now)
  "$GD" snapshot --deep --deep-python "$TORCHPY" -o "$O/deep-$i.snapshot.json" > "$O/snapshot-$i.out" 2>&1; rc=$?
  ok "snapshot --deep run $i: exit $rc in $(secs "$t0") s" '[ -s "$O/deep-$i.snapshot.json" ]'
  "$GD" check --snapshot "$O/deep-$i.snapshot.json" --json > "$O/replay-$i.json" 2>&1
  summary "$O/replay-$i.json" > "$O/replay-$i.summary" 2>&1
  ok "snapshot $i replays: $(head -1 "$O/replay-$i.summary")" \
     '! grep -q "not in snapshot" "$O/replay-$i.json" && grep -q "GPU 0 gemm\]: GPU 0: bf16 GEMM" "$O/replay-$i.summary"'
  grep "fabric.deep.figure\[GPU 0 \(d2d\|gemm\|h2d\|d2h\)\]" "$O/replay-$i.summary" | sed "s/^/  run $i: /" | tee -a "$O/summary.txt"
  snaps+=("$O/deep-$i.snapshot.json")
done
"$GPY" "$SRC/tools/sku_from_snapshots.py" "${snaps[@]}" > "$O/derived-3runs.json" 2> "$O/derived-3runs.err"; rc=$?
ok "tools/sku_from_snapshots.py on the 3 runs: exit $rc $(head -c 300 "$O/derived-3runs.err")" '[ $rc = 0 ]'
CAP=$SRC/tests/fixtures/captures/h100-2026-12-05/h100-deep-healthy.snapshot.json
if [[ "$CARD" == *H100*HBM3* ]] && [ -f "$CAP" ]; then
  "$GPY" "$SRC/tools/sku_from_snapshots.py" "$CAP" "${snaps[@]}" > "$O/derived-4runs.json" 2> "$O/derived-4runs.err"
  say INFO "derived from the 2026-12-05 capture and these 3 runs: exit $? (derived-4runs.json)"
fi
"$GPY" - "$O" "$CARD" <<'EOF' | tee -a "$O/summary.txt"
import json, os, sys
from gpudoctor.catalog.deep_limits import sku_for
o, card = sys.argv[1], sys.argv[2]
shipped = sku_for(card)
for name in ("derived-3runs.json", "derived-4runs.json"):
    p = os.path.join(o, name)
    if not os.path.exists(p) or not os.path.getsize(p):
        continue
    got = json.load(open(p))
    for k in ("d2d", "gemm"):
        g, s = got["floors"][k], (shipped or {}).get("floors", {}).get(k, {})
        print(f"INFO {name} {k}: healthy {g['healthy']} floor {g['floor']} (shipped: healthy {s.get('healthy')} "
              f"floor {s.get('floor')}); {g['source']}")
EOF
say INFO "done: $(grep -c ^PASS "$O/summary.txt") PASS, $(grep -c ^FAIL "$O/summary.txt") FAIL"
