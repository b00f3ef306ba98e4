"""A finding's evidence is never cut silently (#49): by default a row or root-cause block shows the first three lines
and one that counts the rest and says how to see them (`+4 more evidence lines (-a lists them)`); `check -a` and
`lxc audit -a` show every line; the daemon, which has no -a, points at `gpudoctor check -a`."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import Finding, Status
from gpudoctor.report import cause_block, daemon_cycle, render
from gpudoctor.term import Styled

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = [f"open(/dev/nvidia{i}) → EPERM" for i in range(7)]


def _findings():
    root = Finding("devices.node.major", Status.FAIL, "/dev/nvidia-uvm is 1:3", subject="/dev/nvidia-uvm",
                   evidence=["stat /dev/nvidia-uvm → 1:3"], layer="devices")
    other = Finding("boundary.container.device_rules", Status.FAIL, "the container denies 7 nodes", layer="boundary",
                    evidence=list(EVIDENCE))
    return root, other


def _render(**kw) -> list[str]:
    root, other = _findings()
    buf = io.StringIO()
    render(Diagnosis("h1", [root, other], [root], [root.key]), Styled(buf, width=None, color=False), **kw)
    return buf.getvalue().splitlines()


def test_a_bad_rows_evidence_past_three_lines_is_counted_and_minus_a_lists_it_all():
    out = _render()
    i = next(n for n, ln in enumerate(out) if "boundary.container.device_rules" in ln)
    assert [ln.strip() for ln in out[i + 1:i + 5]] == [*EVIDENCE[:3], "+4 more evidence lines (-a lists them)"]
    assert EVIDENCE[3] not in "\n".join(out)
    verbose = _render(verbose=True)
    i = next(n for n, ln in enumerate(verbose) if "boundary.container.device_rules" in ln)
    assert [ln.strip() for ln in verbose[i + 1:i + 8]] == EVIDENCE and "more evidence lines" not in "\n".join(verbose)


def test_a_cause_block_counts_what_it_leaves_out_and_the_daemon_points_at_check():
    _, other = _findings()
    buf = io.StringIO()
    cause_block(Styled(buf, width=None, color=False), other, ("FAIL", ""))
    lines = buf.getvalue().splitlines()
    assert lines[1:] == [*(f"    evidence: {e}" for e in EVIDENCE[:3]),
                         "    evidence: +4 more evidence lines (-a lists them)"]
    buf = io.StringIO()
    daemon_cycle(Styled(buf, width=None, color=False), {"ct200": {"verdict": "fail", "root_causes": [other]}})
    assert "      evidence: +4 more evidence lines (`gpudoctor check -a` lists them)" in buf.getvalue().splitlines()


def test_check_minus_a_shows_every_evidence_line_of_a_snapshot():
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "--snapshot",
                        str(ROOT / "examples/h200-uvm-blocked.json"), "-a"], capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    i = next(n for n, ln in enumerate(lines) if "boundary.container.device_rules" in ln)
    shown = [ln.strip() for ln in lines[i + 1:i + 8]]
    assert shown[0].startswith("platform: ") and shown[1:] == [
        f"open({p}) → OK" for p in ("/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-uvm",
                                    "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl")], r.stdout
