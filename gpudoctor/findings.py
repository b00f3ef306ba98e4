"""Findings: what a check concluded, with evidence a human can verify."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"  # could not probe: never "healthy", never "broken"
    INFO = "info"  # the platform does not report this (e.g. numa_node -1 in a VM)

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


# Worst first: fail > unknown > warn > ok (info counts as ok).
_RANK = {Status.FAIL: 4, Status.UNKNOWN: 3, Status.WARN: 2, Status.OK: 1, Status.INFO: 0}
_EXIT = {Status.FAIL: EXIT_FAIL, Status.UNKNOWN: EXIT_UNKNOWN, Status.WARN: EXIT_WARN,
         Status.OK: EXIT_OK, Status.INFO: EXIT_OK}

# Layers bottom-up; a failure blocks the layers above it.
LAYERS = ("host", "driver", "devices", "boundary", "cuda", "fabric", "workload")


def worst(statuses) -> Status:
    """The worst status of an iterable (ok when empty)."""
    out = Status.INFO
    for s in statuses:
        s = Status(s)
        if _RANK[s] > _RANK[out]:
            out = s
    return Status.OK if out == Status.INFO else out


def exit_code(status: Status | str) -> int:
    """Nagios exit code for a verdict."""
    return _EXIT[Status(status)]


@dataclass
class Finding:
    """One conclusion of one check about one subject."""

    id: str  # stable dotted id, e.g. "devices.node.major"
    status: Status
    summary: str  # one line a human reads first
    layer: str = ""
    subject: str | None = None  # the node, GPU or file the finding is about
    evidence: list[str] = field(default_factory=list)  # command/path, value, expected
    hint: str | None = None  # what to do
    remedy: str | None = None  # the remedy its check declares (@check(remedy=)), set by checkreg.findings_of
    blocked_by: str | None = None  # key of the finding this one is a symptom of
    data: dict = field(default_factory=dict)  # machine-readable details
    remediable: bool = field(default=True, repr=False)  # False: this instance is not for the check's remedy
    # What can explain THIS finding's evidence: patterns "ID" or "ID@SUBJECT" (fnmatch) of the findings it may be a
    # symptom of. None: the check's declared depends_on; (): nothing, it is its own cause (a missing tool or library).
    # Not serialised: the diagnosis resolves it into blocked_by.
    explained_by: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if not self.layer:
            self.layer = self.id.split(".", 1)[0]

    @property
    def key(self) -> str:
        """Unique key within a run: id plus subject."""
        return f"{self.id}[{self.subject}]" if self.subject else self.id

    @property
    def bad(self) -> bool:
        return self.status in (Status.FAIL, Status.WARN, Status.UNKNOWN)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("remediable")
        d.pop("explained_by", None)
        d["status"] = self.status.value
        d["key"] = self.key
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Finding":
        d = {k: v for k, v in d.items() if k != "key"}
        return cls(**d)
