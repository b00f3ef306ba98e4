"""The observable fault is the root cause, provenance is context (#13 item 2).

The H200 run (tests/fixtures/captures/h200-2026-12-01/f7-model-trunc.txt): a 3-shard model copied into /dev/shm by
hand (no gpudoctor marker), shard 2 cut to 47 %, was ranked under "never staged (no marker, no stage record)" with
the truncated shard as its symptom. The same scenario here, on real files under the H200's captured mounts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.gather.model import gather
from gpudoctor.host.local import LocalHost
from gpudoctor.model import probe

from .modelfiles import shard_name
from .test_model_checks import DST, OTHER_BOOT, Ctx, h200, set_boot, stage_into_root  # noqa: F401 - fixture

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "h200-2026-12-01" / "f7-model-trunc.txt"


def _diagnose(root):
    return diagnose({"model": gather(LocalHost(root=str(root)), Ctx([DST]))})


def test_truncated_shard_in_a_hand_copied_model_is_the_root_cause(h200, tmp_path, state_dir):
    assert "never staged (no marker, no stage record)" in CAPTURE.read_text()  # what 1f733bc said on the H200
    shutil.copytree(tmp_path / "src", str(h200) + DST)  # cp -r by hand: no marker, no stage record
    shard = Path(str(h200) + DST) / shard_name(2, 3)
    os.truncate(shard, shard.stat().st_size * 47 // 100)
    d = _diagnose(h200)
    assert d.root_cause.key == f"workload.model.complete[{DST}]"
    assert "1 truncated" in d.root_cause.summary and shard_name(2, 3) in " ".join(d.root_cause.evidence)
    staged = next(f for f in d.findings if f.id == "workload.model.staged_this_boot")
    assert staged.status == Status.INFO and "never staged" not in staged.summary
    assert "not staged by gpudoctor" in staged.summary and staged.blocked_by is None
    assert d.chain[-1].startswith(f"root cause: {DST}: model incomplete")
    assert "SRC" not in (d.root_cause.hint or "")  # no placeholder: it says the source is unknown


def test_files_gone_after_a_reboot_stay_a_symptom_of_the_wipe(h200, tmp_path, state_dir):
    stage_into_root(h200, tmp_path / "src", state_dir)
    set_boot(h200, OTHER_BOOT)
    for n in os.listdir(str(h200) + DST):  # tmpfs lost the weights and the marker; the skeleton survived
        if n.endswith(".safetensors") or n == probe.MARKER_NAME:
            os.unlink(Path(str(h200) + DST) / n)
    d = _diagnose(h200)
    assert d.root_cause.key == f"workload.model.staged_this_boot[{DST}]" and "wiped by a reboot" in d.root_cause.summary
    complete = next(f for f in d.findings if f.id == "workload.model.complete")
    assert complete.blocked_by == d.root_cause.key


def test_a_truncated_shard_is_not_blamed_on_a_reboot(h200, tmp_path, state_dir):
    """A reboot wipes tmpfs whole: a shard still there but short cannot follow from it."""
    stage_into_root(h200, tmp_path / "src", state_dir)
    set_boot(h200, OTHER_BOOT)
    shard = Path(str(h200) + DST) / shard_name(2, 3)
    os.truncate(shard, shard.stat().st_size // 2)
    d = _diagnose(h200)
    complete = next(f for f in d.findings if f.id == "workload.model.complete")
    assert complete.status == Status.FAIL and complete.blocked_by is None
    assert d.root_cause.key == complete.key


def test_a_directory_that_is_not_there_and_never_staged(h200, tmp_path, state_dir):
    d = _diagnose(h200)
    assert d.root_cause.key == f"workload.model.staged_this_boot[{DST}]" and "never staged" in d.root_cause.summary
