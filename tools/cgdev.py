#!/usr/bin/env python3
"""Run a command in a fresh cgroup2 directory whose eBPF device program (BPF_PROG_TYPE_CGROUP_DEVICE, what LXC,
systemd's DeviceAllow= and runc generate) denies every character device of the given majors — the way to reproduce
"EPERM although the mode is 0666" on a real kernel, in the caller's own cgroup subtree only.

    tools/cgdev.py 238 [195 ...] -- gpudoctor check       # deny c 238:* (and c 195:*), run the check inside

Needs root and a writable cgroup2 mount (found in /proc/self/mounts). Prints the cgroup directory and the program
id on stderr; removes the directory afterwards. Importable: `DeviceDenyCgroup` (tests use it).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import sys
import tempfile

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_OBJ_GET_INFO_BY_FD = 5, 8, 15
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE = 15, 6


def _bpf(cmd: int, attr: bytes) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(_NR_BPF[platform.machine()], cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}) failed")
    return r


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(majors: list[int]) -> bytes:
    """r2 = ctx->major; for each denied major: if r2 == M goto deny; allow: r0 = 1, exit; deny: r0 = 0, exit.
    (struct bpf_cgroup_dev_ctx: access_type u32 at 0, major u32 at 4, minor u32 at 8.) Only char devices are
    denied: the low 16 bits of access_type are the type (BPF_DEVCG_DEV_CHAR = 2)."""
    n = len(majors)
    body = [_insn(0x61, 3, 1, 0, 0),  # r3 = ctx->access_type
            _insn(0x57, 3, 0, 0, 0xFFFF),  # r3 &= 0xffff (device type)
            _insn(0x55, 3, 0, n + 1, 2),  # if r3 != CHAR goto allow
            _insn(0x61, 2, 1, 4, 0)]  # r2 = ctx->major
    for i, m in enumerate(majors):
        body.append(_insn(0x15, 2, 0, (n - 1 - i) + 2, int(m)))  # if r2 == m goto deny
    body += [_insn(0xB7, 0, 0, 0, 1), _insn(0x95), _insn(0xB7, 0, 0, 0, 0), _insn(0x95)]
    return b"".join(body)


def load(majors: list[int]) -> int:
    prog = program(majors)
    insns = ctypes.create_string_buffer(prog, len(prog))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack("<IIQQIIQ", BPF_PROG_TYPE_CGROUP_DEVICE, len(prog) // 8, ctypes.addressof(insns),
                       ctypes.addressof(lic), 1, 4096, ctypes.addressof(log))
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        raise OSError(exc.errno, "BPF_PROG_LOAD: " + log.value.decode(errors="replace")) from None


def prog_id(fd: int) -> int:
    """The kernel's id of a loaded program (what BPF_PROG_QUERY lists)."""
    info = ctypes.create_string_buffer(256)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, 256, ctypes.addressof(info)))
    return struct.unpack_from("<I", info.raw, 4)[0]  # struct bpf_prog_info: type u32, id u32


def cgroup2_root() -> str | None:
    with open("/proc/self/mounts") as fh:
        for ln in fh:
            f = ln.split()
            if len(f) > 2 and f[2] == "cgroup2":
                return f[1]
    return None


def own_cgroup2() -> str | None:
    """This process's cgroup2 directory (children are made under it, so nothing outside our subtree is touched)."""
    root = cgroup2_root()
    if root is None:
        return None
    with open("/proc/self/cgroup") as fh:
        for ln in fh:
            if ln.startswith("0::"):
                return os.path.join(root, ln[3:].strip().lstrip("/"))
    return root


class DeviceDenyCgroup:
    """A cgroup2 child of our own cgroup with a device program denying `majors` attached; `enter` is a preexec_fn."""

    def __init__(self, majors: list[int], prefix: str = "gpudoctor-cgdev-"):
        base = own_cgroup2()
        if base is None:
            raise OSError(2, "no cgroup2 mount")
        try:
            self.path = tempfile.mkdtemp(prefix=prefix, dir=base)
        except OSError:  # our own cgroup is not writable (delegation): the hierarchy's root
            self.path = tempfile.mkdtemp(prefix=prefix, dir=cgroup2_root())
        try:
            self.prog_fd = load(list(majors))
            self.prog_id = prog_id(self.prog_fd)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _bpf(BPF_PROG_ATTACH, struct.pack("<IIII", fd, self.prog_fd, BPF_CGROUP_DEVICE, 0))
            finally:
                os.close(fd)
        except BaseException:
            os.rmdir(self.path)
            raise

    def enter(self) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))

    def close(self) -> None:
        os.close(self.prog_fd)
        try:
            os.rmdir(self.path)  # detaches the program with the directory
        except OSError as exc:
            print(f"cgdev: could not remove {self.path}: {exc}", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    majors, cmd = [int(a) for a in argv[:cut]], argv[cut + 1:]
    with DeviceDenyCgroup(majors) as cg:
        print(f"cgdev: {cg.path} denies c {{{','.join(map(str, majors))}}}:* (device program id {cg.prog_id})",
              file=sys.stderr, flush=True)
        return subprocess.call(cmd, preexec_fn=cg.enter)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
