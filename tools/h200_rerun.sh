#!/bin/bash
# Re-run of issue #13's scenarios on a real GPU host, as root: the healthy host as root and as an ordinary user,
# the uvm and ctl majors denied by a cgroup2 eBPF device program (tools/cgdev.py, our own cgroup only), a stranger
# holding 20 GiB of GPU memory (torch) plus an orphaned bench server, a hand-copied model with a truncated shard in
# /dev/shm, and bench/check_latency.py. Nothing on the card is changed (no nvidia-smi -pm/-r/-pl/-ac/-lgc/-c/-mig,
# no setpci writes, no sysctl writes); the only remedy applied is workload.bench.orphan on our own orphan.
#
#   tools/h200_rerun.sh SRC OUTDIR [OLDSRC]   SRC: a gpudoctor source tree (installed as a package from it);
#                                             OLDSRC: an older tree, for its snapshot as the ordinary user
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O/r"; R=$(cd "$O/r" && pwd); O=$(cd "$O" && pwd)
OLD=${3:+$(cd "$3" && pwd)}
WHL=$(pwd)/.whl
cd /tmp  # not a source tree (no stray gpudoctor/ package on sys.path) and no ./inventory.yaml
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $*"; }
run() {  # run NAME CMD...: output to $R/NAME.txt, rc appended, one line in the summary
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 120 "$@" > "$R/$name.txt" 2>&1; local rc=$?
  local dt=$(python3 -c "import time; print(f'{time.time()-$t0:.2f}')")
  echo "# rc=$rc" >> "$R/$name.txt"
  printf '%-28s rc=%-3s %6ss  %s\n' "$name" "$rc" "$dt" "$(head -c 200 "$R/$name.txt" | head -1)" | tee -a "$O/summary.txt"
}
step install
if [ -d "$WHL" ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 9; fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gd "$SRC" || exit 9
export PYTHONPATH=/tmp/gd:/tmp/site PATH=/tmp/gd/bin:$PATH
GD=/tmp/gd/bin/gpudoctor
chmod -R a+rX /tmp/gd /tmp/site
$GD --version >> "$O/summary.txt" 2>&1
step environment
{ id; uname -a; nvidia-smi -L; grep -E 'nvidia' /proc/devices; ls -la /dev/nvidia* /dev/nvidia-caps 2>&1; ls -la /dev/kmsg 2>&1
  echo "dmesg_restrict=$(cat /proc/sys/kernel/dmesg_restrict 2>&1)"; grep cgroup /proc/mounts; cat /proc/self/cgroup
  dmesg 2>&1 | grep -c . ; dmesg 2>&1 | grep -i xid | tail -5; } > "$R/env.txt" 2>&1
UVM=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices); CTL=195
USERN=gpuser
id -u $USERN >/dev/null 2>&1 || useradd -m $USERN
AS_USER="runuser -u $USERN -- env PYTHONPATH=$PYTHONPATH PATH=$PATH HOME=/home/$USERN"
command -v runuser >/dev/null || AS_USER="setpriv --reuid=$(id -u $USERN) --regid=$(id -g $USERN) --init-groups env PYTHONPATH=$PYTHONPATH PATH=$PATH HOME=/home/$USERN"

step "A healthy, root"
run a-root-check $GD check
run a-root-json $GD check --json
run a-root-snapshot $GD snapshot -o "$R/h200-healthy-root.json"
step "B healthy, ordinary user"
run b-user-check $AS_USER $GD check
run b-user-json $AS_USER $GD check --json
run b-user-snapshot $AS_USER $GD snapshot -o /tmp/h200-healthy-user.json
cp /tmp/h200-healthy-user.json "$R/" 2>/dev/null
if [ -n "$OLD" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gdold "$OLD" && chmod -R a+rX /tmp/gdold
  run b-user-old-snapshot runuser -u $USERN -- env PYTHONPATH=/tmp/gdold:/tmp/site HOME=/home/$USERN \
    /tmp/gdold/bin/gpudoctor snapshot -o /tmp/h200-healthy-user-old.json
  cp /tmp/h200-healthy-user-old.json "$R/" 2>/dev/null
fi
step "C uvm major $UVM denied by an eBPF device program"
run c-uvm-check python3 "$SRC/tools/cgdev.py" "$UVM" -- $GD check
run c-uvm-json python3 "$SRC/tools/cgdev.py" "$UVM" -- $GD check --json
run c-uvm-snapshot python3 "$SRC/tools/cgdev.py" "$UVM" -- $GD snapshot -o "$R/h200-uvm-ebpf-denied.json"
step "D ctl major $CTL denied"
run d-ctl-check python3 "$SRC/tools/cgdev.py" "$CTL" -- $GD check
run d-ctl-snapshot python3 "$SRC/tools/cgdev.py" "$CTL" -- $GD snapshot -o "$R/h200-ctl-ebpf-denied.json"
step "E a stranger holds 20 GiB (torch, user $USERN)"
cat > /tmp/hold.py <<'PY'
import os, socket, sys, time
import torch
x = torch.empty(int(sys.argv[1]) << 30, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
if len(sys.argv) > 2:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[2]))); s.listen()
open(sys.argv[3] if len(sys.argv) > 3 else "/tmp/hold.ready", "w").write(str(os.getpid()))
time.sleep(900)
PY
chmod a+r /tmp/hold.py
rm -f /tmp/hold.ready /tmp/orphan.ready
setsid $AS_USER python3 /tmp/hold.py 20 > "$R/e-holder.log" 2>&1 < /dev/null &
for i in $(seq 1 240); do [ -s /tmp/hold.ready ] && break; sleep 0.25; done
echo "holder pid $(cat /tmp/hold.ready 2>/dev/null)" >> "$O/summary.txt"
run e-busy-check $GD check
run e-busy-json $GD check --json
run e-busy-snapshot $GD snapshot -o "$R/h200-busy-20g.json"
run e-busy-gate $GD gate --profile benchmark
run e-busy-fix $GD fix --only workload.bench.orphan
run e-busy-user-check $AS_USER $GD check
step "F plus an orphaned bench server (2 GiB, port 30000, its campaign gone)"
OWNER=$(python3 -c "from gpudoctor.gather.marker import owner_token; print(owner_token())")
GPUDOCTOR_BENCH_RUN=/tmp/campaign-old GPUDOCTOR_BENCH_LABEL=tp1-old GPUDOCTOR_BENCH_OWNER=$OWNER \
  setsid python3 /tmp/hold.py 2 30000 /tmp/orphan.ready > "$R/f-orphan.log" 2>&1 < /dev/null &
for i in $(seq 1 240); do [ -s /tmp/orphan.ready ] && break; sleep 0.25; done
echo "orphan pid $(cat /tmp/orphan.ready 2>/dev/null) owner $OWNER" >> "$O/summary.txt"
run f-orphan-check $GD check
run f-orphan-snapshot $GD snapshot -o "$R/h200-busy-orphan.json"
run f-orphan-gate $GD gate --profile benchmark
run f-orphan-fix-plan $GD fix --only workload.bench.orphan
run f-orphan-fix-apply $GD fix --only workload.bench.orphan --apply --yes
run f-after-check $GD check
run f-after-gate $GD gate --profile benchmark
kill -9 "$(cat /tmp/hold.ready)" "$(cat /tmp/orphan.ready)" 2>/dev/null
for i in $(seq 1 40); do u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); [ "${u:-1}" -lt 100 ] && break; sleep 0.25; done
step "G hand-copied model with a truncated shard in /dev/shm"
rm -rf /dev/shm/model-trunc
python3 -c "import sys; sys.path.insert(0, '$SRC/bench'); from synth_shards import write_model; write_model('/dev/shm/model-trunc', shards=3, shard_bytes=64 << 20)"
S2=$(ls /dev/shm/model-trunc/*00002-of-00003.safetensors); SZ=$(stat -c %s "$S2"); truncate -s $((SZ * 47 / 100)) "$S2"
run g-trunc-check $GD check --model /dev/shm/model-trunc
run g-trunc-snapshot $GD snapshot --model /dev/shm/model-trunc -o "$R/h200-model-truncated.json"
run g-trunc-gate $GD gate --profile benchmark --model /dev/shm/model-trunc
rm -rf /dev/shm/model-trunc
step "H latency"
run h-latency python3 "$SRC/bench/check_latency.py" --runs 9
cat "$R/h-latency.txt" >> "$O/summary.txt"
step "H2 where a check's time goes"
python3 - "$R/h200-healthy-root.json" > "$R/h2-phases.txt" 2>&1 <<'PY'
import statistics, subprocess, sys, time
from gpudoctor.gather import cuda
probe = [sys.executable, *cuda.FAST, "-c", cuda.PROBE]
def med(fn, n=7):
    ts = []
    for i in range(n + 1):
        t = time.perf_counter(); fn(); dt = time.perf_counter() - t
        if i: ts.append(dt)
    return statistics.median(ts)
run = lambda argv: subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def both():
    a = subprocess.Popen(probe, stdout=subprocess.DEVNULL); b = subprocess.Popen(["nvidia-smi", "-q", "-x"], stdout=subprocess.DEVNULL)
    a.wait(); t = time.perf_counter(); b.wait(); return t
print(f"cuInit probe (-I -S) alone        {med(lambda: run(probe)):.3f} s")
print(f"nvidia-smi -q -x alone            {med(lambda: run(['nvidia-smi', '-q', '-x'])):.3f} s")
print(f"cuInit probe + nvidia-smi at once {med(both):.3f} s (both done)")
print(f"gpudoctor --version (CLI start)   {med(lambda: run(['/tmp/gd/bin/gpudoctor', '--version'])):.3f} s")
print(f"gpudoctor checks (all imports)    {med(lambda: run(['/tmp/gd/bin/gpudoctor', 'checks'])):.3f} s")
print(f"gpudoctor check --snapshot        {med(lambda: run(['/tmp/gd/bin/gpudoctor', 'check', '--snapshot', sys.argv[1]])):.3f} s")
PY
python3 -X importtime /tmp/gd/bin/gpudoctor check > /dev/null 2> "$R/h2-importtime.txt"
step "I kernel log probe"
run i-kmsg python3 -c "
from gpudoctor.gather.kernel_log import read_kernel_log
from gpudoctor.host.local import LocalHost
import json; print(json.dumps(read_kernel_log(LocalHost(), None, 5.0))[:3000])"
run i-kmsg-user $AS_USER python3 -c "
from gpudoctor.gather.kernel_log import read_kernel_log
from gpudoctor.host.local import LocalHost
import json; print(json.dumps(read_kernel_log(LocalHost(), None, 5.0))[:3000])"
tar -C "$O" -czf "$O/results.tgz" r && rm -rf "$R"
ls -la "$O"
