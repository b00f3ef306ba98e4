"""Real device nodes made with mknod in a temp root; real open() errnos; a real device cgroup for EPERM."""

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from gpudoctor.diagnose import diagnose
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

from tests import needs

from .conftest import capture


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


SEED_DEVICES = capture("h200-healthy", "proc-devices.txt").replace("238 nvidia-uvm", "511 nvidia-uvm")


def make_root(tmp_path, uvm_major=511, uvm_mode=0o666, tools_mode=0o666, proc_devices=SEED_DEVICES):
    needs.root()  # mknod
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (root / "proc" / "devices").write_text(proc_devices)
    (root / "proc" / "modules").write_text("nvidia_uvm 1830912 - - Live 0x0 (O)\nnvidia 14299136 - - Live 0x0 (O)\n")
    (root / "proc" / "driver" / "nvidia" / "version").write_text(capture("h200-healthy", "driver-version.txt"))
    # nvidiactl as the null device stands in for a node that opens fine; its major is checked separately
    os.mknod(root / "dev" / "nvidiactl", 0o20666, os.makedev(195, 255))
    os.mknod(root / "dev" / "nvidia-uvm", 0o20000 | uvm_mode, os.makedev(uvm_major, 0))
    os.mknod(root / "dev" / "nvidia-uvm-tools", 0o20000 | tools_mode, os.makedev(uvm_major, 1))
    for name, mode in (("nvidia-uvm", uvm_mode), ("nvidia-uvm-tools", tools_mode), ("nvidiactl", 0o666)):
        os.chmod(root / "dev" / name, mode)  # mknod's mode is cut by the umask
    return root


def facts_for(root):
    return gather(LocalHost(root=str(root)), GatherContext(name="t", timeout=3), only={"host", "devices"})


def test_stale_major_node_opens_enxio(tmp_path):
    root = make_root(tmp_path, uvm_major=509)  # node made for the old driver; /proc/devices says 511
    d = diagnose(facts_for(root))
    by = d.by_key()
    assert by["devices.node.open[/dev/nvidia-uvm]"].data["errno"] == "ENXIO"
    maj = by["devices.node.major[/dev/nvidia-uvm]"]
    assert maj.status.value == "fail" and "509:0" in maj.summary and "511:0" in maj.summary
    assert "major 509 is not in /proc/devices" in maj.evidence[0]
    assert by["devices.node.open[/dev/nvidia-uvm]"].blocked_by == "devices.node.major[/dev/nvidia-uvm]"
    assert d.root_cause.key == "devices.node.major[/dev/nvidia-uvm]"


def test_mode_000_is_a_warning_naming_the_node(tmp_path):
    root = make_root(tmp_path, tools_mode=0)
    f = diagnose(facts_for(root)).by_key()["devices.node.mode[/dev/nvidia-uvm-tools]"]
    assert f.status.value == "warn" and "mode 0000" in f.summary and f.remedy == "devices.node.mode"


def test_missing_node_is_found(tmp_path):
    root = make_root(tmp_path)
    (root / "dev" / "nvidia-uvm").unlink()
    f = diagnose(facts_for(root)).by_key()["devices.node.present[/dev/nvidia-uvm]"]
    assert f.status.value == "fail" and f.evidence == ["stat /dev/nvidia-uvm → ENOENT"]


def test_regular_file_in_place_of_node(tmp_path):
    root = make_root(tmp_path)
    (root / "dev" / "nvidia-uvm").unlink()
    (root / "dev" / "nvidia-uvm").write_text("")  # what a bind mount with create=file leaves behind
    f = diagnose(facts_for(root)).by_key()["devices.node.present[/dev/nvidia-uvm]"]
    assert f.status.value == "fail" and "not a character device" in f.summary


def test_device_cgroup_denial_is_eperm_although_mode_0666(tmp_path):
    """The seed's signature for real: mode 0666, a device cgroup that does not allow major 511 → EPERM."""
    v1 = Path(needs.cgroup_v1_devices())
    root = make_root(tmp_path, uvm_major=511)
    cg = v1 / f"gpudoctor-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "devices.deny").write_text("c 511:* rwm")
        prog = textwrap.dedent(f"""
            import json, os
            open({str(cg / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))
            from gpudoctor.gather import gather
            from gpudoctor.gather.context import GatherContext
            from gpudoctor.host.local import LocalHost
            f = gather(LocalHost(root={str(root)!r}), GatherContext(name='ct200', timeout=3), only={{'host', 'devices'}})
            print(json.dumps(f))
        """)
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        facts = json.loads(r.stdout)
    finally:
        cg.rmdir()
    d = diagnose(facts)
    f = d.by_key()["devices.node.open[/dev/nvidia-uvm]"]
    assert f.status.value == "fail"
    assert f.summary.startswith("open(/dev/nvidia-uvm) → EPERM although its mode is 0666: the device cgroup denies it")
    assert d.by_key()["devices.node.major[/dev/nvidia-uvm]"].status.value == "ok"  # the node itself is right
    assert d.root_cause.key == "devices.node.open[/dev/nvidia-uvm]"
