# The fake Proxmox root and the `pct` stand-in are shared with tests/proxmox.
from tests.proxmox.conftest import fake_pct, pve_root  # noqa: F401
