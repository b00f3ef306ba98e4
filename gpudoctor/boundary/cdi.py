"""CDI (Container Device Interface) specs: parse them (YAML or JSON, every released cdiVersion), locate each device node
entry to its line, audit its major:minor against the live /proc/devices and the node on disk, and plan the exact edit.

A spec is `{cdiVersion, kind, devices: [{name, containerEdits}], containerEdits}`; `containerEdits.deviceNodes[]` has
`path` (in the container), optional `hostPath`, `type`, `major`, `minor`, `fileMode`, `permissions`, `uid`, `gid`
(cncf-tags/container-device-interface SPEC.md). When `major`/`minor` are given the runtime uses them as written: it
makes the node with them and allows exactly them in the container's device cgroup — a number that no longer matches the
kernel is a container whose uvm node is dead (NVIDIA/nvidia-container-toolkit#1934: 510 written, 509 live → cuInit
999). When they are left out the runtime stats the host node when the container is created.

Pure: texts in, results out. The positions come from PyYAML's composer (JSON is read the same way, tabs blanked to
spaces so every offset stays put), so an edit replaces only the digits of one scalar and keeps everything else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from gpudoctor.boundary.nodes import expected_numbers

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # the spec's default directories; /var/run/cdi wins on a conflict
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
# Released spec versions (SPEC.md "Released versions"); a newer one is read, with a warning.
KNOWN_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
MAX_BYTES = 4 << 20


class SpecError(ValueError):
    """A spec that cannot be read as CDI; `line` is 1-based when known."""

    def __init__(self, msg: str, line: int | None = None):
        super().__init__(msg)
        self.line = line


@dataclass
class NodeEntry:
    """One containerEdits.deviceNodes[] entry of one spec."""

    spec: str  # the spec file
    where: str  # e.g. devices[all].containerEdits.deviceNodes[0] or containerEdits.deviceNodes[2]
    line: int  # 1-based line of the entry
    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    spans: dict = field(default_factory=dict)  # "major"/"minor" -> (start, end) offsets of the scalar in the text

    @property
    def node(self) -> str:
        """The host node the runtime stats when the numbers are not given."""
        return self.host_path or self.path

    def to_json(self) -> dict:
        return {"spec": self.spec, "where": self.where, "line": self.line, "path": self.path,
                "host_path": self.host_path, "type": self.type, "major": self.major, "minor": self.minor}


@dataclass
class Spec:
    path: str
    version: str | None
    kind: str | None
    devices: list[str]
    entries: list[NodeEntry]
    fmt: str  # yaml | json

    @property
    def version_known(self) -> bool:
        return self.version in KNOWN_VERSIONS


def _map(node) -> dict:
    """A composed mapping node → {key: value node} (later keys win, as a loader would)."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def _int(node, what: str) -> int | None:
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
        return None
    if not isinstance(node, yaml.ScalarNode) or not re.fullmatch(r"[0-9]+", node.value.strip()):
        raise SpecError(f"{what} must be a non-negative integer, not {getattr(node, 'value', node)!r}",
                        node.start_mark.line + 1)
    return int(node.value)


def _str(node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) and not node.tag.endswith(":null") else None


def _entries(path: str, edits, where: str) -> list[NodeEntry]:
    out = []
    dn = _map(edits).get("deviceNodes")
    if dn is None:
        return out
    if not isinstance(dn, yaml.SequenceNode):
        raise SpecError(f"{where}.deviceNodes must be a list", dn.start_mark.line + 1)
    for i, item in enumerate(dn.value):
        m = _map(item)
        w = f"{where}.deviceNodes[{i}]"
        p = _str(m.get("path"))
        if not p:
            raise SpecError(f"{w} has no path", item.start_mark.line + 1)
        e = NodeEntry(path, w, item.start_mark.line + 1, p, _str(m.get("hostPath")), _str(m.get("type")),
                      _int(m.get("major"), f"{w}.major"), _int(m.get("minor"), f"{w}.minor"))
        for k in ("major", "minor"):
            n = m.get(k)
            if isinstance(n, yaml.ScalarNode) and getattr(e, k) is not None:
                e.spans[k] = (n.start_mark.index, n.end_mark.index)
        out.append(e)
    return out


def parse(path: str, text: str) -> Spec:
    """A spec file's text → Spec. SpecError (with a line) when it is not valid YAML/JSON or not shaped like CDI."""
    fmt = "json" if path.endswith(".json") else "yaml"
    if fmt == "json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON: {exc.msg}", exc.lineno) from None
    try:
        root = yaml.compose(text.replace("\t", " ") if fmt == "json" else text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        if exc.context_mark is not None and (mark is None or mark.index >= len(text.rstrip())):
            mark = exc.context_mark  # "got <stream end>": where the unclosed thing began says more
        raise SpecError(f"not valid YAML: {exc.problem or exc.context}", mark.line + 1 if mark else None) from None
    if not isinstance(root, yaml.MappingNode):
        raise SpecError("a CDI spec is a mapping with cdiVersion, kind and devices", 1)
    top = _map(root)
    version, kind = _str(top.get("cdiVersion")), _str(top.get("kind"))
    if not version:
        raise SpecError("no cdiVersion", 1)
    if not kind or "/" not in kind:
        raise SpecError(f"kind must be vendor/class, not {kind!r}", (top["kind"].start_mark.line + 1) if "kind" in top else 1)
    entries: list[NodeEntry] = []
    names: list[str] = []
    devs = top.get("devices")
    if devs is not None and not isinstance(devs, yaml.SequenceNode):
        raise SpecError("devices must be a list", devs.start_mark.line + 1)
    for i, d in enumerate(devs.value if devs is not None else []):
        m = _map(d)
        name = _str(m.get("name")) or str(i)
        names.append(name)
        entries += _entries(path, m.get("containerEdits"), f"devices[{name}].containerEdits")
    entries += _entries(path, top.get("containerEdits"), "containerEdits")
    return Spec(path, version, kind, names, entries, fmt)


def edited(text: str, changes: list[tuple[NodeEntry, str, int]]) -> str:
    """The text with each (entry, "major"|"minor", value) scalar replaced by value; nothing else changes."""
    spans = sorted(((e.spans[k], v) for e, k, v in changes), key=lambda s: s[0][0], reverse=True)
    for (start, end), v in spans:
        text = text[:start] + str(v) + text[end:]
    return text


# --- the audit ------------------------------------------------------------------------------------------------


@dataclass
class Stale:
    """One entry that gives containers a node the kernel no longer answers for."""

    entry: NodeEntry
    source: str  # the /proc/devices name (nvidia-uvm)
    have: str  # major:minor the entry (or the host node) gives
    want: str  # live major:minor
    by: str  # "spec" (numbers written in the spec) | "node" (the host node the runtime would stat)
    fix: tuple[tuple[str, int], ...] = ()  # ("major", 509) … edits that make the spec right

    def to_json(self) -> dict:
        return {"entry": self.entry.to_json(), "source": self.source, "have": self.have, "want": self.want,
                "by": self.by, "fix": [list(f) for f in self.fix]}


def audit(specs: list[Spec], live: dict, host_nodes: dict) -> tuple[list[Stale], list[NodeEntry], list[tuple]]:
    """(stale entries, entries that are right, (entry, note) pairs). live: /proc/devices char names → major; host_nodes: path →
    StatResult JSON of each entry's host node."""
    stale: list[Stale] = []
    good: list[NodeEntry] = []
    notes: list[tuple] = []
    for s in specs:
        for e in s.entries:
            want_major, want_minor, source = expected_numbers(e.path, live)
            if not source:
                want_major, want_minor, source = expected_numbers(e.node, live)
            if not source:
                continue  # not an NVIDIA node: not ours to judge
            if want_major is None:
                notes.append((e, f"{e.spec} {e.where}: {e.path} — /proc/devices has no {source}"))
                continue
            want = f"{want_major}:{want_minor}"
            if e.major is not None:
                have = f"{e.major}:{e.minor if e.minor is not None else '?'}"
                fix = tuple((k, v) for k, v, cur in (("major", want_major, e.major), ("minor", want_minor, e.minor))
                            if cur is not None and cur != v)
                if fix:
                    stale.append(Stale(e, source, have, want, "spec", fix))
                else:
                    good.append(e)
                continue
            st = host_nodes.get(e.node)
            if st is None:
                continue  # not stat'ed: nothing to judge it by
            if not st.get("exists") or st.get("kind") != "char":
                stale.append(Stale(e, source, "missing" if not st.get("exists") else st.get("kind") or "?", want, "node"))
            elif (st.get("major"), st.get("minor")) != (want_major, want_minor):
                stale.append(Stale(e, source, f"{st.get('major')}:{st.get('minor')}", want, "node"))
            else:
                good.append(e)
    return stale, good, notes
