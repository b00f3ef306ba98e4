"""Host device majors (/proc/devices) and which NVIDIA driver each /dev/nvidia* node belongs to."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Major 195 is fixed for /dev/nvidiaN (minor N), nvidiactl (255) and nvidia-modeset (254).
NVIDIA_MAJOR = 195
# Names /proc/devices uses for major 195 across driver generations (proprietary and open modules).
NVIDIA_195_NAMES = ("nvidia", "nvidiactl", "nvidia-frontend")
# Every char driver name that is NVIDIA's; a rule for one of these majors is a GPU rule.
NVIDIA_DRIVERS = frozenset({*NVIDIA_195_NAMES, "nvidia-uvm", "nvidia-caps", "nvidia-caps-imex-channels",
                            "nvidia-nvswitch", "nvidia-nvlink", "nvidia-modeset"})


def is_dynamic_major(major: int) -> bool:
    """The kernel hands dynamic char majors from 254 down to 234, then 511 down to 384."""
    return 234 <= major <= 254 or 384 <= major <= 511


@dataclass
class ProcDevices:
    """The `Character devices:` section of /proc/devices: major -> names and name -> major."""

    char: dict[int, list[str]] = field(default_factory=dict)
    text_ok: bool = True

    @classmethod
    def parse(cls, text: str | None) -> "ProcDevices":
        out = cls(text_ok=bool(text))
        section = None
        for line in (text or "").splitlines():
            s = line.strip()
            if s.startswith("Character devices"):
                section = "char"
            elif s.startswith("Block devices"):
                section = "block"
            elif section == "char" and (m := re.match(r"^(\d+)\s+(\S.*)$", s)):
                out.char.setdefault(int(m.group(1)), []).append(m.group(2).strip())
        out.text_ok = bool(out.char)
        return out

    def major(self, name: str) -> int | None:
        for major, names in self.char.items():
            if name in names:
                return major
        return None

    def names(self, major: int) -> list[str]:
        return self.char.get(major, [])

    def holder(self, major: int) -> str:
        """Who holds a major now, for evidence: 'nvidia-uvm', 'hidraw', or 'nothing'."""
        names = self.names(major)
        return "/".join(names) if names else "nothing"

    @property
    def nvidia_loaded(self) -> bool:
        """Some NVIDIA driver has registered a char device (nvidia, nvidia-uvm, nvidia-caps, …): without one, the
        node's NVIDIA majors are unknown and nothing NVIDIA works there."""
        return any(n in NVIDIA_DRIVERS for names in self.char.values() for n in names)

    def is_nvidia(self, major: int) -> bool:
        return major == NVIDIA_MAJOR or any(n in NVIDIA_DRIVERS for n in self.names(major))


@dataclass(frozen=True)
class NodeKind:
    """What a /dev/nvidia* path is: its driver (the /proc/devices name) and minor (None: a whole directory)."""

    path: str
    driver: str  # "nvidia" for the major-195 family, else the /proc/devices name
    minor: int | None

    @property
    def critical(self) -> bool:
        """CUDA cannot run without it: /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-uvm (not -tools, not modeset)."""
        if self.driver == "nvidia":
            return self.minor != 254
        return self.driver == "nvidia-uvm" and self.minor == 0

    def live_major(self, procdev: ProcDevices) -> int | None:
        if self.driver == "nvidia":
            return NVIDIA_MAJOR
        return procdev.major(self.driver)


_NODE_PATTERNS = [
    (re.compile(r"^/dev/nvidia(\d+)$"), "nvidia", lambda m: int(m.group(1))),
    (re.compile(r"^/dev/nvidiactl$"), "nvidia", lambda m: 255),
    (re.compile(r"^/dev/nvidia-modeset$"), "nvidia", lambda m: 254),
    (re.compile(r"^/dev/nvidia-uvm$"), "nvidia-uvm", lambda m: 0),
    (re.compile(r"^/dev/nvidia-uvm-tools$"), "nvidia-uvm", lambda m: 1),
    (re.compile(r"^/dev/nvidia-caps/?$"), "nvidia-caps", lambda m: None),
    (re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$"), "nvidia-caps", lambda m: int(m.group(1))),
    (re.compile(r"^/dev/nvidia-caps-imex-channels/?$"), "nvidia-caps-imex-channels", lambda m: None),
    (re.compile(r"^/dev/nvidia-caps-imex-channels/channel(\d+)$"), "nvidia-caps-imex-channels",
     lambda m: int(m.group(1))),
    (re.compile(r"^/dev/nvidia-nvswitch(\d+)$"), "nvidia-nvswitch", lambda m: int(m.group(1))),
    (re.compile(r"^/dev/nvidia-nvswitchctl$"), "nvidia-nvswitch", lambda m: 255),
    (re.compile(r"^/dev/nvidia-nvlink$"), "nvidia-nvlink", lambda m: None),
]


def classify_node(path: str) -> NodeKind | None:
    """The NVIDIA node a host path names, or None when it is not one (e.g. /dev/dri)."""
    p = re.sub(r"/+", "/", path.strip())
    for rx, driver, minor in _NODE_PATTERNS:
        m = rx.match(p)
        if m:
            return NodeKind(p.rstrip("/"), driver, minor(m))
    return None
