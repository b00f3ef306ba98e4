"""Logging through structlog, configured here and only here. To a person (a terminal, a pipe, a file): one plain line
per event, `gpudoctor: warning: daemon.host_unreachable host=ct200 error="…"`. JSON lines only where asked
(GPUDOCTOR_LOG_FORMAT=json: the systemd units ask, for the journal's readers). A value that is a script (a probe's
`python -c` source) shows its first line and its length, never the whole script (docs/cli.md)."""

from __future__ import annotations

import logging
import sys

_configured = False
_settings: dict = {"verbosity": 0, "json_logs": None}


def set_defaults(verbosity: int = 0, json_logs: bool | None = None) -> None:
    """Remember the CLI's choices; structlog itself is imported only when something logs (keeps start-up fast)."""
    _settings.update(verbosity=verbosity, json_logs=json_logs)


def command_finished(argv, rc, seconds) -> None:
    """-vv: every command a local host runs, logged when it finishes (host/local.py calls this; log imports nothing)."""
    if _settings["verbosity"] >= 2:
        get_logger("gpudoctor.host").debug("command.finished", argv=argv, rc=rc, seconds=seconds)


SCRIPT_SHOWN = 120  # a longer or multi-line value (a probe script) is shown as its first line and its length


def _short(v):
    if isinstance(v, str) and ("\n" in v or len(v) > SCRIPT_SHOWN):
        first = v.strip().split("\n", 1)[0][:SCRIPT_SHOWN]
        return f"{first} … ({len(v)} characters)"
    if isinstance(v, (list, tuple)):
        return [_short(x) for x in v]
    return v


def _shorten(_logger, _name, event: dict) -> dict:
    return {k: (v if k == "event" else _short(v)) for k, v in event.items()}


def _person(_logger, _name, event: dict) -> str:
    """One plain line for a person: `gpudoctor: LEVEL: EVENT key=value …` (escaped: values may come from a host)."""
    import json

    from gpudoctor.term import printable

    event = dict(event)
    event.pop("timestamp", None)
    level, what = event.pop("level", "info"), event.pop("event", "")
    parts = [f"{k}={v if isinstance(v, (int, float)) or (isinstance(v, str) and v and ' ' not in v and '=' not in v) else json.dumps(v, default=str, ensure_ascii=False)}"
             for k, v in event.items()]
    return printable(" ".join([f"gpudoctor: {level}: {what}", *parts]))


def json_wanted() -> bool:
    import os

    return os.environ.get("GPUDOCTOR_LOG_FORMAT", "").lower() == "json"


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of the write (pytest and CliRunner swap it)."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(verbosity: int = 0, json_logs: bool | None = None) -> None:
    """Configure structlog once: level from -v count (-1 for -q); plain lines, JSON where asked (json_wanted)."""
    global _configured
    import structlog

    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)  # -1: -q
    if json_logs is None:
        json_logs = json_wanted()
    renderer = structlog.processors.JSONRenderer() if json_logs else _person
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _shorten,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str = "gpudoctor", **ctx):
    """A bound logger; configures a quiet default on first use."""
    import structlog

    if not _configured:
        configure(**_settings)
    return structlog.get_logger(name).bind(**ctx)


def enabled(verbosity: int = 1) -> bool:
    """Whether the CLI asked for at least this much detail (checked without importing structlog)."""
    return _configured or _settings["verbosity"] >= verbosity
