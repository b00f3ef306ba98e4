#!/bin/bash
# Issue #23's paper cuts on a real host, as root and as an ordinary user (uid 65534): gpudoctor installed as a package
# from SRC (pip --target, nothing global), run from /tmp (no ./inventory.yaml). On a GPU host the user must be told
# the GPU needs no root; on a host without a driver never that, and `fix` must blame the driver before CAP_MKNOD.
# A bare group prints its help (exit 0); a closed pipe ends quietly (141, empty stderr). Nothing on the host changes
# (`fix` is a dry run). Each line of OUTDIR/summary.txt is PASS or FAIL with what was seen.
#
#   tools/h200_paper_cuts.sh SRC OUTDIR
set -u
SRC=$(cd "${1:?source tree}" && pwd); O=${2:?outdir}; mkdir -p "$O"; O=$(cd "$O" && pwd)
PY=${PYTHON:-python3}
cd /tmp || exit 9
T=$(mktemp -d /tmp/gd-paper-cuts.XXXXXX); chmod 755 "$T"
trap 'rm -rf "$T"' EXIT
if [ -d "$SRC/.whl" ]; then "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --target "$T/site" "$SRC"/.whl/*.whl || exit 9; fi
# offline (the H200 reaches no index) with the interpreter's own setuptools+wheel, else through the index
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir --target "$T/gd" "$SRC" 2>/dev/null ||
  "$PY" -m pip install -q --no-deps --no-cache-dir --target "$T/gd" "$SRC" || exit 9
chmod -R a+rX "$T"
export PYTHONPATH=$T/gd:$T/site
GD=$T/gd/bin/gpudoctor
H=$T/home; mkdir -p "$H"; chown 65534:65534 "$H"
PYU=$(command -v "$PY")  # the user runs the script through the same interpreter (a root-only shebang path fails)
user() { local gd=$1; shift; HOME=$H setpriv --reuid 65534 --regid 65534 --clear-groups "$PYU" "$gd" "$@"; }
: > "$O/summary.txt"
say() { echo "$1 $2" | tee -a "$O/summary.txt"; }
ok() { if eval "$2"; then say PASS "$1"; else say FAIL "$1"; fi; }

"$GD" >"$O/bare.out" 2>"$O/bare.err"; rc=$?
ok "bare gpudoctor: help on stdout, exit 0 (rc $rc)" '[ $rc = 0 ] && head -1 "$O/bare.out" | grep -q "^Usage: gpudoctor" && [ ! -s "$O/bare.err" ]'
"$PY" - "$GD" > "$O/pipe.txt" <<'EOF'
import os, subprocess, sys
for args in (["checks"], ["check", "--json"]):
    r, w = os.pipe(); os.close(r)
    p = subprocess.run([sys.argv[1], *args], stdout=w, stderr=subprocess.PIPE); os.close(w)
    print(" ".join(args), p.returncode, repr(p.stderr.decode()[:200]))
EOF
ok "closed pipe: exit 141, empty stderr ($(tr '\n' ';' < "$O/pipe.txt"))" '[ "$(grep -c " 141 '"''"'$" "$O/pipe.txt")" = 2 ]'

for who in root user; do
  if [ $who = root ]; then run=""; else run=user; fi
  $run "$GD" check --json >"$O/check-$who.json" 2>"$O/check-$who.err"
  $run "$GD" fix >"$O/fix-$who.txt" 2>&1
done
priv=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(next(f['summary'] for f in d['findings'] if f['key']=='host.privileges'))" "$O/check-user.json")
echo "user: $priv" > "$O/privileges.txt"
if [ -e /proc/driver/nvidia/version ]; then
  ok "driver loaded, user told the GPU needs no root: $priv" '[[ $priv == *"(not root): using the GPU needs no root; "* ]]'
else
  ok "no driver, user never told the GPU is usable: $priv" '[[ $priv != *usable* && $priv != *"needs no root"* ]]'
  line=$(grep -m1 "^REFUSED  devices.node.create" "$O/fix-user.txt")
  ok "no driver, fix as a user blames the driver first: $line" '[[ $line == *"NVIDIA driver is not loaded"* && $line != *"cannot create device nodes"* ]]'
fi
grep -q Traceback "$O"/*.err "$O"/fix-*.txt && say FAIL "a traceback (see $O)" || say PASS "no traceback"
