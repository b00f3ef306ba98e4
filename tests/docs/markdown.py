"""The one extractor of the examples in README.md and docs/*.md (tests/docs/test_examples.py runs what it finds).

A fenced block that holds a line starting with `$ gpudoctor ` is an example: each `$ gpudoctor …` line (a trailing
`# comment` and `\\` continuations allowed) is a command, the lines after it up to the next `$ ` line are its output,
and `$ echo $?` followed by a number is the exit code of the command before it. A block shows ALL of a command's
output unless it ends with a `...` line (the rest is left out); see `mismatch` for `...` and `…` inside.

A marker, an HTML comment on the line right before the fence, for output that no command here can give as shown:

- `<!-- replay: FILE -->`: the commands ran on a live host (`--host NAME`, or this machine). Each runs here with
  `--snapshot FILE` (a committed capture, examples/ or tests/fixtures/) in place of `--host NAME`, and the headline's
  timing ("in 0.21 s" live, "(recorded in …; replayed in …)" from a snapshot) compares as one.

README.md's tables of captures are examples too (`table_rows`): each row that names a snapshot gives its verdict,
and the check ids it names in backquotes.

The normaliser (`norm`), the only thing that may differ between a doc and the output: durations ("0.17 s",
"12 ms" → "<t> s", "<t> ms"), the replay headline's timing, and the temporary directory of a run (`$TMP`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNAPSHOT_DIRS = [ROOT / "examples", ROOT / "tests" / "fixtures" / "snapshots"]

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"^<!-- (replay): (\S+) -->$")
_TIME = re.compile(r"\b\d+(?:\.\d+)? (s|ms)\b")
# "gpudoctor check ct200: FAIL (exit 2) in <t> s" live, "… (recorded in <t> s; replayed in <t> s)" from a snapshot
_HEADLINE_TIME = re.compile(r" (?:in <t> s|\(recorded in <t> s; replayed in <t> s\))$")
ELLIPSIS = ("...", "…")


@dataclass
class Command:
    cmd: str                      # as written after "$ ", continuations joined
    expected: list[str]           # the output lines the doc shows
    rc: int | None = None         # from a following `$ echo $?`


@dataclass
class Example:
    doc: Path
    line: int                     # of the block's first line inside the fence
    commands: list[Command] = field(default_factory=list)
    marker: tuple[str, str] | None = None   # ("replay", FILE)
    body: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _marker(text: str, start: int) -> tuple[str, str] | None:
    before = text[:start].rstrip("\n").rsplit("\n", 1)[-1].strip()
    m = _MARKER.match(before)
    return (m.group(1), m.group(2)) if m else None


def blocks(doc: Path):
    """(line, info string, lines, marker) of every fenced block of `doc`."""
    text = doc.read_text()
    for m in _FENCE.finditer(text):
        yield text[:m.start()].count("\n") + 2, m.group(1).strip(), m.group(2).splitlines(), _marker(text, m.start())


def parse(lines: list[str]) -> list[Command]:
    """The commands of one block and the output each shows (see the module's docstring)."""
    out: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ echo $?"):
            assert out, "`$ echo $?` before any command"
            out[-1].rc = int(lines[i + 1].strip())
            i += 2
            continue
        if line.startswith("$ "):
            cmd, i = line[2:], i + 1
            while cmd.rstrip().endswith("\\") and i < len(lines):
                cmd, i = cmd.rstrip()[:-1] + " " + lines[i].strip(), i + 1
            out.append(Command(cmd, []))
            continue
        if out:
            out[-1].expected.append(line)
        i += 1
    return out


def examples(docs=None) -> list[Example]:
    """Every block with a `$ gpudoctor` command."""
    found = []
    for doc in docs or DOCS:
        for line, _info, lines, marker in blocks(doc):
            if any(ln.startswith("$ gpudoctor ") for ln in lines):
                found.append(Example(doc, line, parse(lines), marker, lines))
    return found


# Lines only gpudoctor prints: a fenced block holding one is output, and must be an example or a capture.
_OUTPUT_LINE = re.compile(r"^(gpudoctor(: | \w+ \S+: (ok|WARN|FAIL|UNKNOWN)\b)|Root cause \S+: |BLOCK \S+: |"
                          r"verdict: (valid|invalid)|(ok|WARN|FAIL|UNKNOWN) \S+: )")


def unrun_output(docs=None) -> list[str]:
    """Blocks that show gpudoctor's output but are neither run nor marked (doc:line: the line)."""
    bad = []
    for doc in docs or DOCS:
        for line, info, lines, marker in blocks(doc):
            if marker or any(ln.startswith("$ gpudoctor ") for ln in lines) or info not in ("", "text", "console"):
                continue
            hit = next((ln for ln in lines if _OUTPUT_LINE.match(ln)), None)
            if hit:
                bad.append(f"{doc.relative_to(ROOT)}:{line}: {hit[:100]}")
    return bad


def norm(line: str, tmp: str | None = None) -> str:
    line = line.rstrip()
    if tmp:
        line = line.replace(tmp, "$TMP")
    line = _TIME.sub(r"<t> \1", line)
    return _HEADLINE_TIME.sub(" <timing>", line)


def mismatch(expected: list[str], got: list[str], tmp: str | None = None) -> str | None:
    """None when `got` is what `expected` shows, else the first difference.

    Line by line after `norm`; a line that is just `...` (or `…`) skips output lines up to the one matching the next
    expected line, and, last in a block, all the rest; a line ending in `...` or `…` is a prefix. Without a final
    `...` the output must end where the doc ends."""
    j = 0
    skipping = False
    for n, want in enumerate(expected, 1):
        w = norm(want)
        if w.strip() in ELLIPSIS:
            skipping = True
            continue
        prefix = w.endswith(ELLIPSIS)
        if prefix:
            w = w[:-3] if w.endswith("...") else w[:-1]

        def ok(line: str) -> bool:
            g = norm(line, tmp)
            return g.startswith(w) if prefix else g == w

        while skipping and j < len(got) and not ok(got[j]):
            j += 1
        skipping = False
        if j >= len(got):
            return f"doc line {n} {want!r}: the output ended"
        if not ok(got[j]):
            return f"doc line {n}:\n  doc:    {want!r}\n  output: {got[j]!r}"
        j += 1
    rest = [g for g in got[j:] if g.strip()]
    if rest and not skipping:
        return f"the output goes on after the doc's last line (end the block with `...` if that is meant):\n" \
               f"  output: {rest[0]!r}"
    return None


def replayed(cmd: str, snapshot: str) -> str:
    """`cmd` run on the capture: `--host NAME` replaced by `--snapshot FILE` (added where no host is named)."""
    new, n = re.subn(r"--host[ =]\S+", f"--snapshot {snapshot}", cmd)
    if n:
        return new
    head, sep, comment = cmd.partition(" #")
    return f"{head.rstrip()} --snapshot {snapshot}" + (f"  #{comment}" if sep else "")


# README.md's tables of real captures: | … `snap.json` … | verdict |
CODES = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
_CHECK_ID = re.compile(r"`((?:host|driver|devices|boundary|cuda|fabric|workload|bench|model)\.[\w.]+(?:\[[^\]`]+\])?)`")


@dataclass
class Row:
    line: int
    snapshot: str
    code: int
    root_cause: str | None        # the check id after "root cause" in the verdict, if it names one
    ids: list[str]                # every check id the verdict names in backquotes

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.snapshot}"


def table_rows(doc: Path = ROOT / "README.md") -> list[Row]:
    out = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        snap = next((m for c in cells[:2] for m in re.findall(r"`([\w.-]+\.json)`", c)), None)
        if snap is None:
            continue
        verdict = cells[-1].split("today's code:", 1)[-1]
        word = re.search(r"\b(ok|warn|fail|unknown)\b", verdict.replace("*", "").split(";")[0].lower())
        if not word:
            continue
        rc = re.search(r"root cause `([^`]+)`", verdict)
        out.append(Row(n, snap, CODES[word.group(1)], rc.group(1) if rc else None, _CHECK_ID.findall(verdict)))
    return out


def snapshot_path(name: str) -> Path | None:
    return next((d / name for d in SNAPSHOT_DIRS if (d / name).is_file()), None)
