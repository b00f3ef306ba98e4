"""The one I/O seam: only this package runs commands, reads files on the target or talks SSH."""

from gpudoctor.host.base import CommandResult, FileRead, Host, StatResult

__all__ = ["CommandResult", "FileRead", "Host", "StatResult"]
