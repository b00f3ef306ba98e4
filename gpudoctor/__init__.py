"""gpudoctor: keeps GPU inference hosts healthy."""

__version__ = "0.1.0"
