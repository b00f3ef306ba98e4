"""Test stand-in for Proxmox's `pct`, run on the test "Proxmox host" (tests/e2e): list, status, config, start,
reboot, exec — over the test container that tests/e2e/lab.py builds from real namespaces and a real device cgroup.

    python3 pct.py LAB.json COMMAND [ARGS]      (the lab's wrapper script passes LAB.json)

What it models (pve-container's behaviour, docs/lxc.md):
- the container config is read from the lab's fake root (/etc/pve/lxc/VMID.conf), LIVE section only (everything
  after the first `[` header belongs to a snapshot or [pve:pending]); lines Proxmox cannot parse are ignored;
- `start`/`reboot` regenerate the running config /var/lib/lxc/VMID/config (devN: rules first, then the raw lxc.*
  lines as `key = value`), then rebuild the container's device cgroup from it as LXC does at start: `deny a`, the
  base allow list of LXC's common.conf, then every lxc.cgroup2.devices.allow/deny rule in order. The lab runs on a
  cgroup v1 `devices` controller, so the rules are written to devices.allow/devices.deny; they have the same
  effect on open() as LXC's cgroup2 device program for these allow-only rule sets;
- `exec VMID -- CMD` joins the container's cgroup and enters its mount, pid and uts namespaces (lxc-attach).
Every call is appended to STATE/calls.
"""

from __future__ import annotations

import json
import os
import re
import sys

# LXC's config/common.conf base allow list (after `deny a`): mknod of anything, then null, zero, full, tty,
# console, ptmx, random, urandom, pts/*, fuse.
BASE_RULES = ["c *:* m", "b *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm",
              "c 1:8 rwm", "c 1:9 rwm", "c 136:* rwm", "c 10:229 rwm"]
RAW = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
DEVN = re.compile(r"^dev(\d+):\s*(.+?)\s*$")
KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")


def die(msg: str, rc: int = 255):
    print(msg, file=sys.stderr)
    raise SystemExit(rc)


class Lab:
    def __init__(self, path: str):
        with open(path) as fh:
            self.d = json.load(fh)
        self.root = self.d["root"]
        self.state = self.d["state_dir"]

    def real(self, path: str) -> str:
        return self.root + path

    def guest(self, vmid: str) -> dict:
        g = self.d["guests"].get(str(vmid))
        if g is None:
            die(f"Configuration file 'nodes/lab/lxc/{vmid}.conf' does not exist", 2)
        return g

    def config_text(self, vmid: str) -> str:
        with open(self.real(f"{self.d['config_dir']}/{vmid}.conf"), encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()

    def status(self, vmid: str) -> str:
        try:
            with open(os.path.join(self.state, f"{vmid}.status")) as fh:
                return fh.read().strip() or "stopped"
        except FileNotFoundError:
            return "stopped"

    def set_status(self, vmid: str, status: str) -> None:
        with open(os.path.join(self.state, f"{vmid}.status"), "w") as fh:
            fh.write(status + "\n")


def live_lines(text: str) -> list[str]:
    out = []
    for line in text.split("\n"):
        if line.startswith("["):
            break
        out.append(line.rstrip("\r"))
    return out


def running_config(lab: Lab, vmid: str) -> tuple[str, list[tuple[str, str]]]:
    """The running config Proxmox writes at start, and the device rules in it ((allow|deny, rule), in order)."""
    keys, raw, devn = {}, [], []
    for line in live_lines(lab.config_text(vmid)):
        if not line.strip() or line.startswith("#"):
            continue
        if m := RAW.match(line):
            raw.append((m.group(1), m.group(3)))
        elif m := DEVN.match(line):
            devn.append(m.group(2))
        elif m := KEY.match(line):
            keys[m.group(1)] = m.group(2)
        # anything else: Proxmox warns "unable to parse config" and ignores it
    rules: list[tuple[str, str]] = []
    out = [f"lxc.arch = {keys.get('arch', 'amd64')}", "lxc.include = /usr/share/lxc/config/common.conf",
           f"lxc.uts.name = {keys.get('hostname', 'CT' + vmid)}"]
    for spec in devn:
        path = spec.split(",")[0].removeprefix("path=")
        try:
            st = os.stat(lab.real(path))
        except OSError as exc:
            die(f"Device {path} does not exist ({exc.strerror})", 1)
        kind = "b" if (st.st_mode & 0o170000) == 0o060000 else "c"
        rule = f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rw"
        out.append(f"lxc.cgroup2.devices.allow = {rule}")
        rules.append(("allow", rule))
    for key, value in raw:
        out.append(f"{key} = {value}")
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup2.devices.deny"):
            rules.append((key.rsplit(".", 1)[1], value))
    return "\n".join(out) + "\n", rules


def apply_rules(cgroup: str, rules: list[tuple[str, str]]) -> None:
    """The container's device cgroup as LXC builds it at start."""
    def write(which: str, rule: str) -> None:
        try:
            with open(os.path.join(cgroup, f"devices.{which}"), "w") as fh:
                fh.write(rule)
        except OSError as exc:
            die(f"lxc-start: invalid device rule '{rule}' ({exc.strerror}); the container did not start", 1)

    write("deny", "a")
    for rule in BASE_RULES:
        write("allow", rule)
    for which, rule in rules:
        write(which, "a" if rule.strip() == "a" else rule)


# LXC's autodev /dev: the base nodes every container gets (name, major, minor), and its symlinks.
BASE_NODES = [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0),
              ("ptmx", 5, 2)]
BASE_LINKS = [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
              ("stderr", "/proc/self/fd/2")]


def copy_node(src: str, dst: str) -> None:
    """What a bind mount of a host node gives the guest: the same type, major:minor and mode (dirs: recursively)."""
    st = os.lstat(src)
    if (st.st_mode & 0o170000) == 0o040000:
        os.makedirs(dst, exist_ok=True)
        os.chmod(dst, st.st_mode & 0o7777)
        for name in sorted(os.listdir(src)):
            copy_node(os.path.join(src, name), os.path.join(dst, name))
        return
    if (st.st_mode & 0o170000) in (0o020000, 0o060000):
        os.mknod(dst, st.st_mode, st.st_rdev)
        os.chmod(dst, st.st_mode & 0o7777)
    else:
        open(dst, "w").close()  # create=file over a non-node: an empty file


def build_dev(lab: Lab, vmid: str) -> None:
    """The container's /dev as LXC builds it at start: autodev base nodes, then the config's bind mounts of host
    nodes (`optional` ones skipped when the host has no such node) and its devN: nodes."""
    import shutil

    dev = lab.guest(vmid)["dev_dir"]
    os.makedirs(dev, exist_ok=True)
    for name in os.listdir(dev):
        p = os.path.join(dev, name)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    for name, major, minor in BASE_NODES:
        os.mknod(os.path.join(dev, name), 0o020666, os.makedev(major, minor))
        os.chmod(os.path.join(dev, name), 0o666)
    for name, target in BASE_LINKS:
        os.symlink(target, os.path.join(dev, name))
    for d in ("pts", "shm"):
        os.mkdir(os.path.join(dev, d))
    for line in live_lines(lab.config_text(vmid)):
        src = None
        if (m := RAW.match(line)) and m.group(1) == "lxc.mount.entry":
            parts = m.group(3).split()
            if len(parts) >= 4 and parts[0].startswith("/dev/") and parts[1].startswith("dev/") and "bind" in parts[3]:
                src, dst, optional = parts[0], parts[1][len("dev/"):], "optional" in parts[3].split(",")
        elif m := DEVN.match(line):
            src = m.group(2).split(",")[0].removeprefix("path=")
            dst, optional = src[len("/dev/"):], False
        if src is None:
            continue
        if not os.path.lexists(lab.real(src)):
            if optional:
                continue
            die(f"lxc-start: mount source {src} does not exist; the container did not start", 1)
        target = os.path.join(dev, dst)
        if os.path.lexists(target):
            continue  # passed twice (a mount entry and a devN:): one node
        os.makedirs(os.path.dirname(target), exist_ok=True)
        copy_node(lab.real(src), target)


def start(lab: Lab, vmid: str) -> None:
    g = lab.guest(vmid)
    build_dev(lab, vmid)
    text, rules = running_config(lab, vmid)
    path = lab.real(f"/var/lib/lxc/{vmid}/config")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    apply_rules(g["cgroup"], rules)
    lab.set_status(vmid, "running")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        die("usage: pct.py LAB.json COMMAND [ARGS]")
    lab = Lab(argv[0])
    cmd, args = argv[1], argv[2:]
    with open(os.path.join(lab.state, "calls"), "a") as fh:
        fh.write(" ".join([cmd, *args]) + "\n")
    if cmd == "list":
        print("VMID       Status     Lock         Name                ")
        for vmid, g in sorted(lab.d["guests"].items()):
            lock = next((ln.split(":", 1)[1].strip() for ln in live_lines(lab.config_text(vmid))
                         if ln.startswith("lock:")), "")
            print(f"{vmid:<10} {lab.status(vmid):<10} {lock:<12} {g['name']:<20}")
        return 0
    if not args:
        die(f"400 not enough arguments\npct {cmd} <vmid>")
    vmid = args[0]
    lab.guest(vmid)
    if cmd == "status":
        print(f"status: {lab.status(vmid)}")
    elif cmd == "config":
        print("\n".join(ln for ln in live_lines(lab.config_text(vmid)) if ln.strip()))
    elif cmd in ("start", "reboot"):
        if cmd == "reboot" and lab.status(vmid) != "running":
            return 0  # pct reboot does nothing to a stopped container
        start(lab, vmid)
    elif cmd == "exec":
        rest = args[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not rest:
            die("400 missing command")
        if lab.status(vmid) != "running":
            die(f"CT {vmid} not running", 1)
        g = lab.guest(vmid)
        with open(os.path.join(g["cgroup"], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        with open(g["init_pid_file"]) as fh:
            pid = fh.read().strip()
        nsenter = lab.d.get("nsenter", "/usr/bin/nsenter")
        os.execve(nsenter, ["nsenter", "-t", pid, "-m", "-p", "-u", "--", *rest], g["env"])
    else:
        die(f"400 unknown command 'pct {cmd}'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
