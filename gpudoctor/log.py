"""Logging through structlog, configured here and only here. JSON when stderr is not a TTY."""

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


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of the write (pytest and CliRunner swap it)."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(verbosity: int = 0, json_logs: bool | None = None) -> None:
    """Configure structlog once: level from -v count (-1 for -q), JSON lines when not on a TTY."""
    global _configured
    import structlog

    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)  # -1: -q
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
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
