"""facts["tools"]: what the remedies plan from. Parsers on real-format input; the gather on a temp root, locally and
over a real sshd (same answers)."""

from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.tools import gather, parse_caps, parse_dev_mounts, sysctl_settings

# /proc/self/mountinfo after `mount --bind /dev/null /dev/nvidia-uvm` (capture_faults.sh's fault A)
MOUNTINFO = """22 27 0:21 / /proc rw,relatime - proc proc rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334432k,nr_inodes=3083608,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683652k
812 24 0:6 /null /dev/nvidia-uvm rw,relatime - devtmpfs devtmpfs rw,size=12334432k,mode=755
813 24 0:58 /nvidia-uvm-tools /dev/nvidia-uvm-tools rw shared:3 master:1 - tmpfs tmpfs rw
"""


def test_caps_mknod_and_user_namespace():
    full = "Name:\tx\nCapEff:\t000001ffffffffff\n"
    assert parse_caps(full, "         0          0 4294967295\n") == {
        "effective": "000001ffffffffff", "mknod": True, "sys_admin": True, "sys_module": True, "userns": False}
    assert parse_caps(f"CapEff:\t{0x1ffffffffff & ~(1 << 16):016x}\n", None)["sys_module"] is False  # #40's unit
    no_mknod = f"CapEff:\t{0x1ffffffffff & ~(1 << 27):016x}\n"
    assert parse_caps(no_mknod, "0 0 4294967295")["mknod"] is False
    assert parse_caps(full, "         0     100000      65536\n")["userns"] is True  # unprivileged LXC
    assert parse_caps(full, None)["userns"] is None
    assert "error" in parse_caps("Name: x\n", None)


def test_bind_mounts_over_gpu_nodes():
    m = parse_dev_mounts(MOUNTINFO)
    assert m == {"/dev/nvidia-uvm": {"root": "/null", "fstype": "devtmpfs", "source": "devtmpfs"},
                 "/dev/nvidia-uvm-tools": {"root": "/nvidia-uvm-tools", "fstype": "tmpfs", "source": "tmpfs"}}


def test_sysctl_lines_that_set_numa_balancing():
    got = sysctl_settings({"/etc/sysctl.d/99-x.conf": "# kernel.numa_balancing = 1\nkernel.numa_balancing=2\n"
                                                      "  kernel/numa_balancing = 0  \n-kernel.numa_balancing = 1\n"})
    assert [(s["line"], s["value"]) for s in got] == [(2, "2"), (3, "0"), (4, "1")]


def test_gather_on_a_temp_root_locally_and_over_ssh_agree(make_root, sshd):
    r = make_root(uvm_major=511)
    r.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 1\n")
    r.write("/etc/sysctl.d/90-gpudoctor-numa.conf", "kernel.numa_balancing = 0\n")
    r.write("/lib/systemd/system/nvidia-persistenced.service", "[Service]\nExecStart=/usr/bin/nvidia-persistenced\n")
    r.path("/run/systemd/system").mkdir(parents=True)
    r.bind_mount("/dev/nvidia-uvm", source="udev", root="/null")
    local = gather(r.host(), GatherContext(timeout=5))
    assert local["commands"]["setpci"] == str(r.bin / "setpci") and local["systemd"] is True
    assert local["units"]["nvidia-persistenced.service"]["path"] == "/lib/systemd/system/nvidia-persistenced.service"
    assert local["units"]["nvidia-persistenced.service"]["enabled"] == "disabled"
    assert local["files"]["/etc/sysctl.d/90-gpudoctor-numa.conf"]["text"] == "kernel.numa_balancing = 0\n"
    assert local["files"]["/etc/systemd/system/gpudoctor-pcie-mrrs.service"]["error"] == "ENOENT"
    assert [s["path"] for s in local["sysctl_numa"]] == ["/etc/sysctl.d/60-numa.conf",
                                                        "/etc/sysctl.d/90-gpudoctor-numa.conf"]
    assert local["dev_mounts"]["/dev/nvidia-uvm"]["root"] == "/null" and local["caps"]["mknod"] is True
    host = sshd.make_host(name="gpu1", root=str(r.root), path_prepend=[str(r.bin)])
    try:
        remote = gather(host, GatherContext(timeout=10))
    finally:
        host.close()
    for d in (local, remote):
        d["commands"].pop("gpudoctor")  # where gpudoctor itself is depends on the session's PATH
    assert remote == local
