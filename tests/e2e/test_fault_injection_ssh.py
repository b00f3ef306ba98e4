"""On the LXC lab (tests/lxclab.py): cut the SSH connection to the Proxmox node at many points of `gpudoctor lxc fix --host ct200 --apply` (a real
node sshd behind a loopback proxy that cuts after N bytes; tests/sshd.py CutProxy). After every cut the config is the
original or the fully fixed file, never anything else; a fixed file always has its backup; the next run finishes
the job; a run after that changes nothing. The edit is gpudoctor.files.edit over the SSH Host: backup, temp file beside
the config, read back, validate, rename."""

from __future__ import annotations

import collections
import os
import random

import pytest

from gpudoctor.cli import main
from tests.lxclab import fixed
from tests.sshd import CutProxy

RUNS_GATHER = 8  # cuts while the plan's facts are read (handshake, config, /proc/devices, pct status, stat)
RUNS_APPLY = 44  # cuts while the edit is made and verified


@pytest.fixture
def proxied(seed_lab, tmp_path):
    """An inventory whose kpro6 is reached through a CutProxy in front of the node's sshd."""
    proxy = CutProxy(seed_lab.node_port, None)
    kh = tmp_path / "known_hosts"
    kh.write_text(seed_lab.node_known_hosts_line(proxy.port) + seed_lab.ct_known_hosts_line())
    inv = seed_lab.write_inventory(tmp_path / "inventory.yaml", known_hosts=kh, node_port=proxy.port)
    yield proxy, inv
    proxy.close()


def run(inv, tmp_path, capsys, *, apply=True) -> tuple[int, str, str]:
    """The real CLI entry point, in-process (no interpreter start-up per run)."""
    capsys.readouterr()
    args = ["lxc", "fix", "--host", "ct200", "--inventory", str(inv), "--backup-dir", "/var/lib/gpudoctor/backups",
            "--audit-log", str(tmp_path / "audit.jsonl"), "--lock-dir", str(tmp_path / "locks")]
    with pytest.raises(SystemExit) as exc:
        main(args + (["--apply", "--yes"] if apply else []))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def reset(px) -> None:
    px.write_config(px.seed)
    for name in px.temps():
        os.unlink(px.config_file.parent / name)
    for b in px.backups():
        b.unlink()


def measure(proxy, inv, tmp_path, capsys, px, *, apply) -> int:
    reset(px)
    proxy.cut_after, proxy.forwarded = None, 0
    code, out, err = run(inv, tmp_path, capsys, apply=apply)
    assert code == 1, out + err
    return proxy.forwarded


def test_cut_connection_leaves_original_or_fixed_config(seed_lab, proxied, tmp_path, capsys):
    px = seed_lab
    proxy, inv = proxied
    SEED_CONFIG, SEED_FIXED = px.seed, fixed(px.seed)
    plan_bytes = measure(proxy, inv, tmp_path, capsys, px, apply=False)
    total = measure(proxy, inv, tmp_path, capsys, px, apply=True)
    assert px.config_file.read_bytes() == SEED_FIXED and total > plan_bytes
    rng = random.Random(int(os.environ.get("GPUDOCTOR_FAULT_SEED", "5")))
    cuts = [rng.uniform(0, plan_bytes) for _ in range(RUNS_GATHER)]
    span = (total - plan_bytes) / RUNS_APPLY  # one cut in each slice of the apply phase
    cuts += [plan_bytes + span * (i + rng.random()) for i in range(RUNS_APPLY)]
    seen: collections.Counter = collections.Counter()
    codes: collections.Counter = collections.Counter()
    for i, n in enumerate(int(c) for c in cuts):
        reset(px)
        # every other cut in the apply phase keeps kpro6 unreachable afterwards: no cleanup, no retry over SSH
        stay_down = n > plan_bytes and i % 2 == 1
        proxy.cut_after, proxy.cuts, proxy.stay_down = n, 0, stay_down
        code, out, err = run(inv, tmp_path, capsys)
        seen["stayed down"] += stay_down
        codes[code] += 1
        now = px.config_file.read_bytes()
        assert now in (SEED_CONFIG, SEED_FIXED), f"cut {i} after {n} bytes left a half-edited config"
        assert oct(px.config_file.stat().st_mode & 0o777) == "0o640"
        backups = [b.read_bytes() for b in px.backups()]
        if now == SEED_FIXED:
            assert SEED_CONFIG in backups, f"cut {i} after {n} bytes: fixed without its backup"
            seen["fixed"] += 1
        else:
            seen["original+backup" if backups else "original"] += 1
        assert code in (0, 1, 2, 3), out + err
        if code == 3:  # the connection went while the plan's facts were read: one line, nothing changed
            assert err.startswith("gpudoctor: kpro6: ") and len(err.splitlines()) == 1, err
            assert now == SEED_CONFIG
        assert "Traceback" not in out + err
        temps = px.temps()
        seen["temp file left"] += bool(temps)
        if not (stay_down or temps or i % 4 == 0):
            continue  # a follow-up run after the interesting cuts and every fourth other one keeps this fast
        # the next run, uncut, finishes the job (or says there is nothing left but the restart)
        seen["followed up"] += 1
        proxy.cut_after, proxy.stay_down = None, False
        code2, out2, err2 = run(inv, tmp_path, capsys)
        assert px.config_file.read_bytes() == SEED_FIXED, out2 + err2
        assert px.temps() == [], f"cut {i}: a temp file survived a finished run"
        assert SEED_CONFIG in [b.read_bytes() for b in px.backups()]
        if now == SEED_CONFIG:
            assert code2 == 1 and "APPLIED  lxc.cgroup_allow on kpro6" in out2, out2 + err2
        else:  # the same state the first run reported: edit in place, restart pending (exit 1, not a refusal)
            assert code2 == 1 and "already allows every GPU node" in out2 and "UNCHANGED" in out2, out2 + err2
            assert "REFUSED" not in out2 and "restart pending" in out2, out2
        if i % 12 == 0:  # and a run after that changes nothing: same bytes, same inode, no new backup
            st, nb = px.config_file.stat(), len(px.backups())
            code3, out3, err3 = run(inv, tmp_path, capsys)
            st3 = px.config_file.stat()
            assert code3 == 1 and "already allows every GPU node" in out3 and "APPLIED" not in out3
            assert (st3.st_ino, st3.st_mtime_ns) == (st.st_ino, st.st_mtime_ns) and len(px.backups()) == nb
    with capsys.disabled():
        print(f"\nSSH fault injection: {len(cuts)} cut runs (plan {plan_bytes} B, whole apply {total} B through the "
              f"proxy): {dict(seen)}; exit codes {dict(sorted(codes.items()))}")
    assert len(cuts) >= 50
    assert seen["fixed"] > 0 and seen["original"] + seen["original+backup"] > 0 and seen["followed up"] >= 20
    assert seen["temp file left"] > 0  # some cuts left a temp file beside the config: the next run removed it
