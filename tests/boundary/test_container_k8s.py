"""#14 acceptance 2 and the Kubernetes node view: the daemon-reload signature on the real H200 capture
(h200-ctl-cgroup2-denied.json: c 195 denied by a cgroup2 device program, detected as a Docker/OCI container) is the
root cause with the engine's known fixes; the uvm-only capture is not called a reset; a visible cgroupfs driver rules
the reset out; gpu-operator's "ready" next to a failing cuInit is a warning that never hides the cause."""

import copy
from pathlib import Path

import pytest

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.boundary.platform import driver_of, own_cgroup, unit_of

SNAP = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"


def facts(name):
    return snapshot_facts(snapshot.load(str(SNAP / f"{name}.json")))


def test_daemon_reload_signature_is_the_root_cause_with_the_known_fixes():
    d = diagnose(facts("h200-ctl-cgroup2-denied"))
    rc = d.root_cause
    assert rc.key == "boundary.container.device_rules" and rc.status == Status.FAIL
    assert rc.data["signature"] == "daemon-reload" and rc.data["majors"] == [195]
    assert "/dev/nvidia0" in rc.summary and "/dev/nvidiactl" in rc.summary and "daemon-reload" in rc.summary
    fixes = " ".join(rc.data["fixes"])
    for w in ("docker restart", "create-dev-char-symlinks --create-all", "71-nvidia-dev-char.rules",
              "native.cgroupdriver=cgroupfs", "--device /dev/nvidiactl"):
        assert w in fixes and w in rc.hint, w
    assert "Failed to initialize NVML: Unknown Error" in " ".join(rc.evidence)
    by = d.by_key()
    assert by["driver.nvml.init"].blocked_by == rc.key and by["cuda.init"].blocked_by == rc.key
    assert by["devices.node.open[/dev/nvidiactl]"].blocked_by == rc.key


def test_uvm_only_denial_is_not_called_a_reset():
    rc = diagnose(facts("h200-uvm-cgroup2-denied")).root_cause
    assert rc.key == "boundary.container.device_rules" and rc.data["signature"] is None
    assert "daemon-reload" not in rc.summary and "uvm" in rc.hint and "CDI" in rc.hint


@pytest.mark.parametrize("cgroup,driver", [
    ("0::/system.slice/docker-0123456789abcdef0123.scope", "systemd"),
    ("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-0123456789abcdef.scope", "systemd"),
    ("0::/docker/0123456789abcdef0123", "cgroupfs"),
    ("9:name=systemd:/libpod_parent/libpod-0123456789abcdef\n0::/libpod_parent/libpod-0123456789abcdef", "cgroupfs"),
    ("0::/", None),
])
def test_cgroup_driver_from_the_containers_cgroup(cgroup, driver):
    assert driver_of(own_cgroup(cgroup)) == driver


def test_probe_unit_from_its_cgroup():
    assert unit_of(own_cgroup("0::/system.slice/sglang.service\n")) == "sglang.service"
    assert unit_of(own_cgroup("1:name=systemd:/system.slice/sglang.service\n")) == "sglang.service"
    assert unit_of(own_cgroup("0::/user.slice/user-0.slice/session-3.scope\n")) is None


def test_cgroupfs_driver_rules_out_the_systemd_reset():
    f = copy.deepcopy(facts("h200-ctl-cgroup2-denied"))
    f["platform"] = {"self_cgroup": {"text": "0::/docker/0123456789abcdef0123\n", "error": None}}
    rc = diagnose(f).root_cause
    assert rc.key == "boundary.container.device_rules" and rc.data["signature"] is None
    assert "cgroupfs driver is in use, so it is not systemd's reset" in " ".join(rc.evidence)


def test_validator_ready_while_cuda_fails_is_a_warning_under_the_cause():
    f = copy.deepcopy(facts("h200-uvm-cgroup2-denied"))
    f["platform"] = {"device_plugin": {"dir": ["kubelet.sock", "nvidia-gpu.sock"],
                                       "validations": {"driver-ready": "", "toolkit-ready": "", "cuda-ready": "",
                                                       "plugin-ready": ""}},
                     "kubernetes": {"serviceaccount": False}}
    d = diagnose(f)
    k = d.by_key()["boundary.k8s.device_plugin"]
    assert k.status == Status.WARN and "cuda-ready" in k.summary and "cuInit(0) → 999" in k.summary
    assert k.blocked_by == d.root_cause.key == "boundary.container.device_rules"
    assert "gpu-operator#2685" in k.hint


def test_healthy_node_with_the_plugin_is_information():
    f = copy.deepcopy(facts("h200-healthy"))
    f["platform"] = {"device_plugin": {"dir": ["nvidia-gpu.sock"], "validations": "ENOENT"}}
    k = diagnose(f).by_key()["boundary.k8s.device_plugin"]
    assert k.status == Status.INFO and "nvidia-gpu.sock" in k.summary


def test_kubelet_checkpoint_shows_a_gpu_the_plugin_does_not_offer():
    import json

    from gpudoctor.gather.platform import registered_devices

    text = json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": "0f1e", "ContainerName": "sglang", "ResourceName": "nvidia.com/gpu",
         "DeviceIDs": {"-1": ["GPU-aaaa"]}, "AllocResp": "CiAKFk5WSURJQV9WSVNJQkxFX0RFVklDRVM="}],
        "RegisteredDevices": {"nvidia.com/gpu": ["GPU-aaaa"]}}, "Checksum": 1234567})
    cp = registered_devices(text)
    assert cp == {"registered": {"nvidia.com/gpu": ["GPU-aaaa"]}, "allocated": {"nvidia.com/gpu": ["GPU-aaaa"]}}
    f = copy.deepcopy(facts("h200-healthy"))
    f["platform"] = {"device_plugin": {"dir": ["kubelet.sock", "nvidia-gpu.sock", "kubelet_internal_checkpoint"],
                                       "validations": "ENOENT", "checkpoint": cp}}
    k = diagnose(f).by_key()["boundary.k8s.device_plugin"]
    uuid = f["driver"]["gpus"][0]["uuid"]
    assert k.status == Status.WARN and uuid in k.summary and "does not offer" in k.summary
    f["platform"]["device_plugin"]["checkpoint"]["registered"]["nvidia.com/gpu"] = [uuid]
    assert diagnose(f).by_key()["boundary.k8s.device_plugin"].status == Status.INFO
