"""Pure checks over Facts, one module per subsystem; importing a module registers its checks."""

from gpudoctor.checks import workload_model  # noqa: F401
