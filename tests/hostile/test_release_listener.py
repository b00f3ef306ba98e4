"""`release` marks a host ready on its serving smoke's answers: they must come from the expected server. A local user
(uid 65534) who listens on the serving port first gets no host released on its answers; root's own server, on the
same port in the same kind of namespace, still releases (the positive control), as does the server of the user the
inventory names (serving.user). gpudoctor/recovery/listener.py.

Each case runs in a private network namespace (its own loopback, so the port is the test's alone) and a private mount
namespace (the attacker's interpreter access, as tests/hostile/attacker.py does): the SGLang stand-in listens on
127.0.0.1:PORT as the given uid, then the real `gpudoctor release gpu1` runs as root beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests import needs
from tests.childenv import pythonpath
from tests.hostile.attacker import NOBODY, _interpreter_root

PORT = 30000  # SGLang's default port: the namespace's own loopback, nothing else listens there

INVENTORY = """hosts:
  gpu1:
    address: local
    serving: {{url: 'http://127.0.0.1:{port}', model: tiny-m, api: native{user}}}
policy:
  verify: {{deep: "off", serving: "on", smoke_requests: 2, smoke_max_tokens: 4, timeout_s: 60}}
"""

SCRIPT = r"""set -e
ip link set lo up
keep="$KEEP"
if [ -n "$keep" ]; then
  d=$(mktemp -d); mount --bind /root "$d"; mount -t tmpfs -o mode=0755,size=1m tmpfs /root
  mkdir -p "$keep"; mount --bind "$d/${keep#/root/}" "$keep"
fi
cd "$WORK"
serve="$PY -m gpudoctor.bench.standin --port $PORT --decode-tok-s 0 --served-model-name tiny-m"
if [ "$AS" = 0 ]; then $serve >server.log 2>&1 & else
  setpriv --reuid=$AS --regid=$AS --clear-groups --inh-caps=-all -- $serve >server.log 2>&1 & fi
srv=$!
$PY -c "
import socket, sys, time
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        socket.create_connection(('127.0.0.1', $PORT), 1).close(); sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit('the stand-in never listened')"
set +e
$PY -m gpudoctor release gpu1 --inventory inventory.yaml --recovery-file recovery.json --json
rc=$?
kill $srv; wait $srv 2>/dev/null
echo "server pid $srv" >&2
exit $rc
"""


def release_beside(tmp_path: Path, uid: int, owner: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    needs.root()
    for tool in ("unshare", "setpriv", "ip"):
        if shutil.which(tool) is None:
            needs.missing(tool)
    work = tmp_path / "work"
    work.mkdir()
    tmp_path.chmod(0o755)
    work.chmod(0o755)
    (work / "inventory.yaml").write_text(INVENTORY.format(port=PORT, user=f", user: {owner}" if owner else ""))
    env = {**os.environ, "PYTHONPATH": pythonpath(), "KEEP": _interpreter_root() or "", "WORK": str(work),
           "PY": sys.executable, "PORT": str(PORT), "AS": str(uid), "HOME": str(work)}
    env.pop("GPUDOCTOR_INVENTORY", None)
    r = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", SCRIPT], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip(), r.stderr + (work / "server.log").read_text()
    return r, json.loads(r.stdout)


def test_a_server_another_user_runs_on_the_serving_port_releases_nothing(tmp_path):
    r, doc = release_beside(tmp_path, NOBODY)
    assert r.returncode == 1 and not doc["released"], r.stdout + r.stderr
    step = {s["name"]: s for s in doc["verification"]["steps"]}["serving"]
    assert step["status"] == "fail", step
    pid = r.stderr.strip().splitlines()[-1].split()[-1]
    assert step["detail"].startswith(f"the listener on port {PORT} is pid {pid} (uid {NOBODY} nobody, "), step
    assert "not root's and not a system service's, so release does not trust its answers" in step["detail"]
    assert "\n" not in step["detail"]
    assert doc["state"] != "ready"


def test_the_server_of_the_user_the_inventory_names_is_trusted(tmp_path):
    """serving.user names the server's owner: its server answers (the same uid 65534 as above, now expected)."""
    r, doc = release_beside(tmp_path, NOBODY, owner="nobody")
    assert r.returncode == 0 and doc["released"], r.stdout + r.stderr


def test_roots_own_server_on_the_serving_port_is_trusted(tmp_path):
    r, doc = release_beside(tmp_path, 0)
    assert r.returncode == 0 and doc["released"], r.stdout + r.stderr
    step = {s["name"]: s for s in doc["verification"]["steps"]}["serving"]
    assert step["status"] == "pass" and "2 requests ok" in step["detail"], step


def test_a_listener_in_a_system_unit_is_a_system_service():
    from gpudoctor.recovery.listener import system_unit

    assert system_unit("/system.slice/sglang.service") == "sglang.service"
    assert system_unit("/system.slice/gpu.slice/sglang.service/payload") == "sglang.service"
    assert system_unit("/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service") is None
    assert system_unit("/system.slice/run-r1.scope") is None and system_unit(None) is None
