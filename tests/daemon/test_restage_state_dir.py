"""The heal still heals (#47 item 8): a model root staged with `gpudoctor model stage` is restaged by the daemon
after a shard is truncated — when the stage and the daemon share one state directory. When they do not (the H100
proof of 2026-12-07 staged before it exported its private state directory), the daemon's refusal says where it looked
for the stage record and that one exists in the default state directory, in one line.

Everything runs as root in a private mount namespace: a tmpfs over /var/lib/gpudoctor (the default state directory,
so the machine's own is never touched) and a tmpfs for the model, as /dev/shm would be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests import needs
from tests.childenv import pythonpath
from tests.model.modelfiles import write_model

SCRIPT = r"""set -e
if [ -d /var/lib/gpudoctor ]; then mount -t tmpfs gd-test /var/lib/gpudoctor
else mount -t tmpfs gd-test /var/lib && mkdir /var/lib/gpudoctor; fi
mount -t tmpfs gd-test "$T/shm"
cd "$T"
if [ "$SAME" = 1 ]; then export GPUDOCTOR_STATE_DIR="$T/priv"; fi
$PY -m gpudoctor model stage --from "$T/src" --to "$T/shm/m" --apply >stage.log 2>&1
truncate -s 100 "$T/shm/m/$SHARD"
export GPUDOCTOR_STATE_DIR="$T/priv" STATE_DIRECTORY="$T/priv"
set +e
$PY -m gpudoctor daemon --once --heal model.stage --model "$T/shm/m" --state "$T/priv/daemon.json" --no-xid
echo "daemon rc $?"
stat -c 'shard %s' "$T/shm/m/$SHARD"
"""


def heal(tmp_path: Path, same: bool) -> subprocess.CompletedProcess:
    needs.root()
    if shutil.which("unshare") is None:
        needs.missing("unshare")
    files = write_model(tmp_path / "src", shards=2, elems=4096)
    shard = sorted(n for n in files if n.endswith(".safetensors"))[0]
    (tmp_path / "shm").mkdir()
    (tmp_path / "priv").mkdir()
    env = {**os.environ, "PYTHONPATH": pythonpath(), "T": str(tmp_path), "PY": sys.executable,
           "SAME": "1" if same else "0", "SHARD": shard}
    for k in ("GPUDOCTOR_STATE_DIR", "STATE_DIRECTORY", "GPUDOCTOR_INVENTORY"):
        env.pop(k, None)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRIPT], env=env,
                       capture_output=True, text=True, timeout=180)
    assert "daemon rc" in r.stdout, r.stdout + r.stderr + (tmp_path / "stage.log").read_text()
    r.shard_size = int(r.stdout.split("shard ")[-1].split()[0])
    r.full_size = len(files[shard])
    return r


def test_a_model_staged_with_the_daemons_state_dir_is_restaged(tmp_path):
    r = heal(tmp_path, same=True)
    assert "remedy model.stage: applied: " in r.stdout and "complete and staged this boot" in r.stdout, r.stdout
    assert r.shard_size == r.full_size


def test_a_stage_record_in_another_state_dir_is_named_in_the_refusal(tmp_path):
    r = heal(tmp_path, same=False)
    assert r.shard_size == 100  # nothing restaged
    (line,) = [x for x in r.stdout.splitlines() if "remedy model.stage:" in x]
    dst, priv = tmp_path / "shm" / "m", tmp_path / "priv" / "staged"
    assert f"refused: {dst}: no source to stage from (no stage record names one; looked in {priv})" in line, line
    assert "; a stage record exists in /var/lib/gpudoctor/staged/" in line, line
    assert f"; this gpudoctor reads {priv} ($GPUDOCTOR_STATE_DIR): stage and heal with one state directory" in line
    assert line.endswith(f"pass --model-source {dst}=SRC"), line
