"""Pure checks over Facts, one module per subsystem. Importing this package registers them all."""

import importlib

_MODULES = ["host", "driver", "devices", "boundary", "cdi", "container", "systemd_unit", "kubernetes", "cuda", "fabric", "bandwidth", "workload", "workload_model", "workload_hygiene"]

for _m in _MODULES:
    try:
        importlib.import_module(f"{__name__}.{_m}")
    except ModuleNotFoundError as _exc:  # a subsystem not present in this build
        if _exc.name != f"{__name__}.{_m}":
            raise
