"""One small error tree; the CLI turns each into one line and an exit code, never a traceback."""

from __future__ import annotations

# Exit codes follow Nagios (0 ok, 1 warn, 2 fail/critical, 3 unknown or bad input): the table is exitcodes.py's,
# handed on here for the modules that import them with the errors.
from gpudoctor.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN  # noqa: F401 - re-exported


class GpudoctorError(Exception):
    """Base of every error gpudoctor raises on purpose."""

    exit_code = EXIT_UNKNOWN

    def one_line(self) -> str:
        return _short(_printable(" ".join(str(self).split()))) or type(self).__name__


class InputError(GpudoctorError):
    """Bad input from the user: a file, a flag, a campaign. Carries file:line when known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.message, self.path, self.line = message, path, line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path:
            path = _printable(str(self.path))
            where = f"{path}:{self.line}: " if self.line else f"{path}: "
        return _short(where + _printable(" ".join(self.message.split())))


MAX_WORD, MAX_LINE = 160, 600


def _printable(s: str) -> str:
    """One line: every control character (a newline or ESC in a hostile name) escaped (gpudoctor.term's rule)."""
    from gpudoctor.term import printable

    return printable(s)


def _short(line: str) -> str:
    """An error never echoes a huge value whole: a long run is cut with a count, the whole line is capped."""
    import re

    def cut(m: re.Match) -> str:
        w = m.group()
        return f"{w[:MAX_WORD // 2]}…({len(w) - MAX_WORD // 2} more characters)"

    line = re.sub(r"\S{%d,}" % (MAX_WORD + 1), cut, line)
    if len(line) > MAX_LINE:
        line = f"{line[:MAX_LINE]}… ({len(line) - MAX_LINE} more characters)"
    return line


class InventoryError(InputError):
    """The inventory file is malformed or names something that does not exist."""


class ConfigError(InputError):
    """A configuration file (Proxmox config, campaign, policy) is malformed."""


class HostError(GpudoctorError):
    """The target host could not be used."""


class HostUnreachable(HostError):
    """The transport failed: connection refused, reset, DNS, ssh rc 255."""


class LoginRefused(HostUnreachable):
    """The server refused the login (authentication failed); host/sshd_limits.py does not repeat it at once."""


class HostKeyError(HostError):
    """The SSH host key is unknown or changed; nothing was run."""


class CommandTimeout(HostError):
    """A command or read did not answer within its deadline."""

    def __init__(self, what: str, seconds: float):
        self.what, self.seconds = what, seconds
        super().__init__(f"{what} did not answer in {seconds:g} s")


class CannotJudge(GpudoctorError):
    """Nothing in the input let any check decide anything: exit 3, never "ok" or "nothing to fix"."""


class RemedyError(GpudoctorError):
    """A remedy refused to act or failed; the message says why."""

    exit_code = EXIT_FAIL


class LockHeld(RemedyError):
    """Another gpudoctor run holds the per-host lock."""
