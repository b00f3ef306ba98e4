import os
import stat
import textwrap
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "proxmox"
CONFIGS = FIX / "configs"
BAD_CONFIGS = FIX / "bad-configs"
DEV511 = FIX / "proc-devices-uvm511.txt"
DEV509 = FIX / "proc-devices-uvm509.txt"


def corpus() -> list[Path]:
    return sorted(CONFIGS.glob("*.conf"))


@pytest.fixture
def pve_root(tmp_path):
    """A fake Proxmox root: /etc/pve/lxc, /proc/devices (uvm at 511), /var/lib/lxc — under tmp_path."""
    (tmp_path / "etc/pve/lxc").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_bytes(DEV511.read_bytes())
    (tmp_path / "var/lib/lxc").mkdir(parents=True)
    return tmp_path


def install(root: Path, vmid: int, fixture: str) -> Path:
    p = root / f"etc/pve/lxc/{vmid}.conf"
    p.write_bytes((CONFIGS / fixture).read_bytes())
    os.chmod(p, 0o640)
    return p


@pytest.fixture
def fake_pct(tmp_path):
    """A real `pct` stand-in (a shell script on PATH) driven by files: status, compute pids, reboot log.

    state/status: running|stopped; state/pids: lines printed by `nvidia-smi --query-compute-apps` inside;
    state/smi_rc: exit code of that nvidia-smi; every call is appended to state/calls.
    """
    bindir, state = tmp_path / "bin", tmp_path / "pct-state"
    bindir.mkdir()
    state.mkdir()
    (state / "status").write_text("running\n")
    (state / "pids").write_text("")
    (state / "smi_rc").write_text("0\n")
    (state / "list").write_text("VMID       Status     Lock         Name                \n"
                                "200        running                 ct200               \n"
                                "201        stopped    backup       ct201               \n")
    script = bindir / "pct"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        S={state}
        echo "$*" >> $S/calls
        case "$1" in
          status) echo "status: $(cat $S/status)";;
          list) cat $S/list;;
          reboot) echo stopped > $S/status; (sleep 0.3; echo running > $S/status) & ;;
          exec) shift; shift; [ "$1" = "--" ] && shift
                if [ "$1" = nvidia-smi ]; then rc=$(cat $S/smi_rc); [ "$rc" = 0 ] && cat $S/pids || echo "NVIDIA-SMI has failed" >&2; exit $rc; fi
                exit 1;;
          *) echo "pct: unknown command $1" >&2; exit 255;;
        esac
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bindir, state


def audit(inp):
    """The registered boundary.lxc.* checks over the boundary facts these inputs make (as `lxc audit` runs them),
    without boundary.lxc.config (which says only that both files were read)."""
    pd = "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, ns in inp.procdev.char.items() for n in ns)
    b = {"kind": "lxc", "applicable": True, "proxmox": "pve", "vmid": inp.vmid, "name": inp.name,
         "config": {"path": inp.cfg.path, "text": inp.cfg.text}, "proc_devices": {"path": "/proc/devices", "text": pd},
         "running": None if inp.running is None else {"path": f"/var/lib/lxc/{inp.vmid}/config", "text": inp.running},
         "status": {"status": inp.status}, "host_nodes": inp.host_nodes, "offline": inp.offline,
         "cgroup": {"layout": inp.layout, "evidence": inp.layout_evidence}}
    from gpudoctor.diagnose import diagnose

    return [f for f in diagnose({"meta": {"host": "pve"}, "boundary": b}, {"boundary"}).findings
            if f.id != "boundary.lxc.config"]
