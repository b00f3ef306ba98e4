"""#14 acceptance 4: a real container started by a real OCI engine from a CDI spec whose uvm entry is stale, and
gpudoctor, run inside it, names the spec as the cause.

Real: podman (CDI injection: it reads /etc/cdi, resolves `--device nvidia.com/gpu=all`, makes each node with the
spec's numbers and writes the device cgroup rules), runc (mknod inside the container, the cgroup v1 devices
controller enforcing those rules — this kernel's cgroup2 has no device controller in use, so v1 it is), the spec file
as the toolkit writes it (NVIDIA/nvidia-container-toolkit#1934's numbers: major 510 written, 509 live), the
container's own mount namespace and /run/.containerenv, gpudoctor's full check inside. Stand-ins, as in the e2e lab
(docs/testing.md): the H200's /proc/devices (uvm moved to 509) and driver version file bound over /proc inside the
container, libcuda.so.1 (tests/standins/libcuda_stub.c), nvidia-smi, and the LD_PRELOAD driver shim that answers where
the kernel has no NVIDIA driver behind a live major (ENXIO) — never for 510, which no driver holds.

The engine runs in a private mount namespace whose /etc is an overlay, so /etc/cdi exists only there; its storage is
in the test's temp directory. Nothing machine-wide is changed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

import gpudoctor
from tests import needs
from tests.needs import need

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
CAPTURE = FIX / "captures" / "h200-healthy"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def build_standins(d: Path) -> tuple[Path, Path, Path]:
    """(bin with nvidia-smi, lib with libcuda.so.1, the driver shim): the e2e lab's stand-ins, built with gcc."""
    (d / "bin").mkdir(parents=True)
    (d / "lib").mkdir()
    shutil.copy(STANDINS / "nvidia-smi", d / "bin" / "nvidia-smi")
    os.chmod(d / "bin" / "nvidia-smi", 0o755)
    for src, out, extra in (("libcuda_stub.c", d / "lib" / "libcuda.so.1", ["-Wl,-soname,libcuda.so.1"]),
                            ("nvidia_driver_shim.c", d / "nvidia_driver_shim.so", ["-ldl"])):
        subprocess.run([need("gcc"), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out),
                        str(STANDINS / src), *extra], check=True, capture_output=True, text=True)
    return d / "bin", d / "lib", d / "nvidia_driver_shim.so"


def proc_devices(uvm: int) -> str:
    text = (FIX / "captures" / "h200-healthy" / "proc-devices.txt").read_text().splitlines()
    return "\n".join(text[1:-1]).replace("238 nvidia-uvm", f"{uvm} nvidia-uvm") + "\n"


def spec_for(hostdev: Path) -> str:
    """The toolkit's spec (tests/fixtures/cdi/nvidia-uvm-510.yaml) without its library mounts and hooks (this machine
    has no driver files to mount); the nodes without numbers point at real nodes the runtime stats, as on a host."""
    d = yaml.safe_load((FIX / "cdi" / "nvidia-uvm-510.yaml").read_text())
    edits = d["containerEdits"]
    edits.pop("mounts"), edits.pop("hooks")
    for entry in edits["deviceNodes"] + [n for dev in d["devices"] for n in dev["containerEdits"]["deviceNodes"]]:
        if "major" not in entry:
            entry["hostPath"] = str(hostdev / Path(entry["path"]).name)
    return "---\n" + yaml.safe_dump(d, sort_keys=True)


def ulimits() -> list[str]:
    """podman asks for larger limits than a sandboxed root may set: ask for less than this process has."""
    out = []
    for name, res in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(res)[1]
        lim = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
        out += ["--ulimit", f"{name}={lim}:{lim}"]
    return out


@pytest.fixture
def engine(tmp_path):
    needs.elsewhere("podman")
    needs.root()  # podman makes device nodes and cgroups
    found = {"podman": need("podman"), "runc": need("runc"), "unshare": need("unshare")}
    run = tempfile.mkdtemp(prefix="gd-pm-", dir="/tmp")  # podman wants a runroot of at most 50 characters
    yield {**found, "runroot": run}
    shutil.rmtree(run, ignore_errors=True)


def test_container_from_a_stale_cdi_spec_names_the_spec(engine, tmp_path):
    bin_dir, lib_dir, shim = build_standins(tmp_path / "standins")
    hostdev = tmp_path / "hostdev"
    hostdev.mkdir()
    for name, (ma, mi) in {"nvidiactl": (195, 255), "nvidia0": (195, 0), "nvidia-modeset": (195, 254)}.items():
        os.mknod(hostdev / name, stat.S_IFCHR | 0o666, os.makedev(ma, mi))
        os.chmod(hostdev / name, 0o666)
    upper, work = tmp_path / "etc-upper", tmp_path / "etc-work"
    (upper / "cdi").mkdir(parents=True)
    work.mkdir()
    spec = spec_for(hostdev)
    (upper / "cdi" / "nvidia.yaml").write_text(spec)
    (tmp_path / "proc-devices").write_text(proc_devices(509))
    (tmp_path / "driver-version").write_text((FIX / "captures" / "h200-healthy" / "driver-version.txt")
                                             .read_text().splitlines()[1] + "\n")
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{BASE_PATH}", "LD_LIBRARY_PATH": str(lib_dir),
           "LD_PRELOAD": str(shim), "GPUDOCTOR_SHIM_MAJORS": "195,509", "GPUDOCTOR_STANDIN_CAPTURE": str(CAPTURE),
           "HOME": str(tmp_path)}
    inner = tmp_path / "inner.sh"
    inner.write_text(
        "set -e\n"
        f"mount --bind {tmp_path}/proc-devices /proc/devices\n"
        "mount -t tmpfs -o size=64k tmpfs /proc/driver\n"
        f"mkdir /proc/driver/nvidia && cp {tmp_path}/driver-version /proc/driver/nvidia/version\n"
        f"ls -ln /dev/nvidia-uvm > {tmp_path}/node.txt\n"
        f"cat /sys/fs/cgroup/devices/devices.list > {tmp_path}/devices.list 2>/dev/null || true\n"
        f"env -i {' '.join(f'{k}={v}' for k, v in env.items())} {sys.executable} -m gpudoctor snapshot "
        f"-o {tmp_path}/snapshot.json\n"
        f"exec env -i {' '.join(f'{k}={v}' for k, v in env.items())} {sys.executable} -m gpudoctor check --json "
        f"> {tmp_path}/check.json\n")
    mounts = sorted({str(tmp_path), str(Path(gpudoctor.__file__).resolve().parents[1]), str(REPO), sys.prefix})
    podman = [engine["podman"], "--root", str(tmp_path / "storage"), "--runroot", engine["runroot"],
              "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", engine["runc"],
              "--log-level", "error", "run", "--rm", "--network", "none", *ulimits(),
              "--device", "nvidia.com/gpu=all", "--cap-add", "SYS_ADMIN",
              "-v", f"{upper / 'cdi'}:/etc/cdi:ro", *[a for m in mounts for a in ("-v", f"{m}:{m}")],
              "--rootfs", "/:O", "sh", str(inner)]
    outer = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && exec "
             + " ".join(f"'{a}'" for a in podman))
    r = subprocess.run([engine["unshare"], "--mount", "--propagation", "private", "sh", "-c", outer],
                       capture_output=True, text=True, timeout=240)
    out = tmp_path / "check.json"
    assert out.exists() and out.read_text(), f"podman rc {r.returncode}: {r.stderr[-2000:]}"
    # The engine made the node and the cgroup rule from the spec's stale numbers.
    assert " 510,   0 " in (tmp_path / "node.txt").read_text() or "510, 0" in (tmp_path / "node.txt").read_text()
    rules = (tmp_path / "devices.list").read_text()
    assert "c 510:0 rwm" in rules and "c 509:" not in rules, rules
    d = json.loads(out.read_text())
    rc = d["root_cause"]
    assert rc["key"] == "boundary.cdi.device_nodes[/dev/nvidia-uvm]", json.dumps(d["root_cause"], indent=1)
    text = " ".join([rc["summary"], *rc["evidence"]])
    for w in ("/etc/cdi/nvidia.yaml", "containerEdits.deviceNodes", "major 510", "509"):
        assert w in text, w
    by = {f["key"]: f for f in d["findings"]}
    assert by["cuda.init"]["status"] == "fail" and "999" in by["cuda.init"]["summary"]
    assert by["cuda.init"]["blocked_by"] == rc["key"]
    assert by["host.platform"]["data"]["kind"] == "podman"
    assert "recreate" in rc["hint"].lower()
    # a snapshot taken in the container replays, anywhere, to the same diagnosis
    # (tests/fixtures/snapshots/podman-cdi-uvm-510.json, the sample in docs/boundaries.md, is one such snapshot)
    from gpudoctor import snapshot
    from gpudoctor.target import snapshot_facts
    from gpudoctor.diagnose import diagnose

    again = diagnose(snapshot_facts(snapshot.load(str(tmp_path / "snapshot.json"))))
    assert again.root_cause.key == rc["key"] and again.root_cause.summary == rc["summary"]


def test_host_reads_a_running_containers_device_rules_and_sees_a_reset(engine, tmp_path):
    """On the host: the runtime's own config.json of a running podman container (from the same stale spec) and its
    live cgroup v1 devices.list. Then the container's cgroup loses its 195 rules — written to the kernel the way
    systemd's daemon-reload rewrites them — and the host view names the reset."""
    from gpudoctor.diagnose import diagnose
    from gpudoctor.gather import oci
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.gather.hostinfo import parse_proc_devices
    from gpudoctor.host.local import LocalHost

    hostdev = tmp_path / "hostdev"
    hostdev.mkdir()
    for name, (ma, mi) in {"nvidiactl": (195, 255), "nvidia0": (195, 0), "nvidia-modeset": (195, 254)}.items():
        os.mknod(hostdev / name, stat.S_IFCHR | 0o666, os.makedev(ma, mi))
    upper, work = tmp_path / "etc-upper", tmp_path / "etc-work"
    (upper / "cdi").mkdir(parents=True)
    work.mkdir()
    (upper / "cdi" / "nvidia.yaml").write_text(spec_for(hostdev))
    base = [engine["podman"], "--root", str(tmp_path / "storage"), "--runroot", engine["runroot"],
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", engine["runc"], "--log-level", "error"]
    run = [*base, "run", "-d", "--name", "gd-cdi-host", "--network", "none", *ulimits(), "--device",
           "nvidia.com/gpu=all", "--rootfs", "/:O", "sleep", "120"]
    outer = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && exec "
             + " ".join(f"'{a}'" for a in run))
    r = subprocess.run([engine["unshare"], "--mount", "--propagation", "private", "sh", "-c", outer],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        ctx = GatherContext(name="host", timeout=10,
                            oci_state_dirs=[["podman", str(tmp_path / "storage" / "vfs-containers"), "userdata"]])
        live = {"host": {"proc_devices": parse_proc_devices(proc_devices(509))}}
        facts = {**live, "oci": oci.gather(LocalHost(), ctx)}
        [c] = facts["oci"]["containers"]
        assert c["running"] and "c 510:0 rwm" in c["live_rules"]
        assert "env" not in json.dumps(c), "only the device fields leave the target"
        [f] = [x for x in diagnose(facts).findings if x.id == "boundary.container.oci_rules"]
        assert f.status.value == "warn" and "/dev/nvidia-uvm was made as c 510:0, the live nvidia-uvm is c 509:0" in f.summary
        assert f.data["recreate"] and "Recreate it" in f.hint
        # the kernel side of a daemon-reload reset (nvidia-container-toolkit#251: afterwards devices.list has no
        # c 195:N rw entries): the container's cgroup loses them
        deny = Path("/sys/fs/cgroup/devices") / c["cgroup"].lstrip("/") / "devices.deny"
        for rule in ("c 195:0 rwm", "c 195:255 rwm"):
            deny.write_text(rule + "\n")
        facts = {**live, "oci": oci.gather(LocalHost(), ctx)}
        [f] = [x for x in diagnose(facts).findings if x.id == "boundary.container.oci_rules"]
        assert "/dev/nvidiactl" in f.data["reset"] and "device-rule reset" in f.summary
    finally:
        subprocess.run([*base, "rm", "-f", "-t", "0", "gd-cdi-host"], capture_output=True, timeout=120)
