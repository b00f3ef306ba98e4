#!/bin/bash
# Issue #40's proof on a GPU host, in one run, gpudoctor installed as README line 1 installs it (offline:
# `./install.sh --wheels DIR`, as root). A local attacker (uid 65534, "eve") prepares three traps, then root runs
# gpudoctor the way the gate units, the daemon and an admin do:
#   1. a forged server process: `exec -a EVE/python3 ... -m sglang.launch_server`, where EVE/python3 is eve's program
#      that leaves a marker when run. `check --deep` must not run it (no marker, the candidate named "not trusted
#      as root") and must still measure every figure (GEMM with a root-owned torch python);
#   2. a hostile working directory (0777, eve's) holding json.py, hashlib.py, ctypes.py, torch.py that leave a marker
#      when imported, and eve's inventory.yaml: root run there refuses eve's inventory (exit 3, one line); with root's
#      own inventory it runs `check --deep`, `snapshot -o` (0600, no secret of the environment) and `release gpu1`
#      (the active verification: the deep tier) — no marker, released;
#   3. a planted /dev/shm (a private mount namespace with its own tmpfs): eve makes /dev/shm/tiny first, with a link
#      to a root file and a marker naming her own "source". `model stage --apply` and the daemon's restage
#      (`daemon --once --heal model.stage`) refuse it, naming eve; the root file is byte for byte unchanged; once the
#      directory is gone, the same commands stage and restage from root's own record (COMPLETE).
# Nothing on the card is changed. Each line of OUTDIR/summary.txt is PASS or FAIL with what was seen.
#
#   tools/gpu_security_proof.sh [--dry-run] OUTDIR   (wheels from $WHEELS, default ./.whl; docs/install.md "Offline")
#   --dry-run: use the gpudoctor on PATH instead of installing (a machine without a GPU then fails the deep lines)
set -u
DRY=; [ "${1:-}" = --dry-run ] && { DRY=1; shift; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
O=${1:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
WHEELS=${WHEELS:-$SRC/.whl}
: > "$O/summary.txt"
say() { echo "$1 $2" | tee -a "$O/summary.txt"; }
ok() { if eval "$2"; then say PASS "$1"; else say FAIL "$1"; fi; }
EVE=65534


[ "$(id -u)" = 0 ] || { echo "run as root (the attacker is uid $EVE)" >&2; exit 9; }
if [ -n "$DRY" ]; then
  GD=$(command -v gpudoctor) || { echo "no gpudoctor on PATH" >&2; exit 9; }
  GPY=$(dirname "$(readlink -f "$GD")")/python
else
  [ -d "$WHEELS" ] || { echo "no wheel directory $WHEELS (docs/install.md: Offline)" >&2; exit 9; }
  (cd "$SRC" && ./install.sh --wheels "$WHEELS") > "$O/install.log" 2>&1; rc=$?
  ok "install.sh --wheels: rc $rc" '[ $rc = 0 ]'
  GD=/usr/local/bin/gpudoctor
  GPY=$(cd "$SRC" && ./install.sh --where)/bin/python
fi
{ echo "# $("$GD" --version 2>&1)"; echo "# $(nvidia-smi -L 2>&1 | head -1)"; echo "# python3: $(command -v python3)"; } \
  | tee "$O/versions.txt"

# --- the attacker's things -------------------------------------------------------------------------------------
A=$(mktemp -d /var/tmp/gpd-eve.XXXXXX); chown $EVE:$EVE "$A"; chmod 0755 "$A"
C=$(mktemp -d /var/tmp/gpd-evecwd.XXXXXX); chown $EVE:$EVE "$C"; chmod 0777 "$C"
cat > "$A/python3" <<EOF
#!/bin/sh
echo "ran as \$(id -u): \$*" >> "$A/EXEC-MARKER"
exec /bin/sleep 1
EOF
chown $EVE:$EVE "$A/python3"; chmod 0755 "$A/python3"
for m in json hashlib ctypes torch; do
  echo "open('$A/IMPORT-MARKER', 'a').write('$m imported\n')" > "$C/$m.py"; chown $EVE:$EVE "$C/$m.py"
done
printf 'hosts:\n  gpu1: {address: local}\npolicy:\n  verify: {deep: "off", serving: "off", commands: [[/bin/true]]}\n' \
  > "$C/inventory.yaml"; chown $EVE:$EVE "$C/inventory.yaml"
INV=$(mktemp -d /root/gpd-inv.XXXXXX)/inventory.yaml
printf 'hosts:\n  gpu1: {address: local}\n' > "$INV"; chmod 0600 "$INV"
# the forged server: any interpreter, its argv[0] eve's program, its command line an SGLang server's
setpriv --reuid=$EVE --regid=$EVE --clear-groups -- bash -c "exec -a '$A/python3' /bin/sh -c 'sleep 900; :' -m sglang.launch_server --model-path /dev/shm/tiny \
  --port 31999" & FORGED=$!
sleep 1
ok "the forged server runs as eve with argv[0] $A/python3" "tr '\0' ' ' < /proc/$FORGED/cmdline | grep -q 'sglang.launch_server'"

# --- 1. the deep tier beside the forged server -----------------------------------------------------------------
cd / || exit 9
GPUDOCTOR_INVENTORY= "$GD" check --deep --json > "$O/deep.json" 2> "$O/deep.err"; rc=$?
ok "check --deep (root, cwd /): rc $rc (0 or 1, never 3)" '[ $rc = 0 ] || [ $rc = 1 ]'
ok "eve's interpreter was not run (no $A/EXEC-MARKER)" '[ ! -e "$A/EXEC-MARKER" ]'
ok "the deep facts name eve's interpreter as not trusted as root" 'grep -q "not trusted as root" "$O/deep.json"'
ok "GEMM measured (a TFLOP/s figure in the report)" 'grep -q "TFLOP/s" "$O/deep.json"'
"$GD" check --deep > "$O/deep.txt" 2>&1

# --- 2. a hostile working directory ------------------------------------------------------------------------------
cd "$C" || exit 9
GPUDOCTOR_INVENTORY= "$GD" check > "$O/cwd-inventory.out" 2>&1; rc=$?
ok "root in eve's directory refuses eve's inventory.yaml: rc $rc, one line" \
   '[ $rc = 3 ] && [ "$(wc -l < "$O/cwd-inventory.out")" = 1 ] && grep -q "inventory" "$O/cwd-inventory.out"'
HF_TOKEN=hf_secret_do_not_leak AWS_SECRET_ACCESS_KEY=aws_secret_do_not_leak \
  "$GD" check --deep --inventory "$INV" > "$O/cwd-deep.txt" 2>&1; rc=$?
ok "check --deep in eve's directory with root's inventory: rc $rc (0 or 1)" '[ $rc = 0 ] || [ $rc = 1 ]'
unshare --pid --fork --mount-proc env HF_TOKEN=hf_secret_do_not_leak AWS_SECRET_ACCESS_KEY=aws_secret_do_not_leak \
  "$GD" snapshot --deep --inventory "$INV" -o "$O/snapshot.json" > "$O/snapshot.out" 2>&1; rc=$?
ok "snapshot --deep in eve's directory: rc $rc, mode $(stat -c %a "$O/snapshot.json" 2>/dev/null)" \
   '[ "$(stat -c %a "$O/snapshot.json" 2>/dev/null)" = 600 ]'
ok "no secret of the environment in the snapshot" \
   "! \"$GPY\" -I -c 'import base64,json,re,sys; t=open(sys.argv[1]).read(); sys.exit(0 if re.search(r\"do_not_leak\", t + \"\".join(base64.b64decode(x).decode(\"latin-1\") for x in re.findall(r\"[A-Za-z0-9+/=]{16,}\", t))) else 1)' \"$O/snapshot.json\""
"$GD" release gpu1 --inventory "$INV" > "$O/release.out" 2>&1; rc=$?
ok "release gpu1 (deep verification) from eve's directory: rc $rc (0 released)" '[ $rc = 0 ]'
ok "nothing of eve's directory was imported (no $A/IMPORT-MARKER)" '[ ! -e "$A/IMPORT-MARKER" ]'
ok "eve's interpreter was never run (no $A/EXEC-MARKER)" '[ ! -e "$A/EXEC-MARKER" ]'
cd / || exit 9

# --- 3. a planted /dev/shm, in a private mount namespace ---------------------------------------------------------
M=$(mktemp -d /root/gpd-model.XXXXXX)
"$GPY" - "$M" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
json.dump({"architectures": ["TinyForCausalLM"], "hidden_size": 8}, open(os.path.join(d, "config.json"), "w"))
data = bytes(range(256)) * 4096
head = json.dumps({"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
open(os.path.join(d, "model.safetensors"), "wb").write(struct.pack("<Q", len(head)) + head + data)
EOF
VICTIM=$(mktemp /root/gpd-victim.XXXXXX); echo "root's file" > "$VICTIM"; before=$(sha256sum < "$VICTIM")
cat > "$O/shm.sh" <<EOF
set -u
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
plant() { setpriv --reuid=$EVE --regid=$EVE --clear-groups -- sh -c 'mkdir /dev/shm/tiny && ln -s $VICTIM /dev/shm/tiny/model.safetensors && echo "{\"source\": \"$A\"}" > /dev/shm/tiny/.gpudoctor-staged.json'; }
plant
"$GD" model stage --from "$M" --to /dev/shm/tiny --apply > "$O/stage-planted.out" 2>&1; echo "stage-planted \$?"
rm -rf /dev/shm/tiny
"$GD" model stage --from "$M" --to /dev/shm/tiny --apply > "$O/stage-clean.out" 2>&1; echo "stage-clean \$?"
"$GD" model verify /dev/shm/tiny > "$O/verify-1.out" 2>&1; echo "verify-1 \$?"
rm -rf /dev/shm/tiny; plant   # a reboot wiped it, and eve was first
"$GD" daemon --once --inventory "$INV" --host gpu1 --model /dev/shm/tiny --heal model.stage --metrics-addr off \
  --state "$O/daemon-state.json" > "$O/daemon-planted.out" 2>&1; echo "daemon-planted \$?"
rm -rf /dev/shm/tiny          # the admin removed eve's directory
"$GD" daemon --once --inventory "$INV" --host gpu1 --model /dev/shm/tiny --heal model.stage --metrics-addr off \
  --state "$O/daemon-state.json" > "$O/daemon-clean.out" 2>&1; echo "daemon-clean \$?"
"$GD" model verify /dev/shm/tiny > "$O/verify-2.out" 2>&1; echo "verify-2 \$?"
EOF
unshare --mount --propagation private bash "$O/shm.sh" > "$O/shm.rc" 2>&1
cat "$O/shm.rc"
rc_of() { sed -n "s/^$1 //p" "$O/shm.rc"; }
ok "model stage into eve's /dev/shm/tiny refused: rc $(rc_of stage-planted), names eve's uid" \
   '[ "$(rc_of stage-planted)" = 3 ] && grep -qiE "nobody|65534" "$O/stage-planted.out"'
ok "model stage into a fresh /dev/shm/tiny: rc $(rc_of stage-clean); verify rc $(rc_of verify-1) COMPLETE" \
   '[ "$(rc_of stage-clean)" = 0 ] && [ "$(rc_of verify-1)" = 0 ] && grep -q COMPLETE "$O/verify-1.out"'
ok "the daemon's restage into eve's directory refused, naming the owner (rc $(rc_of daemon-planted))" \
   'grep -qiE "nobody|65534|another user" "$O/daemon-planted.out"'
ok "the daemon restaged from root's record once eve's directory was gone: verify rc $(rc_of verify-2)" \
   '[ "$(rc_of verify-2)" = 0 ] && grep -q COMPLETE "$O/verify-2.out"'
ok "root's file byte for byte unchanged" '[ "$(sha256sum < "$VICTIM")" = "$before" ]'

kill "$FORGED" 2>/dev/null; wait "$FORGED" 2>/dev/null
rm -rf "$A" "$C" "$M" "$VICTIM" "$(dirname "$INV")"
echo "== $(grep -c ^PASS "$O/summary.txt") PASS, $(grep -c ^FAIL "$O/summary.txt") FAIL"
