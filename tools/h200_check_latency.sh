#!/bin/bash
# Issue #33's proof on a GPU host, in one run, gpudoctor installed as README line 1 installs it (offline:
# `./install.sh --wheels DIR`, as root: venv /opt/gpudoctor, command /usr/local/bin/gpudoctor):
#   1. bench/check_latency.py twice (7 runs each): `gpudoctor check` against a bare cuInit subprocess of the same run
#      (target <= 1.0x) and who answered the driver facts (NVML in process, not nvidia-smi);
#   2. `gpudoctor check --deep` as installed with no python with torch to be found (python3 on PATH is gpudoctor's own
#      venv python): must exit 0 or 1, never 3; GEMM and the NCCL all-reduce "not measured" with the reason;
#   3. `gpudoctor check --deep` with the host's python3 (torch) found by the search itself: GEMM and NCCL measured,
#      the evidence names the python; a deep snapshot of it replays to the same figures;
#   4. NVML read in process beside `nvidia-smi -q -x` of the same moment: every driver fact compared, field by field,
#      with NVML's timings (gpudoctor/gather/driver.py compare()).
# Nothing on the card is changed. Each line of OUTDIR/summary.txt is PASS or FAIL with what was seen.
#
#   tools/h200_check_latency.sh [--dry-run] OUTDIR     (wheels from $WHEELS, default ./.whl)
#   --dry-run: where no wheel directory exists, use the gpudoctor already on PATH instead of installing (a machine
#              without a GPU then answers "no driver" at every step; the script still runs to its end)
set -u
DRY=; [ "${1:-}" = --dry-run ] && { DRY=1; shift; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
WHEELS=${WHEELS:-$SRC/.whl}
: > "$O/summary.txt"
say() { echo "$1 $2" | tee -a "$O/summary.txt"; }
ok() { if eval "$2"; then say PASS "$1"; else say FAIL "$1"; fi; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# --- install, README line 1 ------------------------------------------------------------------------------------
if [ -d "$WHEELS" ]; then
  t0=$(now)
  (cd "$SRC" && ./install.sh --wheels "$WHEELS") > "$O/install.log" 2>&1; rc=$?
  ok "install.sh --wheels: rc $rc in $(secs "$t0") s" '[ $rc = 0 ]'
  HOMEDIR=$(cd "$SRC" && ./install.sh --where)
  GD=$(command -v gpudoctor || echo /usr/local/bin/gpudoctor)
elif [ -n "$DRY" ]; then
  GD=$(command -v gpudoctor) || { echo "no gpudoctor on PATH and no $WHEELS" >&2; exit 9; }
  HOMEDIR=$(cd "$(dirname "$(readlink -f "$GD")")/.." && pwd)
  say SKIP "install: --dry-run without $WHEELS (using $GD)"
else
  echo "no wheel directory $WHEELS (see docs/install.md; tools/h200_check_latency.sh --dry-run runs without)" >&2
  exit 9
fi
GPY=$HOMEDIR/bin/python
cd /tmp || exit 9  # no ./inventory.yaml, no source tree on sys.path
export GPUDOCTOR_INVENTORY=
{
  echo "# $("$GD" --version 2>&1) at $GD (python $GPY)"
  echo "# $(nvidia-smi -L 2>&1 | head -1)"
  echo "# venv torch: $("$GPY" -c 'import importlib.util as u; print(bool(u.find_spec("torch")))' 2>&1)"
  echo "# python3 on PATH: $(command -v python3) torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
  echo "# nvidia-ml-py: $("$GPY" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))' 2>&1)"
} | tee "$O/versions.txt"
ok "the install's venv has no torch (README line 1)" 'grep -q "^# venv torch: False" "$O/versions.txt"'

# --- 1. check latency, twice ----------------------------------------------------------------------------------
for i in 1 2; do
  PATH=$(dirname "$GD"):$PATH "$GPY" "$SRC/bench/check_latency.py" --runs 7 > "$O/check_latency-$i.txt" 2>&1
  r=$(sed -n 's/^ratio gpudoctor check \/ bare cuInit subprocess: \([0-9.]*\)x$/\1/p' "$O/check_latency-$i.txt")
  src=$(sed -n 's/^driver facts from: //p' "$O/check_latency-$i.txt")
  ok "check_latency run $i: check / bare cuInit = ${r:-?}x (target <= 1.0); driver facts: $src" \
     '[ -n "$r" ] && awk -v r="$r" "BEGIN { exit !(r <= 1.0) }" && [[ $src == *"NVML in process"* ]]'
done

# --- 2. --deep as installed, no python with torch anywhere it looks -------------------------------------------
NOTORCH=$(mktemp -d /tmp/gd-notorch.XXXXXX)  # python3 = gpudoctor's own venv python (a wrapper: a symlink would
printf '#!/bin/sh\nexec %s "$@"\n' "$GPY" > "$NOTORCH/python3"; chmod 755 "$NOTORCH/python3"  # lose the venv)
t0=$(now)
PATH=$NOTORCH:/usr/local/bin:/usr/bin:/bin "$GD" check --deep --json > "$O/deep-installed.json" 2> "$O/deep-installed.err"
rc=$?
echo "rc=$rc in $(secs "$t0") s" > "$O/deep-installed.rc"
PATH=$NOTORCH:/usr/local/bin:/usr/bin:/bin "$GD" check --deep -a > "$O/deep-installed.txt" 2>&1
summary() {  # summary JSON: verdict, root cause, deep and NCCL findings, the python line
  "$GPY" - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("verdict", d["verdict"], "exit", d["exit_code"], "root", (d["root_cause"] or {}).get("key"))
for f in d["findings"]:
    if f["id"].startswith("fabric.deep") or f["id"] == "fabric.nccl.allreduce":
        print(f"{f['status']:8s} {f['key']}: {f['summary'][:150]}")
        py = [e for e in f.get("evidence") or [] if e.startswith("python ")]
        if py:
            print("         ", py[0][:200])
EOF
}
summary "$O/deep-installed.json" > "$O/deep-installed.summary" 2>&1
ok "check --deep as installed, no torch: $(cat "$O/deep-installed.rc") (0 or 1, never 3)" '[ $rc = 0 ] || [ $rc = 1 ]'
ok "as installed: GEMM and NCCL marked not measured, with why" \
   'grep -q "gemm.*not measured" "$O/deep-installed.summary" && grep -q "allreduce.*not measured" "$O/deep-installed.summary"'
ok "as installed: no traceback" '! grep -q Traceback "$O/deep-installed.json" "$O/deep-installed.err"'

# --- 3. --deep with torch found by the search ------------------------------------------------------------------
TPATH=$PATH  # python3 on PATH has torch on the H200 (/opt/torch/.venv); else a venv with torch goes first, as a user
if ! python3 -c 'import torch' >/dev/null 2>&1; then  # who activated their serving stack's venv would have it
  for d in /opt/torch/.venv/bin /opt/*/.venv/bin /opt/*/bin; do
    [ -x "$d/python3" ] && "$d/python3" -c 'import torch' >/dev/null 2>&1 && { TPATH=$d:$PATH; break; }
  done
fi
echo "# PATH for the torch run: $TPATH" >> "$O/versions.txt"
t0=$(now)
PATH=$TPATH "$GD" check --deep --json > "$O/deep-torch.json" 2> "$O/deep-torch.err"; rc=$?
echo "rc=$rc in $(secs "$t0") s" > "$O/deep-torch.rc"
summary "$O/deep-torch.json" > "$O/deep-torch.summary" 2>&1
ok "check --deep, torch found: $(cat "$O/deep-torch.rc"), $(grep -m1 -o 'python [^;]*; torch [^)]*)' "$O/deep-torch.summary")" \
   '[ $rc = 0 ] || [ $rc = 1 ]'
ok "with torch: GEMM and the NCCL all-reduce measured" \
   'grep -q "deep.figure\[GPU 0 gemm\]: GPU 0: bf16 GEMM" "$O/deep-torch.summary" && grep -q "allreduce.*NCCL initialises\|allreduce.*bus bandwidth" "$O/deep-torch.summary"'
PATH=$TPATH "$GD" snapshot --deep -o "$O/h200-deep-found.snapshot.json" > "$O/snapshot.out" 2>&1
"$GD" check --snapshot "$O/h200-deep-found.snapshot.json" --json > "$O/deep-found-replay.json" 2>&1
summary "$O/deep-found-replay.json" > "$O/deep-found-replay.summary" 2>&1
ok "the snapshot of it replays (no 'not in snapshot')" \
   '! grep -q "not in snapshot" "$O/deep-found-replay.json" && grep -q "GPU 0 gemm\]: GPU 0: bf16 GEMM" "$O/deep-found-replay.summary"'

# --- 4. NVML in process vs nvidia-smi -q -x, the same moment -----------------------------------------------------
"$GPY" - "$O" <<'EOF' > "$O/nvml-vs-nvidia-smi.txt" 2>&1
import json, subprocess, sys, time
from gpudoctor.host.nvml import read
from gpudoctor.gather.driver import compare
out = sys.argv[1]
t = time.perf_counter(); raw = read(); nvml_s = time.perf_counter() - t
t = time.perf_counter()
try:
    smi = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60)
except (OSError, subprocess.TimeoutExpired) as e:
    smi = subprocess.CompletedProcess([], 127, "", f"nvidia-smi: {e}")
smi_s = time.perf_counter() - t
json.dump(raw, open(out + "/nvml-raw.json", "w"), indent=1, sort_keys=True)
open(out + "/nvidia-smi-qx.xml", "w").write(smi.stdout)
print(f"NVML read {nvml_s * 1e3:.1f} ms (init {raw.get('init_ms')} ms, all calls {raw.get('ms')} ms); "
      f"nvidia-smi -q -x {smi_s * 1e3:.1f} ms rc {smi.returncode}")
if raw.get("error") or smi.returncode:
    print("NO COMPARISON:", raw.get("error"), smi.stderr.strip()[:200]); raise SystemExit(0)
rows = compare(raw, smi.stdout)
for r in rows:
    print(f"{'EQUAL' if r['equal'] else 'DIFFER':6s} {r['field']:40s} nvml={json.dumps(r['nvml'])[:80]} "
          f"nvidia-smi={json.dumps(r['nvidia_smi'])[:80]}")
print(f"fields {len(rows)} equal {sum(r['equal'] for r in rows)} differ {sum(not r['equal'] for r in rows)}")
EOF
line=$(tail -1 "$O/nvml-vs-nvidia-smi.txt")
ok "NVML facts equal nvidia-smi's: $line; $(head -1 "$O/nvml-vs-nvidia-smi.txt")" '[[ $line == *" differ 0" ]]'
rm -rf "$NOTORCH"
grep -c '^FAIL' "$O/summary.txt" > /dev/null && echo "# $(grep -c '^FAIL' "$O/summary.txt") FAIL" | tee -a "$O/summary.txt"
exit 0
