"""The (major, minor) each NVIDIA device node must have on this kernel, from /proc/devices: the one rule the device
checks, the container, CDI and systemd boundaries and the device-node remedy judge a node by."""

from __future__ import annotations

import re


def expected_numbers(path: str, live: dict) -> tuple[int | None, int | None, str]:
    """The (major, minor) a node must have on this kernel, and the /proc/devices name it comes from."""
    front = next((live[n] for n in ("nvidia-frontend", "nvidia", "nvidiactl") if n in live), 195)
    name = path.rsplit("/", 1)[-1]
    if name == "nvidiactl":
        return front, 255, "nvidia"
    if name == "nvidia-modeset":
        return front, 254, "nvidia"
    if m := re.match(r"^nvidia(\d+)$", name):
        return front, int(m.group(1)), "nvidia"
    if name in ("nvidia-uvm", "nvidia-uvm-tools"):
        return live.get("nvidia-uvm"), 0 if name == "nvidia-uvm" else 1, "nvidia-uvm"
    if m := re.match(r"^nvidia-cap(\d+)$", name):
        return live.get("nvidia-caps"), int(m.group(1)), "nvidia-caps"
    if m := re.match(r"^nvidia-nvswitch(\d+)$", name):
        return live.get("nvidia-nvswitch"), int(m.group(1)), "nvidia-nvswitch"
    return None, None, ""
