"""Fix text fits the platform detected (#13 item 5, as a class): LXC advice only for LXC guests, the container
engines' fixes only inside containers, a unit's drop-in only for a unit, host commands on bare metal and VMs.

The real H200 captures (tests/fixtures/snapshots/h200-{uvm,ctl}-cgroup2-denied.json: a cgroup2 device program denying
c 238:* or c 195:*, detected as a Docker/OCI container) are the Docker case; the other platforms are the same facts
with only the platform evidence changed, so each text differs for the platform alone.
"""

import copy
import json
import re
from pathlib import Path

import pytest

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose

SNAP = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
H200 = ["h200-uvm-cgroup2-denied", "h200-ctl-cgroup2-denied", "h200-uvm-stale-major", "h200-uvm-blocked",
        "h200-ctl-blocked", "h200-uvm-missing"]

LXC_WORDS = re.compile(r"lxc\.|Proxmox|devN:|gpudoctor lxc", re.I)
ENGINE_WORDS = re.compile(r"docker|podman|recreate the (container|pod)|restart the pod|--gpus|nvidia-ctk", re.I)
UNIT_WORDS = re.compile(r"DeviceAllow|drop-in", re.I)


def facts(name):
    return snapshot_facts(snapshot.load(str(SNAP / f"{name}.json")))


def as_platform(f, kind):
    """The same facts on another platform: only the evidence the platform is detected from changes."""
    f = copy.deepcopy(f)
    unit = kind == "unit"
    f["host"]["container"] = {"kind": {"unit": "bare", "k8s": "docker"}.get(kind, kind), "evidence": [f"test: {kind}"]}
    plat = f.setdefault("platform", {})
    plat["containerenv"] = {"text": 'engine="podman-4.3.1"\nname="sglang"\n', "error": None} if kind == "podman" else \
        {"text": None, "error": "ENOENT"}
    plat["kubernetes"] = {"serviceaccount": kind == "k8s", "hosts_managed": kind == "k8s"}
    plat["self_cgroup"] = {"text": "0::/system.slice/sglang.service\n" if unit else "0::/\n", "error": None}
    return f


def hints(d):
    return [(x.key, x.hint) for x in d.findings if x.bad and x.hint]


@pytest.mark.parametrize("name", H200)
def test_docker_host_never_gets_lxc_advice(name):
    """On the real Docker/OCI captures no finding tells the user to edit an LXC config (607fb59 did, on the EPERM)."""
    d = diagnose(facts(name))
    assert d.root_cause is not None
    for key, hint in hints(d):
        assert not LXC_WORDS.search(hint), f"{name}: {key} says {hint!r}"


@pytest.mark.parametrize("name", ["h200-uvm-cgroup2-denied", "h200-ctl-cgroup2-denied"])
def test_docker_eperm_names_the_engine_fix(name):
    d = diagnose(facts(name))
    eperm = [x for x in d.findings if x.id == "devices.node.open" and x.bad]
    assert eperm and all(ENGINE_WORDS.search(x.hint or "") for x in eperm), [x.hint for x in eperm]
    assert ENGINE_WORDS.search(d.root_cause.hint or "")


@pytest.mark.parametrize("kind", ["lxc", "docker", "podman", "k8s", "unit", "vm", "bare"])
@pytest.mark.parametrize("name", ["h200-uvm-cgroup2-denied", "h200-ctl-cgroup2-denied", "h200-uvm-stale-major",
                                  "h200-uvm-missing"])
def test_every_hint_fits_its_platform(name, kind):
    d = diagnose(as_platform(facts(name), kind))
    texts = hints(d)
    assert texts, "a failing host gives advice"
    for key, hint in texts:
        if kind != "lxc":
            assert not LXC_WORDS.search(hint), f"{kind}: {key}: {hint}"
        if kind in ("vm", "bare", "unit"):
            assert not re.search(r"docker|podman|\bpod\b|container's", hint, re.I), f"{kind}: {key}: {hint}"
        if kind in ("lxc", "vm", "bare", "unit"):
            assert not re.search(r"docker|podman|Kubernetes", hint), f"{kind}: {key}: {hint}"
    eperm = [h for k, h in texts if k.startswith("devices.node.open[")]
    if eperm:
        want = {"lxc": LXC_WORDS, "docker": re.compile("docker", re.I), "podman": re.compile("podman"),
                "k8s": re.compile(r"\bpod\b"), "unit": UNIT_WORDS, "vm": re.compile(r"/proc/self/cgroup"),
                "bare": re.compile(r"/proc/self/cgroup")}[kind]
        assert all(want.search(h) for h in eperm), (kind, eperm)


def test_platform_finding_names_podman_kubernetes_and_the_unit():
    f = facts("h200-uvm-cgroup2-denied")
    words = {"podman": "podman", "k8s": "Kubernetes pod", "unit": "sglang.service"}
    for kind, word in words.items():
        p = next(x for x in diagnose(as_platform(f, kind)).findings if x.id == "host.platform")
        assert word in p.summary, (kind, p.summary)


def test_snapshots_are_the_real_captures():
    """The two cgroup2 captures as the H200 gave them: a Docker/OCI detection, uvm denied with NVML fine, 195 denied
    with nvidia-smi's "Unknown Error"."""
    uvm = json.loads((SNAP / "h200-uvm-cgroup2-denied.json").read_text())["facts"]
    ctl = json.loads((SNAP / "h200-ctl-cgroup2-denied.json").read_text())["facts"]
    assert uvm["host"]["container"]["kind"] == ctl["host"]["container"]["kind"] == "docker"
    assert uvm["driver"]["gpus"][0]["name"] == "NVIDIA H200" and uvm["cuda"]["cuinit"] == 999
    assert ctl["driver"]["rc"] == 255 and "Unknown Error" in ctl["driver"]["stderr"]
