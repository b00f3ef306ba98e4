"""Every writer the crash-point harness runs: each remedy of the registry (remedies.REMEDIES: a new remedy without
a scenario here fails tests/crash/test_crash_points.py) and each state writer, each on a throwaway world under a
base directory, built the way the remedy tests build theirs (tests/remedies/hostroot.py, tests/proxmox)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from gpudoctor.remedy import AuditLog, Change, Engine, RemedyContext

from tests.crash import invariants as inv
from tests.crash.harness import Writer

TESTS = Path(__file__).resolve().parents[1]
AUDIT = "audit.jsonl"
LOCKS = ("locks/*.lock",)
STANDIN_LOGS = ("standin-calls.jsonl", "systemctl.log", "calls")


def _engine(remedy, host, base: Path, name: str = "gpu1", **ctx_kw) -> Engine:
    ctx = RemedyContext(hosts={name: host}, backup_dir="/var/lib/gpudoctor/backups", timeout=10, **ctx_kw)
    return Engine([remedy], ctx, audit_log=AuditLog(str(base / AUDIT)), lock_dir=str(base / "locks"))


def _apply(eng: Engine, facts) -> None:
    """Plan from the facts and apply; the run succeeded when every change applied (or nothing was left to do)."""
    plan = eng.plan(facts)
    if plan.refusals:
        raise RuntimeError(f"refused: {[r.to_json() for r in plan.refusals]}")
    for out in eng.apply(plan):
        if out.result not in ("applied", "unchanged"):
            raise RuntimeError(f"{out.change.remedy}: {out.result}: {out.detail}")


def _host_root(base: Path, **kw):
    from tests.remedies.hostroot import HostRoot

    os.environ["GPUDOCTOR_STANDIN_PYTHON"] = sys.executable
    r = HostRoot(base, **kw)
    os.environ["GPUDOCTOR_STANDIN_ROOT"] = str(r.root)
    return r


def _remedy_writer(rid: str, setup, facts, engine_kw=None, name: str | None = None, **kw) -> Writer:
    from gpudoctor import remedies

    def run(r, f):
        host = r.host()
        _apply(_engine(remedies.get(rid), host, r.root.parent, name=host.name, **(engine_kw or {})), f)

    kw["invariants"] = (inv.audit_names_every_change, *kw.get("invariants", ()))
    kw["invariants"] = tuple(i if i is not inv.audit_names_every_change else _audit_of(rid) for i in kw["invariants"])
    return Writer(name or rid, "remedy", setup, run, facts, audit=AUDIT, locks=LOCKS, ignore=STANDIN_LOGS, **kw)


def _audit_of(rid: str):
    """The audit invariant for remedy rid (a writer's name may carry its world: NAME@WORLD)."""
    def check(judge, now, power):
        return inv.audit_names_every_change(judge, now, power, remedy=rid)

    return check


# --- the remedies ---------------------------------------------------------------------------------------------

def lxc_cgroup(world: str = "fresh") -> Writer:
    """The container's config edited; world "backup": an earlier run's backup of it is there already (another
    day's content, a stamp of its own): the edit still backs up what it changes."""
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.host.local import LocalHost

    from tests.proxmox.conftest import CONFIGS, DEV511

    def setup(base):
        root = base / "root"
        (root / "etc/pve/lxc").mkdir(parents=True)
        (root / "proc").mkdir()
        (root / "proc/devices").write_bytes(DEV511.read_bytes())
        (root / "var/lib/lxc").mkdir(parents=True)
        conf = root / "etc/pve/lxc/200.conf"
        conf.write_bytes((CONFIGS / "200-seed.conf").read_bytes())
        os.chmod(conf, 0o640)
        if world == "backup":
            old = root / "var/lib/gpudoctor/backups/etc/pve/lxc/200.conf.20250101T000000.000000Z"
            old.parent.mkdir(parents=True)
            old.write_bytes(b"# another day's config\narch: amd64\n")
            os.chmod(old, 0o600)
        return SimpleNamespace(root=root, host=lambda: LocalHost(name="pve", root=str(root)))

    def facts(r):
        return {"boundary": gather_lxc(r.host(), 200, ask_status=False)}

    return _remedy_writer("lxc.cgroup_allow", setup, facts, invariants=(inv.backup_before("root/etc/pve/lxc/*"),),
                          **({"name": "lxc.cgroup_allow@backup"} if world == "backup" else {}))


def cdi() -> Writer:
    yaml = (TESTS / "fixtures/cdi/nvidia-uvm-510.yaml").read_text()
    js = (TESTS / "fixtures/cdi/k8s-device-plugin-uvm-510.json").read_text()

    def setup(base):
        r = _host_root(base, uvm_major=238)
        r.healthy_nodes(uvm_major=238)
        r.node("/dev/nvidia-modeset", 195, 254)
        r.write("/etc/cdi/nvidia.yaml", yaml)
        r.write("/var/run/cdi/k8s-device-plugin.json", js)
        return r

    return _remedy_writer("cdi.spec", setup, lambda r: r.facts(only=("host", "devices", "tools", "cdi", "platform")),
                          invariants=(inv.backup_before("*/etc/cdi/*", "*/var/run/cdi/*"),))


def systemd_unit() -> Writer:
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext

    unit = "sglang.service"

    def setup(base):
        r = _host_root(base, uvm_major=238)
        r.healthy_nodes(uvm_major=238)
        (r.bin / "systemctl").unlink()
        shutil.copy(TESTS / "boundary/standins/systemctl", r.bin / "systemctl")
        r.write(f"/etc/systemd/system/{unit}", (TESTS / "fixtures/systemd" / unit).read_text())
        return r

    def facts(r):
        f = r.facts(only=("host", "devices", "tools"))
        f["platform"] = gather(r.host(), GatherContext(name="gpu1", timeout=5, units=[unit]),
                               only={"platform"})["platform"]
        return f

    return _remedy_writer("systemd.device_allow", setup, facts, invariants=(inv.backup_before("*/etc/systemd/*"),))


def node_create() -> Writer:
    def setup(base):
        r = _host_root(base, uvm_major=511, without=("nvidia-modprobe",))
        r.node("/dev/nvidiactl", 195, 255)
        r.node("/dev/nvidia0", 195, 0)
        r.node("/dev/nvidia-uvm", 509, 0)  # a stale major: replaced in one rename; uvm-tools missing: made
        return r

    return _remedy_writer("devices.node.create", setup, lambda r: r.facts())


def node_mode() -> Writer:
    def setup(base):
        r = _host_root(base, uvm_major=238).healthy_nodes(238)
        r.node("/dev/nvidia-uvm-tools", 238, 1, 0o000)
        r.node("/dev/nvidia-uvm", 238, 0, 0o600)
        return r

    return _remedy_writer("devices.node.mode", setup, lambda r: r.facts())


def persistence() -> Writer:
    from tests.remedies.test_persistence import UNIT_TEXT

    def setup(base):
        r = _host_root(base, uvm_major=238).healthy_nodes(238)
        r.write("/lib/systemd/system/nvidia-persistenced.service", UNIT_TEXT)
        r.path("/run/systemd/system").mkdir(parents=True)
        r.write("/standin-state/pm", "Disabled\n")
        return r

    return _remedy_writer("driver.persistence", setup, lambda r: r.facts(only=("host", "devices", "tools", "driver")),
                          engine_kw={"options": {"allow": [], "persistence_wait_s": 1.0}})


def sysctl() -> Writer:
    def setup(base):
        r = _host_root(base, uvm_major=238).healthy_nodes(238)
        r.write("/proc/sys/kernel/numa_balancing", "1\n")
        r.write("/etc/sysctl.d/90-gpudoctor-numa.conf", "kernel.numa_balancing = 1\n")
        return r

    return _remedy_writer("fabric.numa.balancing", setup,
                          lambda r: r.facts(only=("host", "devices", "tools", "fabric")),
                          invariants=(inv.backup_before("*/etc/sysctl.d/*"),))


def pcie() -> Writer:
    def setup(base):
        r = _host_root(base, uvm_major=238).healthy_nodes(238)
        r.pci()
        r.path("/run/systemd/system").mkdir(parents=True)
        return r

    return _remedy_writer("fabric.pcie.mrrs", setup, lambda r: r.facts(only=("host", "devices", "tools", "fabric"),
                                                                       policy={"pcie": {"mrrs": 512}}))


def model_stage() -> Writer:
    """A model staged, its DST wiped by a "reboot" (the record says another boot): the remedy restages it."""
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.host.local import LocalHost
    from gpudoctor.model import stage as st

    from tests.model.modelfiles import write_model

    def setup(base):
        os.environ["GPUDOCTOR_STATE_DIR"] = str(base / "state")
        src, dst = base / "disk" / "Qwen3-tiny", base / "shm" / "Qwen3-tiny"
        write_model(src, shards=3, elems=4096)
        st.apply_stage(st.plan_stage(str(src), str(dst), check_busy=False))
        shutil.rmtree(dst)
        (rec,) = (base / "state" / "staged").iterdir()
        doc = json.loads(rec.read_text())
        doc["boot_id"] = "0badb007-0000-4000-8000-000000000000"
        rec.write_text(json.dumps(doc))
        return SimpleNamespace(base=base, dst=dst)

    def facts(c):
        return gather(LocalHost(name="gpu1"), GatherContext(name="gpu1", model_paths=[str(c.dst)], timeout=20),
                      only={"model", "tools"})

    def run(c, f):
        from gpudoctor import remedies

        eng = Engine([remedies.get("model.stage")],
                     RemedyContext(hosts={"gpu1": LocalHost(name="gpu1")}, timeout=10,
                                   options={"model_sources": {}, "stage_jobs": 2}),
                     audit_log=AuditLog(str(c.base / AUDIT)), lock_dir=str(c.base / "locks"))
        _apply(eng, f)

    return Writer("model.stage", "remedy", setup, run, facts, audit=AUDIT, locks=LOCKS + (".gpudoctor-stage.lock",),
                  invariants=(inv.audit_names_every_change, inv.marker_vouches("shm/Qwen3-tiny")))


def bench_orphan() -> Writer:
    """A server left by a campaign that is gone (its owner pid is dead): stopped by process group."""
    from gpudoctor.gather.marker import ENV_OWNER, ENV_RUN, ENV_LABEL
    from gpudoctor.host.local import LocalHost

    def setup(base):
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        owner = f"{socket.gethostname()}:{dead.pid}:1"  # a campaign that is gone
        env = {**os.environ, ENV_RUN: str(base / "campaign"), ENV_LABEL: "tp1", ENV_OWNER: owner}
        # started by a shell that leaves at once: the server is nobody's child here (no zombie after the kill)
        sh = subprocess.run(["setsid", "sh", "-c", f"{sys.executable} -c 'import time; time.sleep(120)' "
                             f">/dev/null 2>&1 & echo $!"], env=env, capture_output=True, text=True, check=True)
        pid = int(sh.stdout.split()[-1])
        time.sleep(0.2)
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        return SimpleNamespace(base=base, change=Change(
            "workload.bench.orphan", "gpu1", f"stop pid {pid}", risk="medium",
            data={"servers": [{"pid": pid, "start": start, "owner": owner}], "stop_s": 2.0}))

    def run(c, f):
        from gpudoctor import remedies
        from gpudoctor.remedy import Plan

        eng = Engine([remedies.get("workload.bench.orphan")], RemedyContext(hosts={"gpu1": LocalHost(name="gpu1")}),
                     audit_log=AuditLog(str(c.base / AUDIT)), lock_dir=str(c.base / "locks"))
        for out in eng.apply(Plan(changes=[c.change])):
            if out.result not in ("applied", "unchanged"):
                raise RuntimeError(f"{out.result}: {out.detail}")

    return Writer("workload.bench.orphan", "remedy", setup, run, audit=AUDIT, locks=LOCKS)


REMEDY_WRITERS = {
    "lxc.cgroup_allow": lxc_cgroup, "cdi.spec": cdi, "systemd.device_allow": systemd_unit,
    "devices.node.create": node_create, "devices.node.mode": node_mode, "driver.persistence": persistence,
    "fabric.numa.balancing": sysctl, "fabric.pcie.mrrs": pcie, "model.stage": model_stage,
    "workload.bench.orphan": bench_orphan,
}
# remedies whose behaviour depends on what is there, run from another starting world too (issue #48, item 3)
REMEDY_WORLDS = [lambda: lxc_cgroup("backup")]


# --- the state writers ----------------------------------------------------------------------------------------

def _ladder_doc():
    from gpudoctor.recovery.ladder import HostLadder

    return HostLadder(state="failing", since=1.0, reason="a test", roots=["devices.node.open"])


def recovery_store(corrupt: bool = False) -> Writer:
    from gpudoctor.recovery.ladder import HostLadder
    from gpudoctor.recovery.store import RecoveryStore

    def setup(base):
        path = base / "recovery" / "ladder.json"
        s = RecoveryStore(path)
        if corrupt:
            path.parent.mkdir(parents=True)
            path.write_text('{"schema": "gpudoctor.recovery/1", "hosts": {"gpu1": ')  # cut short
        else:
            with s.edit() as hosts:
                hosts["gpu1"] = _ladder_doc()
        return SimpleNamespace(path=path)

    def run(c, f):
        with RecoveryStore(c.path).edit() as hosts:
            hosts["gpu2"] = HostLadder(state="verifying", since=2.0, reason="checks clean")
            if "gpu1" in hosts:
                hosts["gpu1"].clean_cycles = 3

    return Writer("recovery.store" + (".set_aside" if corrupt else ""), "state", setup, run,
                  locks=("recovery/ladder.json.lock",))


def daemon_state(corrupt: bool = False) -> Writer:
    """The daemon's cycle: load (an unreadable file set aside), save."""
    from gpudoctor.daemon.state import DaemonState, StateStore

    def setup(base):
        path = base / "daemon" / "state.json"
        if corrupt:
            path.parent.mkdir(parents=True)
            path.write_text('{"hosts": {"gpu1": ')  # cut short
        else:
            StateStore(path).save(DaemonState(cycles=1, pid=10, boot_id="b1"))
        return SimpleNamespace(path=path)

    def run(c, f):
        store = StateStore(c.path)
        st = store.load()
        st.cycles, st.pid, st.boot_id, st.metrics_addr = 2, 10, "b1", "127.0.0.1:9400"
        store.save(st)

    return Writer("daemon.state" + (".set_aside" if corrupt else ""), "state", setup, run)


def audit_log(world: str = "whole") -> Writer:
    """AuditLog.append; world "torn": the log ends in half a line (a writer killed, or a power cut, mid-append):
    the new record starts on a fresh line, what was there stays."""
    def setup(base):
        AuditLog(str(base / "audit" / AUDIT)).append({"host": "gpu1", "result": "applied"})
        if world == "torn":
            with open(base / "audit" / AUDIT, "ab") as fh:
                fh.write(b'{"host": "gpu1", "remedy": "x", "res')
        return SimpleNamespace(path=base / "audit" / AUDIT)

    def run(c, f):
        AuditLog(str(c.path)).append({"host": "gpu1", "remedy": "x", "result": "applied"})

    return Writer("remedy.audit_log" + ("" if world == "whole" else f"@{world}"), "state", setup, run,
                  logs=("audit/" + AUDIT,), invariants=(_log_records_whole,))


def _log_records_whole(judge, now, power):
    """Every record but a torn last line parses, and the new record is one whole line of its own."""
    cur = now.get("0:audit/" + AUDIT)
    if cur is None:
        return ["the audit log is gone"]
    lines = cur[1].split(b"\n")
    torn = [ln for ln in lines[:-1] if ln and not _parses(ln)]
    old = judge.before.get("0:audit/" + AUDIT)
    ours = [ln for ln in lines[:-1] if b'"remedy": "x", "result": "applied"' in ln]
    bad = []
    if any(not ln.startswith(b'{"host": "gpu1", "remedy": "x", "res') for ln in torn):
        bad.append(f"a record that does not parse: {torn[0][:60]!r}")
    if ours and not _parses(ours[-1]):
        bad.append("the new record is glued to the torn line before it")
    if old is not None and ours and not cur[1].startswith(old[1]):
        bad.append("the log lost what it held before")
    return bad


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def host_lock() -> Writer:
    from gpudoctor.remedy import host_lock as lock

    def setup(base):
        return SimpleNamespace(d=base / "locks")

    def run(c, f):
        with lock(str(c.d), "gpu1", "a test"):
            pass

    return Writer("remedy.host_lock", "state", setup, run, locks=LOCKS)


def _record(c: int, tok_s: float) -> dict:
    return {"label": "m-tp1", "method": "m", "tp": 1, "workload": "w:short:out64", "concurrency": c,
            "request_rate": None, "trial": 0, "status": "ok", "requests": 4, "completed": 4,
            "output_tok_per_s": tok_s, "accept_length": None, "ttft_ms_p50": 20.0, "itl_ms_p50": 5.0,
            "e2e_ms_p50": 200.0, "error": None}


def bench_results(retract: bool = False) -> Writer:
    """ResultStore.append of a level's record; or .retract of a suspect one (results.jsonl, then retracted.jsonl)."""
    from gpudoctor.bench.records.results import ResultStore, key

    def setup(base):
        s = ResultStore(base / "out")
        s.append(_record(1, 100.0))
        s.append(_record(2, 180.0))
        return SimpleNamespace(out=base / "out")

    def run(c, f):
        s = ResultStore(c.out)
        if not retract:
            if not any(r["concurrency"] == 4 for r in s.load()):
                s.append(_record(4, 300.0))
            return
        gone = [key(r) for r in s.load() if r["concurrency"] == 2]
        if gone:
            s.retract(gone, "suspect: a test")

    return Writer("bench.results" + (".retract" if retract else ".append"), "state", setup, run)


def campaign_meta() -> Writer:
    from gpudoctor.campaign.runner import write_meta

    def setup(base):
        (base / "campaign.yaml").write_text("name: crash\nmethods: []\n")
        (base / "out").mkdir()
        (base / "out" / "campaign.json").write_text('{"name": "crash", "old": true}')
        return SimpleNamespace(base=base)

    def run(c, f):
        camp = SimpleNamespace(text=(c.base / "campaign.yaml").read_text())  # write_meta takes the parsed text
        write_meta(c.base / "out", camp, {"name": "crash", "methods": ["a"]})

    return Writer("bench.campaign_meta", "state", setup, run)


def heals() -> Writer:
    from gpudoctor.files.atomic import append_jsonl_atomic

    def setup(base):
        (base / "out").mkdir()
        append_jsonl_atomic(base / "out" / "heals.jsonl", [{"n": 1}])
        return SimpleNamespace(path=base / "out" / "heals.jsonl")

    def run(c, f):
        append_jsonl_atomic(c.path, [{"n": 2}])

    return Writer("bench.heals", "state", setup, run, logs=("out/heals.jsonl",))


def snapshot_output() -> Writer:
    """`gpudoctor snapshot -o FILE` over an older snapshot, through the command itself (commands/check.py; today
    files/safe.py's write_file): only the gathering is replaced (in the forked child) by a fixed document."""
    import contextlib

    def setup(base):
        (base / "snap.json").write_text(json.dumps({"old": 1}))
        os.chmod(base / "snap.json", 0o600)
        return SimpleNamespace(path=base / "snap.json")

    def run(c, f):
        from gpudoctor import snapshot as snap
        from gpudoctor.commands import check as cmd

        target = SimpleNamespace(connect=lambda: None, host=None, context=None)
        cmd.open_check_target = lambda *a, **kw: contextlib.nullcontext(target)
        snap.take = lambda host, context: {"schema": "gpudoctor.snapshot/1", "new": list(range(2000)),
                                           "transcript": []}
        try:
            cmd.snapshot.main(["-o", str(c.path)], standalone_mode=False)
        except SystemExit as e:
            if e.code:
                raise RuntimeError(f"snapshot -o exited {e.code}") from None

    return Writer("snapshot.output", "state", setup, run)


def prom_textfile() -> Writer:
    from gpudoctor.integrations.promfile import write_prom

    def setup(base):
        (base / "prom").mkdir()
        (base / "prom" / "gpudoctor.prom").write_text("# old\n")
        return SimpleNamespace(path=base / "prom" / "gpudoctor.prom")

    def run(c, f):
        write_prom(c.path, [{"host": "gpu1", "status": "ok", "timestamp": 1.0, "duration_s": 0.5, "findings": []}])

    return Writer("prom.textfile", "state", setup, run)


def stage_cli(world: str = "empty") -> Writer:
    """`gpudoctor model stage SRC DST` (model/stage.py), with its persistent record, from one of three worlds
    (issue #48, item 3): an empty DST; DST staged before from an older version of the model (its marker there:
    removed first, the changed shards restaged); DST left half-staged by a killed stage (no marker, part files and
    some shards there: the whole shards are skipped). Invariant: the marker never vouches for what is not there."""
    from gpudoctor.model import stage as st

    from tests.model.modelfiles import write_model

    def setup(base):
        os.environ["GPUDOCTOR_STATE_DIR"] = str(base / "state")
        src, dst = base / "disk" / "m", base / "shm" / "m"
        if world == "restage":
            write_model(src, shards=2, elems=1024)
            st.apply_stage(st.plan_stage(str(src), str(dst), check_busy=False), jobs=1)
            shutil.rmtree(src)
        write_model(src, shards=2, elems=2048)
        if world == "partial":
            dst.mkdir(parents=True)
            first = sorted(p.name for p in src.iterdir() if p.name.endswith(".safetensors"))[0]
            shutil.copy2(src / first, dst / first)
            (dst / ".tokenizer.json.gpudoctor-part").write_bytes(b"half")
        return SimpleNamespace(src=src, dst=dst)

    def run(c, f):
        st.apply_stage(st.plan_stage(str(c.src), str(c.dst), check_busy=False), jobs=2)

    return Writer("model.stage_cli" + ("" if world == "empty" else f"@{world}"), "state", setup, run,
                  locks=(".gpudoctor-stage.lock",), may_vanish=("shm/m/*",), invariants=(inv.marker_vouches("shm/m"),))


def known_hosts() -> Writer:
    """A newly trusted SSH host key appended to known_hosts (host/ssh.py, host_key_policy accept-new)."""
    from gpudoctor.host.ssh import _append_known_host

    key = SimpleNamespace(get_name=lambda: "ssh-ed25519", get_base64=lambda: "AAAAC3NzaC1lZDI1NTE5AAAAIExample")

    def setup(base):
        (base / "ssh").mkdir(mode=0o700)
        (base / "ssh" / "known_hosts").write_text("[old]:22 ssh-ed25519 AAAAold\n")
        return SimpleNamespace(path=base / "ssh" / "known_hosts")

    def run(c, f):
        _append_known_host(str(c.path), "[gpu1]:22", key)

    return Writer("ssh.known_hosts", "state", setup, run, logs=("ssh/known_hosts",))


STATE_WRITERS = [recovery_store, lambda: recovery_store(corrupt=True), daemon_state,
                 lambda: daemon_state(corrupt=True), audit_log, lambda: audit_log("torn"), host_lock,
                 bench_results, lambda: bench_results(retract=True), campaign_meta, heals, snapshot_output,
                 prom_textfile, stage_cli, lambda: stage_cli("restage"), lambda: stage_cli("partial"), known_hosts]


def all_writers() -> list[Writer]:
    from gpudoctor import remedies

    missing = sorted(set(remedies.REMEDIES) - set(REMEDY_WRITERS))
    if missing:
        raise LookupError(f"remedies without a crash scenario in tests/crash/writers.py: {', '.join(missing)}")
    return ([REMEDY_WRITERS[rid]() for rid in remedies.REMEDIES] + [w() for w in REMEDY_WORLDS]
            + [w() for w in STATE_WRITERS])
