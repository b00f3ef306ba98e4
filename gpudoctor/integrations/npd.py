"""Kubernetes node-problem-detector custom-plugin mode of the gate: exit 0 ok, 1 problem, 2 unknown; one line.

NPD (pkg/custompluginmonitor/plugin/plugin.go) takes the plugin's whole stdout, trims it, cuts it at
max_output_length *bytes* (80 by default) and reads the exit status: 0 OK, 1 NonOK, anything else Unknown. So the
line is the root cause first, with nothing before it (the condition's source already says "gpudoctor"), and it
fits 80 bytes of UTF-8 by itself: NPD never cuts it in the middle of a sentence or of a character.
"""

from __future__ import annotations

from gpudoctor.exitcodes import NPD_OK, NPD_PROBLEM, NPD_UNKNOWN  # noqa: F401 - the one table

MAX_BYTES = 80  # NPD's default max_output_length


def fit(text: str, tail: str = "", limit: int = MAX_BYTES) -> str:
    """`text` + `tail` on one line in at most `limit` UTF-8 bytes; `text` is shortened (with "…") when needed."""
    text = " ".join(str(text).split())
    if len((text + tail).encode()) <= limit:
        return text + tail
    room = limit - len(tail.encode()) - len("…".encode())
    cut = text.encode()[:max(room, 0)].decode("utf-8", "ignore").rstrip()
    return cut + "…" + tail


def verdict(result) -> tuple[int, str]:
    """(exit code, line) for a GateResult."""
    if result.error is not None:
        return NPD_UNKNOWN, fit(f"could not check: {result.error}")
    if result.passed:
        return NPD_OK, fit(f"ok (gpudoctor gate, profile {result.profile})")
    if all(b.status == "unknown" for b in result.blockers):
        return NPD_UNKNOWN, fit(f"could not probe: {result.headline}")
    more = len([b for b in result.blockers if not b.symptom_of]) - 1
    return NPD_PROBLEM, fit(result.headline, f" (+{more} more)" if more > 0 else "")


def error_verdict(error) -> tuple[int, str]:
    """(exit code, line) when the gate itself could not run (bad inventory, crash): a message, or a GpudoctorError
    whose file (an InputError's path:line) comes after the cause, by its base name."""
    if not isinstance(error, str) and getattr(error, "path", None):
        import os

        where = os.path.basename(str(error.path)) + (f":{error.line}" if getattr(error, "line", None) else "")
        return NPD_UNKNOWN, fit(" ".join(str(error.message).split()), f" ({where})")
    return NPD_UNKNOWN, fit(error if isinstance(error, str) else error.one_line())
