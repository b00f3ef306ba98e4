"""Kubernetes node-problem-detector custom-plugin mode of the gate: exit 0 ok, 1 problem, 2 unknown; one line.

NPD takes the plugin's first stdout line as the condition message (and cuts it at max_output_length, 80 by
default), so the line leads with the root cause.
"""

from __future__ import annotations

NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
MAX_LINE = 200


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def verdict(result) -> tuple[int, str]:
    """(exit code, line) for a GateResult."""
    if result.error is not None:
        return NPD_UNKNOWN, _one_line(f"gpudoctor: could not check: {result.error}")
    if result.passed:
        return NPD_OK, _one_line(f"gpudoctor: ok (profile {result.profile})")
    if all(b.status == "unknown" for b in result.blockers):
        return NPD_UNKNOWN, _one_line(f"gpudoctor: could not probe: {result.headline}")
    more = len([b for b in result.blockers if not b.symptom_of]) - 1
    tail = f" (+{more} more)" if more > 0 else ""
    return NPD_PROBLEM, _one_line(f"gpudoctor: {result.headline}{tail}")


def error_verdict(message: str) -> tuple[int, str]:
    """(exit code, line) when the gate itself could not run (bad inventory, crash)."""
    return NPD_UNKNOWN, _one_line(f"gpudoctor: {message}")
