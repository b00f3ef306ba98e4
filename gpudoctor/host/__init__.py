"""The one I/O seam: only this package runs commands, reads files on the target or talks SSH.

Its names load on first use (PEP 562), so that gpudoctor.host.early can start a probe before anything else loads."""

__all__ = ["CommandResult", "FileRead", "Host", "StatResult"]


def __getattr__(name):
    if name in __all__:
        from gpudoctor.host import base

        return getattr(base, name)
    raise AttributeError(f"module 'gpudoctor.host' has no attribute {name!r}")
