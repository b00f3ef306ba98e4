"""Shared by the stand-in tools: the fake root they act on and the log of every call (argv as JSON lines).

Every stand-in acts under a fake root (a test's temp root, the same one LocalHost(root=...) maps) and appends its argv
to ROOT/standin-calls.jsonl. Without a root a stand-in refuses to run, so a test can never reach the real machine
through one.
"""

import json
import os
import sys

def _root() -> str:
    """$GPUDOCTOR_STANDIN_ROOT, else the `.standin-root` file beside the link the tool was called by (HostRoot writes
    one into its bin dir, so a session without our environment, e.g. over SSH, finds the same root)."""
    env = os.environ.get("GPUDOCTOR_STANDIN_ROOT", "")
    if env:
        return env
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), ".standin-root")) as fh:
            return fh.read().strip()
    except OSError:
        return ""


ROOT = _root()
if not ROOT or not os.path.isdir(ROOT):
    sys.stderr.write(f"{os.path.basename(sys.argv[0])} (stand-in): no fake root (GPUDOCTOR_STANDIN_ROOT or "
                     f".standin-root beside the tool)\n")
    sys.exit(97)


def p(path: str) -> str:
    """A target path under the fake root."""
    return ROOT + path if path.startswith("/") else path


def record() -> None:
    with open(os.path.join(ROOT, "standin-calls.jsonl"), "a") as fh:
        fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")


def fault(name: str) -> bool:
    """A fault a test injects: a file $ROOT/standin-faults/<name> exists."""
    return os.path.exists(os.path.join(ROOT, "standin-faults", name))


def read(path: str, default: str | None = None) -> str | None:
    try:
        with open(p(path)) as fh:
            return fh.read()
    except FileNotFoundError:
        return default


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(p(path)), exist_ok=True)
    with open(p(path), "w") as fh:
        fh.write(text)


def char_majors() -> dict:
    """The 'Character devices:' section of the fake /proc/devices: name -> major."""
    out, on = {}, False
    for ln in (read("/proc/devices", "") or "").splitlines():
        if ln.startswith("Character devices"):
            on = True
        elif ln.startswith("Block devices"):
            on = False
        elif on and ln.strip():
            num, name = ln.split(None, 1)
            out.setdefault(name.strip(), int(num))
    return out


def has_cap(bit: int) -> bool:
    """Whether the fake /proc/self/status gives this capability (what the process that runs the tool holds)."""
    import re

    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", read("/proc/self/status", "") or "", re.M)
    return m is None or bool(int(m.group(1), 16) >> bit & 1)


def load_module(name: str) -> bool:
    """`modprobe NAME` as PID 1 would: nvidia_uvm is added to /proc/devices and /proc/modules with the major in
    $ROOT/standin-modules/nvidia-uvm; False when there is no such module."""
    loadable = read("/standin-modules/" + name.replace("_", "-"))
    if loadable is None:
        return False
    if f" {name.replace('_', '-')}\n" not in (read("/proc/devices", "") or ""):
        write("/proc/devices", read("/proc/devices").replace(
            "Character devices:\n", f"Character devices:\n{int(loadable)} {name.replace('_', '-')}\n"))
        write("/proc/modules", (read("/proc/modules", "") or "") + f"{name} 1830912 - - Live 0x0 (O)\n")
    return True
