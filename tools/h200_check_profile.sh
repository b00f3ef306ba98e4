#!/bin/bash
# Issue #33 item 4: where a live `gpudoctor check` spends its time on a GPU host, in ONE device call (< 3 minutes),
# gpudoctor installed as README line 1 installs it (offline: `./install.sh --wheels DIR`, as root):
#   1. bench/check_latency.py once (7 runs each): check vs a bare cuInit subprocess of the same run;
#   2. 5x `gpudoctor -vv check --json` (stdout and the -vv log kept: probe.finished gives each subsystem's seconds);
#   3. 5x tools/check_timeline.py: one check each, every phase marked (wall ms since launch, the process's CPU ms),
#      each subsystem's start and end, and the critical path's tail.
# Everything lands in ONE tar file, $OUT/h200_check_profile.tar (the device returns few files); the summary is printed.
#
#   tools/h200_check_profile.sh [--dry-run | --standin] [OUTDIR]     (OUTDIR default $OUT; wheels from $WHEELS,
#                                                                     default ./.whl)
#   --dry-run: no install; the gpudoctor on PATH (a machine without a GPU answers "no driver" throughout).
#   --standin: as --dry-run, with a stand-in libcuda.so.1 (cuInit sleeps 0.235 s, as the H200's took) and the H200
#              NVML stand-in of tests/core/test_nvml_facts.py compiled with gcc and put first on LD_LIBRARY_PATH:
#              the local timing model of issue #33 (docs/architecture.md, "Decisions the code taught us").
# On the H200 (the lead's one device call, from the repository root with the wheels in .whl/):
#   tools/h200_check_profile.sh "$OUT"
set -u
MODE=; case "${1:-}" in --dry-run|--standin) MODE=$1; shift;; esac
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:-${OUT:?give OUTDIR or set OUT}}; mkdir -p "$O"; O=$(cd "$O" && pwd)
W=$(mktemp -d /tmp/gd-profile.XXXXXX); P=$W/h200_check_profile; mkdir -p "$P"
WHEELS=${WHEELS:-$SRC/.whl}
say() { echo "$*" | tee -a "$P/summary.txt"; }

if [ -z "$MODE" ]; then
  [ -d "$WHEELS" ] || { echo "no wheel directory $WHEELS (--dry-run runs without)" >&2; exit 9; }
  t0=$(date +%s.%N)
  (cd "$SRC" && ./install.sh --wheels "$WHEELS") > "$P/install.log" 2>&1; rc=$?
  say "install.sh --wheels: rc $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
  [ $rc = 0 ] || { tar -C "$W" -cf "$O/h200_check_profile.tar" h200_check_profile; exit 1; }
  HOMEDIR=$(cd "$SRC" && ./install.sh --where)
  GD=$(command -v gpudoctor || echo /usr/local/bin/gpudoctor)
else
  GD=$(command -v gpudoctor) || { echo "no gpudoctor on PATH" >&2; exit 9; }
  HOMEDIR=$(cd "$(dirname "$(readlink -f "$GD")")/.." && pwd)
  say "no install ($MODE): $GD"
fi
GPY=$HOMEDIR/bin/python
if [ "$MODE" = --standin ]; then
  cat > "$W/cuda.c" <<'EOF'
#include <unistd.h>
static int count = -1;
int cuInit(unsigned int f) { usleep(235000); count = 1; return 0; }
int cuDeviceGetCount(int *n) { *n = count; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuGetErrorName(int c, const char **n) { *n = c ? "CUDA_ERROR_UNKNOWN" : "CUDA_SUCCESS"; return 0; }
EOF
  python3 - "$SRC/tests/core/test_nvml_facts.py" "$W/nvml.c" <<'EOF'
import re, sys
c = re.search(r'H200_NVML = r"""(.*?)"""', open(sys.argv[1]).read(), re.S).group(1)
c = c.replace("int nvmlInitWithFlags(unsigned f) { return 0; }\nint nvmlInit_v2(void) { return 0; }",
              "#include <unistd.h>\nint nvmlInit_v2(void) { usleep(28000); return 0; }\n"  # the H200's nvmlInit alone
              "int nvmlInitWithFlags(unsigned f) { return nvmlInit_v2(); }")
open(sys.argv[2], "w").write(c)
EOF
  gcc -shared -fPIC -o "$W/libcuda.so.1" "$W/cuda.c" && gcc -shared -fPIC -o "$W/libnvidia-ml.so.1" "$W/nvml.c" || exit 9
  export LD_LIBRARY_PATH=$W${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
cd /tmp || exit 9  # no ./inventory.yaml, no source tree on sys.path
export GPUDOCTOR_INVENTORY=
{
  echo "# $("$GD" --version 2>&1) at $GD (python $GPY); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $(nvidia-smi -L 2>&1 | head -1)"
  echo "# nvidia-ml-py: $("$GPY" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))' 2>&1)"
} > "$P/versions.txt"
cat "$P/versions.txt"

PATH=$(dirname "$GD"):$PATH "$GPY" "$SRC/bench/check_latency.py" --runs 7 > "$P/check_latency.txt" 2>&1
cat "$P/check_latency.txt"
for i in 1 2 3 4 5; do
  "$GD" -vv check --json > "$P/check-vv-$i.json" 2> "$P/check-vv-$i.log"
  "$GPY" "$SRC/tools/check_timeline.py" --launched "$(date +%s.%N)" check --json > "$P/timeline-$i.json" 2> "$P/timeline-$i.err"
done
"$GPY" - "$P" <<'EOF' | tee -a "$P/summary.txt"
import glob, json, statistics, sys
p = sys.argv[1]
secs = {}
for f in sorted(glob.glob(p + "/check-vv-*.log")):
    for ln in open(f):
        try:
            d = json.loads(ln)
        except ValueError:
            continue
        if d.get("event") == "probe.finished":
            secs.setdefault(d["subsystem"], []).append(d["seconds"])
print("-vv probe.finished, median seconds over 5 checks (from the gather's start):")
print("  " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in sorted(secs.items(), key=lambda kv: -statistics.median(kv[1]))))
for f in sorted(glob.glob(p + "/timeline-*.json")):
    try:
        d = json.load(open(f))
    except ValueError:
        print(f"{f}: no timeline (see its .err)")
        continue
    m = {x[2]: x[0] for x in d["marks"]}
    launched = -min(x[0] for x in d["marks"])
    keys = ["gpudoctor.entry imported", "gpudoctor.cli imported", "gather begin", "gather end", "exit"]
    print(f"{f.rsplit('/', 1)[1]}: launch->first line {launched:.0f} ms; " +
          "; ".join(f"{k.replace('gpudoctor.', '')} {m[k]:.0f}" for k in keys if k in m))
    for ln in d["critical_path"]:
        print("   " + ln)
EOF
tar -C "$W" -cf "$O/h200_check_profile.tar" h200_check_profile && echo "wrote $O/h200_check_profile.tar"
rm -rf "$W"
