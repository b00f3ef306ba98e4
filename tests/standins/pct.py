"""Test stand-in for Proxmox's `pct` on the lab's Proxmox node (tests/lxclab.py): list, config, status, start,
stop, reboot, exec — acting on real LXC (lxc-start, lxc-stop, lxc-info, lxc-attach).

    python3 pct.py LAB.json COMMAND [ARGS]      (the node's /usr/local/sbin/pct wrapper passes LAB.json)

It runs inside the node's own mount and cgroup namespaces (an sshd session, or the lab's nsenter), where
/etc/pve/lxc, /var/lib/lxc, /proc/devices and /dev are the node's. What it follows of pve-container (our own
reading of src/PVE/LXC/Config.pm parse_pct_config, src/PVE/LXC.pm update_lxc_config, src/lxc-pve-prestart-hook
and src/lxc-pve-autodev-hook; none of their code is used):

- parse: blank lines skipped; `[pve:pending]` and `[name]` headers start sections that are not the live config;
  `#` lines are the description; `lxc.KEY: value` / `lxc.KEY = value` raw keys kept in file order; `key: value`
  properties; anything else is warned about ("vm 200 - unable to parse config: LINE") and skipped;
- `start` regenerates /var/lib/lxc/VMID/config from the live section: PVE's cgroup dir lines, lxc.arch, the
  ostype common.conf include (common.conf when there is none), lxc.apparmor lines, the entrypoint's /dev/shm,
  one `lxc.cgroup2.devices.allow = c MAJ:MIN rw` per devN: entry (stat of the host path now), lxc.monitor.unshare,
  the console/tty lines, TERM, lxc.uts.name, memory lines only when cgroup2 has the memory controller,
  lxc.rootfs.path, lxc.init.cmd (entrypoint), the netN veth lines, then every raw lxc.* line verbatim in file
  order; the devN: nodes are made in /var/lib/lxc/VMID/passthrough (the prestart hook's job) and bind-mounted
  into the container's /dev by an autodev hook (lxc-pve-autodev-hook's job);
- `reboot` = stop, regenerate, start; `stop` = lxc-stop --kill (pct stop is an immediate stop);
- `exec VMID -- CMD` = lxc-attach.

What the lab adds, after PVE's lines and marked `# gpudoctor lab`, because this machine is not a PVE node: the
rootfs is a prepared directory (PVE mounts a volume there), /usr of the node bind-mounted read-only into it (the
guest's python3 and sshd), an empty lxc.tty.dir (PVE's LXC build has /dev/lxc; Debian's needs it empty with a
directory rootfs), the autodev hook, the host end of the veth named per run and given a /30 address instead of
joining bridge vmbr0 (lxcnetaddbr), and the lab's environment for `exec`. Every call is appended to STATE/calls.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

RAW = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
PROP = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")
SNAP = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I)
PENDING = re.compile(r"^\[pve:pending\]\s*$", re.I)
DEVN = re.compile(r"^dev(\d+)$")
NETN = re.compile(r"^net(\d+)$")
CFGPATH = "/usr/share/lxc/config"


def die(msg: str, rc: int = 255):
    print(msg, file=sys.stderr)
    raise SystemExit(rc)


class Lab:
    def __init__(self, path: str):
        with open(path) as fh:
            self.d = json.load(fh)
        self.lxcpath = self.d["lxcpath"]
        self.state = self.d["state_dir"]

    def guest(self, vmid: str) -> dict:
        g = self.d["guests"].get(str(vmid))
        if g is None or not os.path.exists(conf_path(vmid)):
            die(f"Configuration file 'nodes/{self.d.get('node', 'kpro6')}/lxc/{vmid}.conf' does not exist", 2)
        return g

    def lxc(self, tool: str, vmid: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([tool, "-n", str(vmid), "-P", self.lxcpath, *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            die(r.stderr.strip() or f"{tool} failed (rc {r.returncode})", 1)
        return r

    def status(self, vmid: str) -> str:
        r = self.lxc("lxc-info", vmid, "-s", check=False)
        m = re.search(r"State:\s*(\S+)", r.stdout)
        return "running" if m and m.group(1) == "RUNNING" else "stopped"


def conf_path(vmid: str) -> str:
    return f"/etc/pve/lxc/{vmid}.conf"


# --- parse_pct_config ------------------------------------------------------------------------------------

def parse(text: str, vmid: str, *, warn=True) -> dict:
    """The live section: {'props': {key: value}, 'lxc': [(key, value)], 'description': str}; the rest ignored."""
    live = {"props": {}, "lxc": [], "description": ""}
    conf = live
    for line in text.split("\n"):
        if not line.strip():
            continue
        if PENDING.match(line) or SNAP.match(line):
            conf = {"props": {}, "lxc": [], "description": ""}  # a pending or snapshot section: never applied
            continue
        if line.startswith("#"):
            conf["description"] += line[1:] + "\n"
            continue
        if m := RAW.match(line):
            conf["lxc"].append((m.group(1), m.group(3)))
        elif m := re.match(r"^(description):\s*(.*\S)\s*$", line):
            conf["description"] += m.group(2)
        elif m := PROP.match(line):
            conf["props"][m.group(1)] = m.group(2)
        elif warn and conf is live:
            print(f"vm {vmid} - unable to parse config: {line}", file=sys.stderr)
    return live


def kv(spec: str, default_key: str) -> dict:
    """A property string `a=1,b=2` (the first item may omit its key)."""
    out = {}
    for i, item in enumerate(spec.split(",")):
        k, sep, v = item.partition("=")
        if not sep:
            k, v = (default_key, item) if i == 0 else (item, "1")
        out[k.strip()] = v.strip()
    return out


# --- update_lxc_config -----------------------------------------------------------------------------------

def cgroup2_controllers() -> set[str]:
    try:
        with open("/sys/fs/cgroup/cgroup.controllers") as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def passthrough_devices(conf: dict) -> list[tuple[str, dict]]:
    props = conf["props"]
    keys = sorted((k for k in props if DEVN.match(k)), key=lambda k: int(DEVN.match(k).group(1)))
    return [(k, kv(props[k], "path")) for k in keys]


def running_config(lab: Lab, vmid: str, conf: dict) -> tuple[str, list[tuple[str, int, int, str, dict]]]:
    """/var/lib/lxc/VMID/config as update_lxc_config writes it (then the lab's lines), and the devN: nodes."""
    props, d = conf["props"], f"/var/lib/lxc/{vmid}"
    raw = ["lxc.cgroup.relative = 0", f"lxc.cgroup.dir.monitor = lxc.monitor/{vmid}",
           f"lxc.cgroup.dir.container = lxc/{vmid}", "lxc.cgroup.dir.container.inner = ns"]
    if "arch" not in props:
        die("missing 'arch' - internal error", 1)
    raw.append(f"lxc.arch = {props['arch']}")
    ostype = props.get("ostype") or die("missing 'ostype' - internal error", 1)
    inc = f"{CFGPATH}/{ostype}.common.conf"
    raw.append(f"lxc.include = {inc if os.path.isfile(inc) else CFGPATH + '/common.conf'}")
    features = kv(props.get("features", ""), "") if props.get("features") else {}
    if not any(k == "lxc.apparmor.profile" for k, _ in conf["lxc"]):
        raw += ["lxc.apparmor.profile = generated", "lxc.apparmor.raw = allow mqueue,"]
        if features.get("nesting") == "1":
            raw += ["lxc.apparmor.allow_nesting = 1", "lxc.apparmor.raw = allow userns,"]
        else:
            raw += ["lxc.apparmor.raw = deny mount -> /proc/,", "lxc.apparmor.raw = deny mount -> /sys/,"]
    entry = props.get("entrypoint")
    if entry is not None and entry != "/sbin/init":
        raw.append("lxc.mount.entry = shm dev/shm tmpfs rw,nosuid,nodev,create=dir 0 0")
    nodes = []
    for key, dev in passthrough_devices(conf):
        path = dev.get("path")
        if not path:
            die(f"Path is not defined for passthrough device {key}", 1)
        try:
            st = os.stat(path)
        except OSError as exc:
            die(f"Device {path} does not exist: {exc.strerror}", 1)
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        perms = "r" if dev.get("deny-write") == "1" else "rw"
        raw.append(f"lxc.cgroup2.devices.allow = {kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {perms}")
        if perms == "r":
            raw.append(f"lxc.cgroup2.devices.deny = {kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} w")
        nodes.append((kind, os.major(st.st_rdev), os.minor(st.st_rdev), path, dev))
    raw.append("lxc.monitor.unshare = 1")
    if props.get("console", "1") == "0":
        raw += ["lxc.console.path = none", "lxc.cgroup2.devices.deny = c 5:1 rwm"]
    raw.append(f"lxc.tty.max = {props.get('tty', '2') if props.get('console', '1') != '0' else 0}")
    raw.append("lxc.environment = TERM=linux")
    raw.append(f"lxc.uts.name = {props.get('hostname') or 'CT' + vmid}")
    if "memory" in cgroup2_controllers():  # PVE::CGroup: only when cgroup2 has the memory controller
        mem, swap = int(props.get("memory", "512")), int(props.get("swap", "0"))
        high = (mem - 128) * 1024 * 1024 if mem >= 16 * 1024 else mem * 1024 * 1016
        raw += [f"lxc.cgroup2.memory.max = {mem * 1024 * 1024}", f"lxc.cgroup2.memory.high = {high}",
                f"lxc.cgroup2.memory.swap.max = {swap * 1024 * 1024}"]
    if "rootfs" not in props:
        die("missing 'rootfs' configuration", 1)
    raw.append(f"lxc.rootfs.path = {d}/rootfs")
    if entry is not None:
        raw.append(f"lxc.init.cmd = {entry}")
    for key in sorted(props):
        m = NETN.match(key)
        if not m:
            continue
        i, net = m.group(1), kv(props[key], "name")
        host = lab.d["guests"][vmid]["net"]
        raw += [f"lxc.net.{i}.type = veth", f"lxc.net.{i}.veth.pair = veth{vmid}i{i}"]
        if "hwaddr" in net:
            raw.append(f"lxc.net.{i}.hwaddr = {net['hwaddr']}")
        if "name" in net:
            raw.append(f"lxc.net.{i}.name = {net['name']}")
        raw += [f"lxc.net.{i}.mtu = {net.get('mtu', '1500')}",
                f"lxc.net.{i}.script.up = /usr/share/lxc/lxcnetaddbr"]
        if net.get("link_down") != "1" and net.get("host-managed") == "1":
            if net.get("ip") not in (None, "dhcp", "manual"):
                raw.append(f"lxc.net.{i}.ipv4.address = {net['ip']}")
            if "gw" in net:
                raw.append(f"lxc.net.{i}.ipv4.gateway = {net['gw']}")
            raw.append(f"lxc.net.{i}.flags = up")
        # the lab: a per-run name for the host end, which gets the /30's first address (no bridge vmbr0 here)
        raw += ["# gpudoctor lab: host end of the veth", f"lxc.net.{i}.veth.pair = {host['pair']}",
                f"lxc.net.{i}.script.up = {lab.d['netup']}"]
    raw += [f"{k} = {v}" for k, v in conf["lxc"]]
    raw += ["# gpudoctor lab: a directory rootfs with the node's /usr, Debian LXC's tty layout, PVE's autodev hook",
            *lab.d["guests"][vmid].get("lab_lines", []), f"lxc.hook.autodev = {lab.d['autodev_hook']}"]
    return "\n".join(raw) + "\n", nodes


def write_file(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def prepare(lab: Lab, vmid: str) -> None:
    """update_lxc_config plus the prestart hook's passthrough nodes."""
    with open(conf_path(vmid), encoding="utf-8", errors="surrogateescape") as fh:
        conf = parse(fh.read(), vmid)
    if lock := conf["props"].get("lock"):
        die(f"CT {vmid} is locked ({lock})", 2)
    d = f"/var/lib/lxc/{vmid}"
    os.makedirs(f"{d}/rootfs", exist_ok=True)
    text, nodes = running_config(lab, vmid, conf)
    write_file(f"{d}/config", text)
    pt = f"{d}/passthrough"
    subprocess.run(["rm", "-rf", pt], check=True)
    os.makedirs(f"{pt}/dev")
    devlist = ""
    for kind, major, minor, path, dev in nodes:
        rel = path[len("/dev/"):]
        os.makedirs(os.path.dirname(f"{pt}/dev/{rel}"), exist_ok=True)
        mode = int(dev.get("mode", "0660"), 8)
        os.mknod(f"{pt}/dev/{rel}", (stat.S_IFBLK if kind == "b" else stat.S_IFCHR) | mode, os.makedev(major, minor))
        os.chmod(f"{pt}/dev/{rel}", mode)
        os.chown(f"{pt}/dev/{rel}", int(dev.get("uid", "0")), int(dev.get("gid", "0")))
        devlist += f"{kind}:{major}:{minor}:{path}\n"
    write_file(f"{pt}/devices", devlist)


def start(lab: Lab, vmid: str) -> None:
    if lab.status(vmid) == "running":
        die(f"CT {vmid} already running", 255)
    prepare(lab, vmid)
    log = os.path.join(lab.state, f"{vmid}.log")
    r = lab.lxc("lxc-start", vmid, "-d", "-l", "INFO", "-o", log, check=False)
    if r.returncode != 0:
        die(f"startup for container '{vmid}' failed\n{r.stderr.strip()}", 1)
    with open(conf_path(vmid), "rb") as src, open(os.path.join(lab.state, f"{vmid}.started-from"), "wb") as dst:
        dst.write(src.read())  # the lab's own record: which config bytes this start used


def stop(lab: Lab, vmid: str) -> None:
    if lab.status(vmid) != "running":
        die(f"CT {vmid} not running", 255)
    lab.lxc("lxc-stop", vmid, "--kill")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        die("usage: pct.py LAB.json COMMAND [ARGS]")
    lab = Lab(argv[0])
    cmd, args = argv[1], argv[2:]
    with open(os.path.join(lab.state, "calls"), "a") as fh:
        fh.write(" ".join([cmd, *args]) + "\n")
    if cmd == "list":
        print("VMID       Status     Lock         Name                ")
        for vmid in sorted(lab.d["guests"], key=int):
            if not os.path.exists(conf_path(vmid)):
                continue
            with open(conf_path(vmid), encoding="utf-8", errors="surrogateescape") as fh:
                props = parse(fh.read(), vmid, warn=False)["props"]
            print(f"{vmid:<10} {lab.status(vmid):<10} {props.get('lock', ''):<12} "
                  f"{props.get('hostname', 'CT' + vmid):<20}")
        return 0
    if not args:
        die(f"400 not enough arguments\npct {cmd} <vmid>")
    vmid = args[0]
    lab.guest(vmid)
    if cmd == "status":
        print(f"status: {lab.status(vmid)}")
    elif cmd == "config":
        with open(conf_path(vmid), encoding="utf-8", errors="surrogateescape") as fh:
            text = fh.read()
        live = text.split("\n[", 1)[0] if not text.startswith("[") else ""
        print("\n".join(ln for ln in live.split("\n") if ln.strip()))
    elif cmd == "start":
        start(lab, vmid)
    elif cmd == "stop":
        stop(lab, vmid)
    elif cmd == "reboot":
        if lab.status(vmid) != "running":
            return 0  # pct reboot does nothing to a stopped container
        stop(lab, vmid)
        start(lab, vmid)
    elif cmd == "exec":
        rest = args[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not rest:
            die("400 missing command")
        if lab.status(vmid) != "running":
            die(f"CT {vmid} not running", 1)
        env = [a for k, v in lab.d["guests"][vmid]["env"].items() for a in ("--set-var", f"{k}={v}")]
        os.execvp("lxc-attach", ["lxc-attach", "-n", vmid, "-P", lab.lxcpath, "--clear-env", *env, "--", *rest])
    else:
        die(f"400 unknown command 'pct {cmd}'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
