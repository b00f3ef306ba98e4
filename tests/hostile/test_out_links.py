"""#40 items 3 and 5: every output file root writes goes through files/safe.py — `bench run --out` (its .lock,
campaign.json, campaign.yaml, records), `--prom`, `snapshot -o`: a link planted at an output's name is replaced, never
written through; an --out directory another user owns (or can write, or lies below one they own) is refused in one
line (exit 3); outputs that may carry host detail are 0600, the Prometheus textfile 0644 (node_exporter reads it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.bench.campaigns import write
from tests.hostile.planted import as_attacker, cli, digest, public, victim  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
OK_SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h200-healthy.json"


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_bench_out_owned_by_another_user_is_refused(cli, tmp_path, victim, public):
    camp, _ = write(tmp_path, "methods:\n  baseline: {baseline: true}\n")
    out = public / "out"
    before = digest(victim)

    def plant():
        out.mkdir(mode=0o777)
        (out / ".lock").symlink_to(victim)
        (out / "campaign.json").symlink_to(victim)
        (out / "campaign.yaml").symlink_to(victim)

    as_attacker(plant)
    code, _, err = cli("bench", "run", camp, "--out", out)
    assert code == 3, err
    assert "owned by nobody" in _one_line(err)
    assert digest(victim) == before


def test_bench_out_below_a_directory_another_user_owns_is_refused(cli, tmp_path, victim, public):
    """eve's directory holds root's --out: she can swap it for a link between two writes; refused before any."""
    camp, _ = write(tmp_path, "methods:\n  baseline: {baseline: true}\n")
    eve = public / "eve"
    as_attacker(lambda: eve.mkdir(mode=0o755))
    code, _, err = cli("bench", "run", camp, "--out", eve / "out")
    assert code == 3, err
    assert "owned by nobody" in _one_line(err) and str(eve) in err


def test_bench_lock_that_is_a_link_is_refused(cli, tmp_path, victim):
    camp, _ = write(tmp_path, "methods:\n  baseline: {baseline: true}\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    before = digest(victim)
    code, _, err = cli("bench", "run", camp, "--out", out)
    assert code == 3, err
    assert ".lock" in _one_line(err) and "link" in err
    assert digest(victim) == before


def test_bench_outputs_replace_links_and_are_private(tmp_path, victim):
    """Links left at campaign.json / campaign.yaml in our own --out are replaced; records and copies are 0600."""
    from tests.bench.conftest import run_cli

    camp, _ = write(tmp_path, "methods:\n  baseline: {baseline: true}\n", concurrency="[1]")
    out = tmp_path / "out"
    out.mkdir()
    (out / "campaign.json").symlink_to(victim)
    (out / "campaign.yaml").symlink_to(victim)
    before = digest(victim)
    p = run_cli("bench", "run", str(camp), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert digest(victim) == before
    for name in ("campaign.json", "campaign.yaml", "results.jsonl"):
        st = os.lstat(out / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, (name, oct(st.st_mode))


def test_prom_textfile_planted_as_a_link_is_replaced(cli, tmp_path, victim, public):
    prom = public / "gpudoctor.prom"
    as_attacker(lambda: prom.symlink_to(victim))
    before = digest(victim)
    code, _, err = cli("check", "--snapshot", OK_SNAPSHOT, "--prom", prom)
    assert code in (0, 1), err
    assert digest(victim) == before
    st = os.lstat(prom)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
    assert "gpudoctor_host_status" in prom.read_text()


def test_a_link_on_the_way_to_an_output_is_not_followed(cli, tmp_path, victim, public):
    """/tmp/x -> /etc made by another user: `--prom /tmp/x/f.prom` does not create root's file in /etc."""
    hop = public / "x"
    as_attacker(lambda: hop.symlink_to(victim.parent, target_is_directory=True))
    code, _, err = cli("check", "--snapshot", OK_SNAPSHOT, "--prom", hop / "f.prom")
    assert code == 3, err
    assert "link owned by nobody" in _one_line(err)
    assert sorted(os.listdir(victim.parent)) == ["victim"]


def test_snapshot_output_is_private_and_replaces_a_link(tmp_path, victim, public):
    """`snapshot -o` carries the host's detail: 0600 whatever the umask, and a planted link is replaced."""
    import subprocess
    import sys

    from tests.childenv import pythonpath

    out = public / "snap.json"
    os.chmod(victim, 0o644)  # a replaced file's mode is not the new one's: a snapshot is private whatever it replaces
    as_attacker(lambda: out.symlink_to(victim))
    before = digest(victim)
    env = dict(os.environ, PYTHONPATH=pythonpath())
    p = subprocess.run(["sh", "-c", 'umask 0 && exec "$0" -m gpudoctor snapshot -o "$1"', sys.executable, str(out)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert p.returncode == 0, p.stderr
    assert digest(victim) == before
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_bench_load_out_owned_by_another_user_is_refused_before_anything_runs(cli, public):
    """Checked with the other output paths, before a request is sent (the server URL here answers nothing)."""
    out = public / "out"
    as_attacker(lambda: out.mkdir(mode=0o777))
    code, _, err = cli("bench", "load", "--server-url", "http://127.0.0.1:9", "--out", out, "--concurrency", "1",
                       "--max-tokens", "8")
    assert code == 3, err
    assert "owned by nobody" in _one_line(err)
    assert os.listdir(out) == []
