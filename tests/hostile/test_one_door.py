"""#47 item 2: one door for files another user might control — opened once, judged on the fd, read from that fd.

Each case is a way root used to check one object and then use another, or to open what it should only have looked at:
an inventory that appears between the look and the open; a model source whose subdirectory is swapped for a link to
root's files after the plan; a site SKU table in another user's directory; a FIFO planted as a model's marker or ref.
uid 65534 (nobody) is the other user; each case has its control (root's own file is read).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from gpudoctor.errors import ConfigError
from gpudoctor.model import probe
from tests import needs
from tests.console import console_script
from tests.hostile.attacker import NOBODY, owned_by
from tests.hostile.planted import as_attacker, cli, digest, victim  # noqa: F401 - fixtures
from tests.model.modelfiles import write_model

INV = "hosts:\n  eves-host: {address: 192.0.2.66}\n"


@pytest.fixture
def open_tmp():
    """A root-owned 0755 directory the attacker can reach (pytest's tmp_path sits under a 0700 directory)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="gpudoctor-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_an_inventory_that_appears_after_the_trust_check_is_not_obeyed(open_tmp, monkeypatch, cli):
    """The attacker's directory holds her inventory.yaml; she removes it just while root checks and puts it back
    right after (a race she can win by retrying). The door has no check apart from the open: whatever it opens is
    judged on its own fd, so her hosts are never loaded. (Before #47 the trust check passed a missing file and the
    reader opened the name again.)"""
    needs.root()
    eve = open_tmp / "eve"
    eve.mkdir(mode=0o777)
    owned_by(eve)
    inv = eve / "inventory.yaml"

    def hers():
        inv.write_text(INV)
        owned_by(inv)

    hers()
    real_exists = os.path.exists
    raced = []

    def exists(p, *a, **kw):  # the attacker's timing: gone while it is looked at, back at once
        if os.fspath(p) not in (str(inv), "inventory.yaml"):
            return real_exists(p, *a, **kw)
        inv.unlink()
        try:
            return real_exists(p, *a, **kw)
        finally:
            raced.append(1)
            hers()

    monkeypatch.setattr(os.path, "exists", exists)
    code, out, err = cli("inventory", "show", "--inventory", inv)
    monkeypatch.undo()
    assert code == 3 and "eves-host" not in out, (code, out, err, raced)
    line = err.strip()
    assert "\n" not in line and str(eve) in line and "owned by nobody" in line, line
    os.chown(eve, 0, 0)  # the control: the same file in root's directory, root's, is read
    os.chmod(eve, 0o755)
    os.chown(inv, 0, 0)
    code, out, err = cli("inventory", "show", "--inventory", inv)
    assert code == 0 and "eves-host" in out, err


def test_a_source_subdirectory_swapped_for_a_link_after_the_plan_is_not_followed(tmp_path, open_tmp, victim,
                                                                                   monkeypatch):
    """`model stage` from a source the attacker owns: after the plan she swaps src/sub for a link to a directory of
    root's secrets (the test's own victim directory). Root must not copy them into DST, and must not stage anything at
    a mode the plan took from her file."""
    from gpudoctor.errors import GpudoctorError
    from gpudoctor.model import stage as st

    needs.root()
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src = open_tmp / "eve" / "tiny"
    write_model(src, shards=1, elems=1024)
    (src / "sub").mkdir()
    (src / "sub" / "victim").write_bytes(b"eve's harmless file\n")
    (src / "sub" / "victim").chmod(0o644)
    for p in [open_tmp / "eve", *sorted(src.rglob("*"))] + [src]:
        os.lchown(p, NOBODY, NOBODY)
    dst = tmp_path / "dst"
    plan = st.plan_stage(str(src), str(dst), check_busy=False)
    assert any(f.name == "sub/victim" for f in plan.files)

    def swap():
        os.rename(src / "sub", src / "old-sub")
        os.symlink(victim.parent, src / "sub")

    before = digest(victim)[0]
    as_attacker(swap)
    try:
        st.apply_stage(plan)
    except (GpudoctorError, OSError) as exc:
        assert "\n" not in str(exc)
    staged = dst / "sub" / "victim"
    assert not staged.exists() or staged.read_bytes() == b"eve's harmless file\n", "root copied its secret into DST"
    assert digest(victim)[0] == before


def test_the_staged_mode_is_the_mode_of_the_file_read(tmp_path, monkeypatch):
    """The mode comes from the fd actually opened: a file chmod'ed 0600 after a 0644 plan is staged 0600."""
    from gpudoctor.model import stage as st

    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src = tmp_path / "src"
    write_model(src, shards=1, elems=1024)
    (src / "secret.txt").write_bytes(b"x\n")
    (src / "secret.txt").chmod(0o644)
    dst = tmp_path / "dst"
    plan = st.plan_stage(str(src), str(dst), check_busy=False)
    (src / "secret.txt").chmod(0o600)
    st.apply_stage(plan)
    assert (dst / "secret.txt").stat().st_mode & 0o777 == 0o600


def test_a_site_sku_table_in_another_users_directory_is_refused(tmp_path, monkeypatch):
    from gpudoctor.catalog import deep_limits

    needs.root()
    tmp_path.chmod(0o755)
    eve = tmp_path / "eve"
    eve.mkdir()
    owned_by(eve)
    mine = copy.deepcopy(deep_limits.sku_for("NVIDIA H100 80GB HBM3"))
    mine["floors"]["gemm"].update(floor=0.8, healthy=0.88)  # her floors, not the shipped ones
    table = eve / "gpu_skus.json"
    table.write_text(json.dumps({"schema": "gpudoctor.gpu_skus/1", "skus": [mine]}))
    table.chmod(0o644)  # root's file, but eve can rename it away and put hers in its place
    monkeypatch.setenv(deep_limits.SITE_ENV, str(table))
    deep_limits._load.cache_clear()
    try:
        with pytest.raises(ConfigError) as exc:
            deep_limits.table()
        line = exc.value.one_line()
        assert "\n" not in line and str(eve) in line and "owned by nobody" in line and "as root" in line, line
        os.chown(eve, 0, 0)  # the control
        deep_limits._load.cache_clear()
        assert deep_limits.sku_for("NVIDIA H100 80GB HBM3")["floors"]["gemm"]["floor"] == 0.8
    finally:
        deep_limits._load.cache_clear()


def _hf_repo(root: Path) -> Path:
    repo = root / "models--org--tiny"
    commit = "a" * 40
    snap = repo / "snapshots" / commit
    write_model(snap, shards=1, elems=1024)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


@pytest.mark.parametrize("where", ["marker", "refs/main"])
def test_model_verify_on_a_planted_fifo_is_one_line_never_a_hang(tmp_path, where):
    """A FIFO where the marker or refs/main should be: `model verify` reads neither (it would block until a writer
    came, for ever); it says what it found, and exits."""
    if where == "marker":
        model = tmp_path / "m"
        write_model(model, shards=1, elems=1024)
        os.mkfifo(model / probe.MARKER_NAME)
    else:
        model = _hf_repo(tmp_path)
        (model / "refs" / "main").unlink()
        os.mkfifo(model / "refs" / "main")
    try:
        r = subprocess.run([console_script(), "model", "verify", str(model), "--json"], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL,
                           env={**os.environ, "GPUDOCTOR_STATE_DIR": str(tmp_path / "state")})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"model verify blocked on a FIFO planted as {where}") from None
    assert "Traceback" not in r.stderr, r.stderr
    assert "FIFO" in r.stdout + r.stderr, (r.returncode, r.stdout[-800:], r.stderr)


@pytest.mark.parametrize("how", ["named-by-roots-inventory", "under-HOME"])
def test_another_users_ssh_config_is_not_obeyed_as_root(open_tmp, monkeypatch, how):
    """Her ssh config's ProxyCommand would run as root: the config is read through the door, and refused in one
    line naming its owner — whether root's inventory names it or $HOME points at her home. Root's own is obeyed."""
    from gpudoctor.errors import InputError
    from gpudoctor.inventory import parse_inventory
    from gpudoctor.target import host_for

    needs.root()
    home = open_tmp / "eve"
    (home / ".ssh").mkdir(parents=True)
    cfg = home / ".ssh" / "config"
    cfg.write_text("Host gpu1\n  ProxyCommand touch /tmp/eve-was-root\n  User root\n")
    for p in (home, home / ".ssh", cfg):
        owned_by(p)
    if how == "named-by-roots-inventory":
        inv = parse_inventory(f"hosts:\n  gpu1: {{address: gpu1, ssh_config: {cfg}}}\n", str(open_tmp / "i.yaml"))
    else:
        monkeypatch.setenv("HOME", str(home))
        inv = parse_inventory("hosts:\n  gpu1: {address: gpu1}\n", str(open_tmp / "i.yaml"))
    host = host_for(inv.host("gpu1"))
    with pytest.raises(InputError) as exc:
        host.resolve()
    line = exc.value.one_line()
    assert "\n" not in line and "refusing this ssh config as root" in line and "owned by nobody" in line, line
    for p in (home, home / ".ssh", cfg):  # the control: the same config, root's, is obeyed
        os.chown(p, 0, 0)
    assert host_for(inv.host("gpu1")).resolve().proxy_command == "touch /tmp/eve-was-root"


def test_the_per_start_gate_and_staging_apply_one_rule(open_tmp, tmp_path, monkeypatch):
    """A complete model in a directory another user owns: `model stage` refuses to write into it, and the per-start
    gate's check (workload.model.complete) no longer passes it — both by files/trust.py's refusal. Root's own passes."""
    from gpudoctor.checks.workload_model import check_complete
    from gpudoctor.findings import Status
    from gpudoctor.model import stage as st
    from gpudoctor.model.probe import probe as model_probe

    needs.root()
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src = tmp_path / "src"
    files = write_model(src, shards=1, elems=1024)
    theirs = open_tmp / "theirs"
    theirs.mkdir()
    for name, data in files.items():
        (theirs / name).write_bytes(data)
        owned_by(theirs / name)
    owned_by(theirs)

    def judged():
        f = check_complete({"model": model_probe([str(theirs)])})
        return [x for x in f if x.id == "workload.model.complete"][0]

    with pytest.raises(Exception) as exc:
        st.plan_stage(str(src), str(theirs), check_busy=False)
    assert "owned by nobody" in str(exc.value)
    f = judged()
    assert f.status == Status.FAIL and "owned by nobody" in f.summary, f
    for p in [theirs, *theirs.iterdir()]:  # the control
        os.chown(p, 0, 0)
    assert judged().status == Status.OK
