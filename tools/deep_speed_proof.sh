#!/bin/bash
# Issue #51's proof in one device call: the deep tier's wall and its figures against plain torch's.
#   gpudoctor installed as README line 1 installs it, offline (`./install.sh --wheels DIR`, as root: venv
#   /opt/gpudoctor, command /usr/local/bin/gpudoctor); then RUNS (default 5) times, interleaved:
#     `gpudoctor check --deep --json` with the host's python3 (torch) found by the deep tier's own search, its wall;
#     tools/deep_reference.py --nccl on each GPU with that python3: plain torch measuring the same figures;
#     (with OLD=DIR, a source tree of an earlier gpudoctor: its `check --deep` too, run from that tree, its wall);
#   and prints the wall per run (and per GPU), the phase timeline of the first and the last run, and each figure
#   beside torch's with the ratio (median of the runs each). The first run follows `echo 3 > drop_caches` where the
#   machine allows it (no reboot here: the nearest to a first run after boot; said so when not allowed).
# Nothing on the card is changed. Each line of OUTDIR/summary.txt is PASS, FAIL or INFO.
#
#   tools/deep_speed_proof.sh OUTDIR [RUNS]      (wheels from $WHEELS, default ./.whl: docs/install.md "Offline")
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
RUNS=${2:-5}
WHEELS=${WHEELS:-$SRC/.whl}
OLD=${OLD:-}
: > "$O/summary.txt"
say() { echo "$1 $2" | tee -a "$O/summary.txt"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

[ -d "$WHEELS" ] || { echo "no wheel directory $WHEELS (docs/install.md, Offline)" >&2; exit 9; }
TORCHPY=$(command -v python3)
"$TORCHPY" -c 'import torch' >/dev/null 2>&1 || { echo "python3 on PATH ($TORCHPY) has no torch" >&2; exit 9; }
t0=$(now)
(cd "$SRC" && ./install.sh --wheels "$WHEELS") > "$O/install.log" 2>&1; rc=$?
say "$([ $rc = 0 ] && echo PASS || echo FAIL)" "install.sh --wheels: rc $rc in $(secs "$t0") s"
[ $rc = 0 ] || { tail -20 "$O/install.log"; exit 1; }
GD=/usr/local/bin/gpudoctor
GPY=$(cd "$SRC" && ./install.sh --where)/bin/python
cd /tmp || exit 9  # no ./inventory.yaml, no source tree on sys.path
export GPUDOCTOR_INVENTORY=
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
{
  echo "# $("$GD" --version 2>&1) at $GD (python $GPY); torch python $TORCHPY" \
       "($("$TORCHPY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
  nvidia-smi -L 2>&1 | sed 's/^/# /'
  nvidia-smi --query-gpu=name,driver_version,power.limit,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1 | sed 's/^/# /'
  nvidia-smi topo -m 2>&1 | sed 's/^/# topo: /'
  echo "# cores: $(nproc); NUMA nodes: $(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l); date: $(date -u +%FT%TZ)"
} | tee "$O/versions.txt"

for i in $(seq 1 "$RUNS"); do
  if [ "$i" = 1 ]; then
    if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then say INFO "run 1 after drop_caches (cold page cache)"
    else say INFO "run 1: drop_caches not allowed here (page cache as it was)"; fi
  fi
  t0=$(now)
  "$GD" check --deep --json > "$O/check-$i.json" 2> "$O/check-$i.err"; rc=$?
  echo "$rc $(secs "$t0")" > "$O/check-$i.wall"
  echo "check --deep run $i: exit $rc in $(cat "$O/check-$i.wall" | cut -d' ' -f2) s"
  for g in $(seq 0 $((NGPU - 1))); do
    "$TORCHPY" "$SRC/tools/deep_reference.py" "$g" --nccl > "$O/ref-$i-$g.json" 2> "$O/ref-$i-$g.err"
  done
  if [ -n "$OLD" ]; then
    t0=$(now)
    PYTHONPATH=$OLD "$GPY" -m gpudoctor check --deep --json > "$O/old-$i.json" 2> "$O/old-$i.err"; rc=$?
    echo "$rc $(secs "$t0")" > "$O/old-$i.wall"
    echo "previous code's check --deep run $i: exit $rc in $(cut -d' ' -f2 "$O/old-$i.wall") s"
  fi
done

"$GPY" - "$O" "$RUNS" "$NGPU" <<'EOF' | tee -a "$O/summary.txt"
import json, os, re, statistics, sys
from gpudoctor.gather.deep_timeline import render
o, runs, ngpu = sys.argv[1], int(sys.argv[2]), max(int(sys.argv[3]), 1)
med = statistics.median
walls, docs = [], []
for i in range(1, runs + 1):
    rc, wall = open(f"{o}/check-{i}.wall").read().split()
    walls.append(float(wall))
    try:
        docs.append(json.load(open(f"{o}/check-{i}.json")))
    except ValueError:
        docs.append(None)
    print(f"INFO run {i}: check --deep exit {rc}, wall {float(wall):.2f} s = {float(wall) / ngpu:.2f} s per GPU")
old = [float(open(f"{o}/old-{i}.wall").read().split()[1]) for i in range(1, runs + 1) if os.path.exists(f"{o}/old-{i}.wall")]
per = med(walls) / ngpu
print(f"{'PASS' if per <= 6.0 else 'FAIL'} wall: median {med(walls):.2f} s of {runs} runs on {ngpu} GPU(s) = {per:.2f} s "
      f"per GPU (target <= 6 s); first run {walls[0]:.2f} s, min {min(walls):.2f}, max {max(walls):.2f}")
if old:
    print(f"INFO previous code: median {med(old):.2f} s (min {min(old):.2f}, max {max(old):.2f}); "
          f"now/before {med(walls) / med(old):.2f}x")
for label, d in (("first", docs[0]), ("last", docs[-1])):
    tl = (d or {}).get("deep_timeline")
    print(f"INFO timeline of the {label} run (start end length phase, s since gpudoctor started):")
    for ln in render(tl) if tl else ["  (none)"]:
        print("INFO   " + ln)
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
olddocs = [load(f"{o}/old-{i}.json") for i in range(1, runs + 1) if os.path.exists(f"{o}/old-{i}.json")]
if olddocs:
    tl = (olddocs[0] or {}).get("deep_timeline")
    print("INFO timeline of the previous code's first run:")
    for ln in render(tl) if tl else ["  (none: that code records no timeline)"]:
        print("INFO   " + ln)

def figures(docs, into):
    for d in docs:
        for f in (d or {}).get("findings", []):
            x = f.get("data") or {}
            if f["id"] == "fabric.deep.figure" and "value" in x and x.get("kind"):
                into.setdefault((x["gpu"], x["kind"]), []).append(x["value"])
            if f["id"] == "fabric.nccl.allreduce" and (f.get("subject") or "").startswith("TP1"):
                m = re.search(r"algbw ([0-9.]+) GB/s", " ".join(f.get("evidence") or []))
                if m:
                    into.setdefault((0, "nccl_algbw"), []).append(float(m.group(1)))
    return into

prev = figures(olddocs, {})
got, ref = {}, {}
for i, d in enumerate(docs, 1):
    figures([d], got)
    for g in range(ngpu):
        try:
            r = json.loads(open(f"{o}/ref-{i}-{g}.json").read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            continue
        for k, v in r.items():
            if isinstance(v, (int, float)) and k not in ("bytes", "at"):
                ref.setdefault((g, k), []).append(v)
print("INFO figure              gpudoctor (median)   plain torch (median)   ratio")
for key in sorted(set(got) | set(ref)):
    g, k = key
    a, b = got.get(key), ref.get(key)
    if not a or not b:
        print(f"INFO GPU {g} {k:16s} {'-' if not a else f'{med(a):10.1f}'} vs {'-' if not b else f'{med(b):10.1f}'}: "
              "not measured by both")
        continue
    ratio = med(a) / med(b)
    bound = 0.03
    was = f"; previous code {med(prev[key]):.1f}" if prev.get(key) else ""
    print(f"{'PASS' if abs(ratio - 1) <= bound else 'FAIL'} GPU {g} {k:16s} {med(a):10.1f} vs {med(b):10.1f}   "
          f"{ratio:.3f} (within {bound:.0%}; runs: {', '.join(f'{v:.1f}' for v in a)}; torch: "
          f"{', '.join(f'{v:.1f}' for v in b)}{was})")
EOF
say INFO "done: $(grep -c ^PASS "$O/summary.txt") PASS, $(grep -c ^FAIL "$O/summary.txt") FAIL"
