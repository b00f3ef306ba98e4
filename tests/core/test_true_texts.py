"""Texts that said what was not true where a newcomer met them on a pristine Debian 13 (#34): each finding or hint
says what gpudoctor actually saw. Real gathers on this machine where the situation is real here (no nvidia-smi or
systemctl on PATH, a 0666 node on a nodev mount), the captured H200 facts around them."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpudoctor.boundary.platform import Platform, fix_text
from gpudoctor.diagnose import diagnose
from gpudoctor.gate import evaluate, resolve_profile
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.fabric import gather as gather_fabric
from gpudoctor.gather.platform import show_unit
from gpudoctor.host.local import LocalHost
from gpudoctor.snapshot import load
from gpudoctor.target import snapshot_facts
from tests import needs
from tests.core.test_devnodes import facts_for, make_root
from tests.devmount import nodev

from .conftest import SNAPSHOTS


@pytest.fixture
def no_tools(tmp_path, monkeypatch):
    """PATH with neither nvidia-smi nor systemctl: a minbase, or a GPU-less VM."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def h200_facts() -> dict:
    return snapshot_facts(load(str(SNAPSHOTS / "h200-healthy.json")))


def test_gpu_processes_never_says_nvml_listed_nothing_when_nvml_was_not_asked(no_tools):
    facts = gather(LocalHost(), GatherContext(name="t", timeout=5), only={"procs", "driver"})
    assert facts["driver"]["rc"] == 127  # nvidia-smi is not there: NVML's process lists were never read
    [f] = [f for f in diagnose(facts).findings if f.id == "workload.gpu.processes" and f.subject is None]
    text = " ".join([f.summary, *f.evidence])
    assert "NVML: no compute or graphics process listed" not in text
    assert "NVML was not asked" in f.summary and "NVML not asked: nvidia-smi is not installed" in f.evidence
    # where nvidia-smi answered (the captured H200), the NVML line is the truth and stays
    h200 = h200_facts()
    h200["procs"] = facts["procs"]
    [g] = [f for f in diagnose(h200).findings if f.id == "workload.gpu.processes" and f.subject is None]
    assert "NVML: no compute or graphics process listed" in g.evidence


def test_benchmark_gate_hint_for_foreign_memory_names_nvml_not_a_model(no_tools):
    facts = h200_facts()
    facts["driver"] = gather(LocalHost(), GatherContext(name="t", timeout=5), only={"driver"})["driver"]
    result = evaluate(diagnose(facts), resolve_profile("benchmark"))
    by = {b.key: b for b in result.blockers}
    fm = by["workload.gpu.foreign_memory"]
    assert fm.status == "missing" and "--model" not in fm.hint
    assert "driver.nvml.init" in fm.hint and "nvidia-smi is not installed" in fm.hint
    model = by.get("workload.model.*")
    assert model is not None and "--model PATH" in model.hint  # the model checks do want a model


def test_check_unit_without_systemctl_is_not_a_symptom_of_the_driver(no_tools):
    facts = h200_facts()
    facts["host"]["driver_version_file"] = {"error": "ENOENT"}  # and no driver: the old text blamed it
    facts["host"]["modules"] = {"error": None, "nvidia": []}
    facts["platform"]["units"] = {"sglang.service": {"why": "named",
                                                     **show_unit(LocalHost(), "sglang.service", 5)}}
    by = diagnose(facts).by_key()
    assert by["host.driver.loaded"].status.value == "fail"
    f = by["boundary.systemd.device_allow[sglang.service]"]
    assert f.blocked_by is None, f.blocked_by
    assert "systemctl is not installed" in f.summary and "rc 127" in f.evidence[0]


def test_eacces_on_a_0666_node_opened_as_root_names_the_mount_not_the_mode(dev_tmp_path):
    needs.root()  # mknod, mount
    mnt = dev_tmp_path / "nodev"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nodev,mode=0755", "gpudoctor-test-nodev", str(mnt)], check=True)
    try:
        assert nodev(mnt)
        root = make_root(mnt)
        (root / "proc" / "self").mkdir()  # who the probe is: this process, as on a real host
        (root / "proc" / "self" / "status").write_text(open("/proc/self/status").read())
        facts = facts_for(root)
        assert facts["devices"]["nodes"]["/dev/nvidiactl"]["open"] == "EACCES"  # the kernel's answer, as root, 0666
        f = diagnose(facts).by_key()["devices.node.open[/dev/nvidiactl]"]
        assert "file mode or ownership" not in f.summary
        assert "not the file mode (mode 0666 grants root rw)" in f.summary and "nodev" in f.summary
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=False)


def test_no_gpu_on_the_pci_bus_is_said_from_sysfs_not_left_to_lspci():
    facts = {"fabric": gather_fabric(LocalHost(), GatherContext(name="t", timeout=10))}
    assert facts["fabric"]["numa_nodes"]  # gpudoctor reads sysfs itself (PCI vendor ids, NUMA nodes), on every machine
    vm = Platform(kind="vm")
    facts["fabric"]["gpus"] = []  # what this probe finds on a machine without an NVIDIA device
    for kind in ("vm", "bare"):
        hint = fix_text(facts, "no_driver", plat=Platform(kind=kind))
        assert "lspci" not in hint and "No NVIDIA device on" in hint and "PCI bus" in hint
    with_gpu = dict(facts, fabric=dict(facts["fabric"], gpus=[{"bdf": "0000:3b:00.0"}]))
    hint = fix_text(with_gpu, "no_driver", plat=vm)
    assert "lspci" not in hint and "0000:3b:00.0" in hint and "modprobe nvidia" in hint
    assert "lspci" not in fix_text({}, "no_driver", plat=vm)  # nothing known (no fabric facts): no advice to run it
    unread = dict(facts, fabric={"timed_out": False, "error": "sysfs probe $ python3 → rc 1"})
    assert "No NVIDIA device" not in fix_text(unread, "no_driver", plat=vm)  # never claimed without reading the bus
    assert os.path.isdir("/sys/bus/pci/devices")
