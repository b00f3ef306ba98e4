"""One small error tree; the CLI turns each into one line and an exit code, never a traceback."""

from __future__ import annotations

# Exit codes follow Nagios: 0 ok, 1 warn, 2 fail/critical, 3 unknown or bad input.
EXIT_OK, EXIT_WARN, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2, 3


class GpudoctorError(Exception):
    """Base of every error gpudoctor raises on purpose."""

    exit_code = EXIT_UNKNOWN

    def one_line(self) -> str:
        return " ".join(str(self).split()) or type(self).__name__


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
        return where + " ".join(self.message.split())


def _printable(s: str) -> str:
    """A path as one line: control characters (a newline in a hostile name) escaped as Python would."""
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


class InventoryError(InputError):
    """The inventory file is malformed or names something that does not exist."""


class ConfigError(InputError):
    """A configuration file (Proxmox config, campaign, policy) is malformed."""


class HostError(GpudoctorError):
    """The target host could not be used."""


class HostUnreachable(HostError):
    """The transport failed: connection refused, reset, DNS, ssh rc 255."""


class HostKeyError(HostError):
    """The SSH host key is unknown or changed; nothing was run."""


class CommandTimeout(HostError):
    """A command or read did not answer within its deadline."""

    def __init__(self, what: str, seconds: float):
        self.what, self.seconds = what, seconds
        super().__init__(f"{what} did not answer in {seconds:g} s")


class RemedyError(GpudoctorError):
    """A remedy refused to act or failed; the message says why."""

    exit_code = EXIT_FAIL


class LockHeld(RemedyError):
    """Another gpudoctor run holds the per-host lock."""
