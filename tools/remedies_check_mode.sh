#!/bin/bash
# Exercise every `gpudoctor fix` remedy on a real GPU host in CHECK MODE: plans and diffs only, on the live host and on
# facts derived from its own snapshot. The only applies happen inside private mount namespaces (unshare -m) on
# throw-away copies: a private /dev made of copied nodes (device-node remedies), a temp node bind-mounted over a node
# (mode), a private tmpfs on /dev/shm (model stage). The card's settings are never touched: no nvidia-smi -pm/-r, no
# setpci write, no sysctl write, no systemctl change. A guard directory first on PATH refuses every such call (and logs
# it), and the script compares persistence mode, numa_balancing and each GPU's PCIe DevCtl before and after.
#
# Usage (as root, on the GPU host, from the repository root):
#   tools/remedies_check_mode.sh [OUTDIR]          default OUTDIR: ./remedies-check-mode
#   GPUDOCTOR=/path/to/gpudoctor tools/remedies_check_mode.sh   (an installed gpudoctor; default: the one on PATH)
# Exit: 0 every step as expected, 1 a step differed (see the table), 2 a precondition failed or a setting changed.
set -u
O=$(realpath -m "${1:-remedies-check-mode}"); mkdir -p "$O"
G=${GPUDOCTOR:-gpudoctor}
export GPUDOCTOR_STATE_DIR="$O/state"          # audit log, locks, backups, stage records: never /var/lib/gpudoctor
STATE=(--audit-log "$O/state/audit.jsonl" --lock-dir "$O/state/locks" --backup-dir "$O/state/backups")
RESULTS=()
FAILED=0

note() { printf '%s\n' "$*" | tee -a "$O/log.txt"; }
result() {  # name expected got detail
  local mark=PASS; [ "$2" = "$3" ] || { mark=FAIL; FAILED=1; }
  RESULTS+=("$(printf '%-4s  %-44s expected %-10s got %-10s %s' "$mark" "$1" "$2" "$3" "$4")")
}

# --- preconditions --------------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || { echo "run as root (unshare -m needs it)"; exit 2; }
command -v unshare >/dev/null || { echo "unshare (util-linux) is missing"; exit 2; }
$G --version >/dev/null 2>&1 || { echo "cannot run gpudoctor as '$G' (set GPUDOCTOR=...; needs click, pyyaml, structlog, rich, psutil)"; exit 2; }
nvidia-smi -L >/dev/null 2>&1 || { echo "nvidia-smi does not answer: this script needs a working GPU host"; exit 2; }

# --- the guard: read-only forms of the tools that could change the card pass through; the rest is refused -------------
GUARD="$O/guard"; mkdir -p "$GUARD"; : > "$O/guard.log"
REALPATH_NOGUARD=$PATH
guard() {  # tool, then a bash test on "$*" that is true for allowed calls
  local tool=$1 allow=$2 real
  real=$(PATH=$REALPATH_NOGUARD command -v "$tool") || return 0   # not installed: no wrapper (facts stay true)
  cat > "$GUARD/$tool" <<EOF
#!/bin/bash
a="\$*"
if $allow; then exec "$real" "\$@"; fi
echo "\$(date +%T) REFUSED $tool \$a" >> "$O/guard.log"
echo "remedies_check_mode guard: refusing '$tool \$a' (check mode never changes the card)" >&2
exit 99
EOF
  chmod +x "$GUARD/$tool"
}
guard nvidia-smi '[[ "$a" == "-q -x" || "$a" == "-q" || "$a" == "-L" || "$a" == "topo -m" || "$a" == "topo -p2p r" || "$a" == --query-* ]]'
guard sysctl '[[ "$a" != *=* && "$a" != *-w* && "$a" != *-p* && "$a" != *--system* && "$a" != *--load* ]]'
guard setpci '[[ "$a" != *=* ]]'
guard systemctl '[[ "$a" == is-enabled\ * || "$a" == is-active\ * || "$a" == status\ * || "$a" == show\ * || "$a" == cat\ * ]]'
guard nvidia-persistenced 'false'
guard modprobe 'false'
guard nvidia-modprobe '[[ "${GUARD_PRIVATE_DEV:-0}" == 1 ]]'   # only where /dev is a private copy (step 4)
export PATH="$GUARD:$PATH"

card_state() {  # persistence mode per GPU, numa_balancing, DevCtl of every NVIDIA function (read from sysfs as root)
  nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader
  echo "numa_balancing=$(cat /proc/sys/kernel/numa_balancing 2>/dev/null)"
  python3 - <<'PY'
import os
base = "/sys/bus/pci/devices"
for b in sorted(os.listdir(base)):
    try:
        if open(f"{base}/{b}/vendor").read().strip() != "0x10de":
            continue
        cfg = open(f"{base}/{b}/config", "rb").read(4096)
    except OSError:
        continue
    ptr, seen = (cfg[0x34] & 0xFC) if len(cfg) >= 256 else 0, set()
    while ptr and ptr not in seen and ptr + 10 <= len(cfg):
        seen.add(ptr)
        if cfg[ptr] == 0x10:
            print(f"{b} DevCtl={int.from_bytes(cfg[ptr + 8:ptr + 10], 'little'):#06x}")
            break
        ptr = cfg[ptr + 1] & 0xFC
PY
}
card_state > "$O/card-before.txt"

fixrun() {  # name, expected exit, then args for gpudoctor fix; keeps stdout+stderr, returns the exit code
  local name=$1 want=$2; shift 2
  $G fix "${STATE[@]}" "$@" > "$O/$name.txt" 2>&1
  local rc=$?
  note "== $name: gpudoctor fix $* → exit $rc (expected $want)"
  sed 's/^/   /' "$O/$name.txt" | head -60 | tee -a "$O/log.txt" >/dev/null
  return $rc
}

# --- 1. this host as it is: the plan of every remedy (dry run) ---------------------------------------------------
$G check --json > "$O/check.json" 2>"$O/check.err"; note "check: exit $?"
fixrun 1-host-dry-run 0 --json; rc=$?
result "1 live host, all remedies, dry run" "0|1|2" "$([ $rc -le 2 ] && echo '0|1|2' || echo $rc)" "$(python3 -c "import json,sys; d=json.load(open('$O/1-host-dry-run.txt')); print(len(d['plan']['changes']),'changes',len(d['plan']['refusals']),'refusals')" 2>/dev/null)"

# --- 2. PCIe MaxReadReq under a policy: plan only (setpci is never run in check mode) ---------------------------------
fixrun 2-pcie-policy-512 1 --only fabric.pcie.mrrs --mrrs 512; rc=$?
# a plan (the masked setpci and the boot unit), or a refusal saying why (a container, no setpci, no systemd), or 0
# when every GPU already has MaxReadReq 512
result "2 pcie.mrrs 512: plan, refusal or nothing" "0|1|2" "$([ $rc -le 2 ] && echo '0|1|2' || echo $rc)" "$(grep -m1 -oE 'setpci -s [^ ]+ CAP_EXP\+08.w=2000:7000|REFUSED .{0,90}|nothing to fix' "$O/2-pcie-policy-512.txt")"

# --- 3. the host-wide settings this host has right, planned from its own snapshot with the fault written in --------
$G snapshot -o "$O/snapshot.json" 2>>"$O/log.txt"
python3 - "$O" <<'PY'
import json, sys
o = sys.argv[1]
doc = json.load(open(f"{o}/snapshot.json"))
doc.pop("transcript", None)  # plan from the edited facts, not from a replay of the raw reads
f = doc["facts"]
for g in (f.get("driver") or {}).get("gpus") or []:
    g["persistence_mode"] = "Disabled"
fab = f.setdefault("fabric", {})
fab["numa_balancing"] = "1"
fab["numa_nodes"] = {"node0": "0-7", "node1": "8-15"}
f.setdefault("tools", {}).setdefault("units", {})
json.dump(doc, open(f"{o}/snapshot-faults.json", "w"))
PY
host=$(python3 -c "import json; print(json.load(open('$O/snapshot.json'))['host'])")
fixrun 3a-persistence-from-snapshot 1 --facts "$O/snapshot-faults.json" --only driver.persistence; rc=$?
result "3a persistence off (snapshot): plan or refusal" "1|2" "$([ $rc = 1 ] || [ $rc = 2 ] && echo '1|2' || echo $rc)" "$(grep -m1 -oE 'PLAN .*|REFUSED .{0,90}' "$O/3a-persistence-from-snapshot.txt")"
fixrun 3b-persistence-allow-smi 1 --facts "$O/snapshot-faults.json" --only driver.persistence --allow nvidia-smi-pm; rc=$?
result "3b persistence, --allow nvidia-smi-pm" "1|2" "$([ $rc = 1 ] || [ $rc = 2 ] && echo '1|2' || echo $rc)" "$(grep -m1 -o 'nvidia-smi -i [^ ]* -pm 1' "$O/3b-persistence-allow-smi.txt")"
fixrun 3c-numa-from-snapshot 1 --facts "$O/snapshot-faults.json" --only fabric.numa.balancing; rc=$?
result "3c numa_balancing 1 (snapshot): plan or refusal" "1|2" "$([ $rc = 1 ] || [ $rc = 2 ] && echo '1|2' || echo $rc)" "$(grep -m1 -oE 'sysctl -w kernel.numa_balancing=0|REFUSED .{0,90}' "$O/3c-numa-from-snapshot.txt")"

# --- 4. device nodes: faults and, where safe, applies in private mount namespaces ------------------------------------
U=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
# 4a: nvidia-uvm bound to /dev/null (the cgroup-denial signature): a bind mount is refused, never replaced
unshare -m bash -c 'mount --bind /dev/null /dev/nvidia-uvm && exec "$@"' _ \
  $G fix "${STATE[@]}" --only 'devices.*' > "$O/4a-uvm-bind-null.txt" 2>&1; rc=$?
result "4a uvm bound to /dev/null: refused (bind mount)" 2 "$rc" "$(grep -m1 -o 'is a bind mount[^:]*' "$O/4a-uvm-bind-null.txt")"
# 4b: nvidia-uvm-tools mode 000 (a temp node bound over it): chmod applied to the temp node only
unshare -m bash -c 'd=$(mktemp -d); mknod -m 000 $d/t c '"$U"' 1; mount --bind $d/t /dev/nvidia-uvm-tools; exec "$@"' _ \
  $G fix "${STATE[@]}" --only devices.node.mode --apply --yes > "$O/4b-uvmtools-000-apply.txt" 2>&1
grep -q "APPLIED  devices.node.mode" "$O/4b-uvmtools-000-apply.txt"; result "4b uvm-tools 000: chmod in a namespace" 0 "$?" "$(grep -m1 -o 'NEW VERDICT.*' "$O/4b-uvmtools-000-apply.txt")"
# 4c, 4d: a private /dev (copied nodes on disk) with nvidia-uvm missing and nvidia-uvm-tools at a stale major;
# the remedy makes both with the live major, the new nodes are opened and cuInit runs on them
PRIV='d=$(mktemp -d); for n in null zero random urandom full tty; do cp -a /dev/$n $d/; done;
  for n in /dev/nvidia*; do case $n in /dev/nvidia-uvm|/dev/nvidia-uvm-tools) ;; *) cp -a $n $d/;; esac; done;
  mknod -m 666 $d/nvidia-uvm-tools c 509 1; mkdir $d/shm $d/pts; mount --bind $d /dev; export GUARD_PRIVATE_DEV=1'
unshare -m bash -c "$PRIV"'; exec "$@"' _ $G fix "${STATE[@]}" --only 'devices.*' > "$O/4c-private-dev-dry-run.txt" 2>&1
result "4c private /dev, uvm missing: plan" 1 "$?" "$(grep -m1 -oE 'mknod -m 666 [^ ]+ c [0-9]+ 0|nvidia-modprobe -u -c 0' "$O/4c-private-dev-dry-run.txt")"
unshare -m bash -c "$PRIV"'; "$@"; echo "cuInit after the fix: $(python3 -c "import ctypes; print(ctypes.CDLL(\"libcuda.so.1\").cuInit(0))")"; ls -l /dev/nvidia-uvm*' _ \
  $G fix "${STATE[@]}" --only 'devices.*' --apply --yes > "$O/4d-private-dev-apply.txt" 2>&1
got=$(grep -m1 -oE 'cuInit after the fix: -?[0-9]+' "$O/4d-private-dev-apply.txt" | awk '{print $NF}')
result "4d private /dev: apply, then cuInit" 0 "${got:-none}" "$(grep -m1 -oE '^APPLIED  devices.node.create[^:]*' "$O/4d-private-dev-apply.txt")"

# --- 5. model: a synthetic model staged into a PRIVATE tmpfs on /dev/shm, wiped, restaged by model.stage ------------
MODEL_SRC="$O/model-src"
python3 - "$MODEL_SRC" <<'PY'
import json, os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
def st(tensors, seed):
    header, data = {}, bytearray()
    for i, (name, n) in enumerate(tensors):
        header[name] = {"dtype": "BF16", "shape": [n // 2], "data_offsets": [len(data), len(data) + n]}
        data += bytes((seed + i + k) % 251 for k in range(n))
    raw = json.dumps(header).encode(); raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(data)
wm = {}
for s in (1, 2):
    name = f"model-0000{s}-of-00002.safetensors"
    open(os.path.join(d, name), "wb").write(st([(f"l{s}.w", 1 << 20)], s))
    wm[f"l{s}.w"] = name
json.dump({"metadata": {"total_size": 2 << 20}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
json.dump({"architectures": ["Tiny"]}, open(os.path.join(d, "config.json"), "w"))
PY
unshare -m bash -c 'mount -t tmpfs -o size=256m gpudoctor-check /dev/shm && "$@" && rm -rf /dev/shm/tiny && exec '"$G"' fix '"${STATE[*]}"' --only model.stage --model /dev/shm/tiny --apply --yes' _ \
  $G model stage --from "$MODEL_SRC" --to /dev/shm/tiny --apply > "$O/5-model-restage.txt" 2>&1
grep -q "APPLIED  model.stage" "$O/5-model-restage.txt"; result "5 model wiped from tmpfs: restaged" 0 "$?" "$(grep -m1 -o 'NEW VERDICT.*' "$O/5-model-restage.txt")"

# --- nothing changed on the card ----------------------------------------------------------------------------------------
card_state > "$O/card-after.txt"
if diff -u "$O/card-before.txt" "$O/card-after.txt" > "$O/card-diff.txt"; then
  result "card settings unchanged" same same "$(wc -l < "$O/card-after.txt") values compared"
else
  result "card settings unchanged" same CHANGED "see $O/card-diff.txt"; FAILED=2
fi
refused=$(wc -l < "$O/guard.log")
result "guard: changing calls refused" 0 "$refused" "$(head -c 120 "$O/guard.log")"

note ""; note "remedies in check mode on $(hostname) ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)), output in $O"
for r in "${RESULTS[@]}"; do note "$r"; done
exit $FAILED
