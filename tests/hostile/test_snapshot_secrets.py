"""A snapshot carries no secret of the machine it was taken on (#40, docs/security.md).

PID 1 of a fresh PID namespace (unshare --pid --fork --mount-proc) is started with HF_TOKEN, a cloud key and a
password beside the keys diagnosis reads; `gpudoctor snapshot -o` runs inside it. Every read in the transcript is
decoded and searched for the secrets; the container marker and the GPU variables must still be there, and the
replay must still see the container. A snapshot from before #40 (the whole environment recorded) still replays.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess

from tests import needs
from tests.console import console_script

SECRETS = {"HF_TOKEN": "hf_s3cretTOKENvalue", "AWS_SECRET_ACCESS_KEY": "aws-s3cret-key-value",
           "DB_PASSWORD": "pa55w0rd-value", "NVIDIA_API_KEY": "nvapi-s3cret-value"}
KEPT = {"container": "lxc", "NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"}


def decoded(doc: dict) -> bytes:
    """Every byte the snapshot carries: its JSON text plus each recorded read, decoded."""
    out = [json.dumps(doc).encode()]
    for rec in (doc.get("transcript") or {}).values():
        if isinstance(rec, dict) and rec.get("data_b64"):
            out.append(base64.b64decode(rec["data_b64"]))
    return b"\n".join(out)


def test_a_snapshot_keeps_no_secret_of_pid_1s_environment(tmp_path):
    needs.root()
    if shutil.which("unshare") is None:
        needs.missing("unshare")
    out = tmp_path / "snap.json"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPUDOCTOR_INVENTORY": "", **SECRETS, **KEPT}
    # PID 1 of the new namespace is `sh`, whose environment is env; gpudoctor is its child.
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$0" snapshot -o "$1"',
                        console_script(), str(out)], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert out.is_file(), r.stderr
    doc = json.loads(out.read_text())
    environ = next(v for k, v in doc["transcript"].items() if k == '["read","/proc/1/environ"]')
    kept = base64.b64decode(environ["data_b64"]).split(b"\0")
    for k, v in KEPT.items():
        assert f"{k}={v}".encode() in kept
    assert b"NVIDIA_API_KEY=<redacted>" in kept  # an allowed prefix with a secret's name: the name, not the value
    blob = decoded(doc)
    for k, v in SECRETS.items():
        assert v.encode() not in blob, f"{k}'s value is in the snapshot"
    assert b"HF_TOKEN" not in blob and b"AWS_SECRET_ACCESS_KEY" not in blob
    # the replay still sees what the environment told: an LXC container
    from gpudoctor.target import snapshot_facts

    assert snapshot_facts(doc)["host"]["container"]["kind"] == "lxc"


def test_a_snapshot_recorded_with_the_whole_environment_still_replays(tmp_path):
    """Snapshots taken before #40 hold PID 1's whole environment: they replay as before (the container seen)."""
    from gpudoctor.host.replay import ReplayHost
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.gather.hostinfo import gather

    raw = b"\0".join(f"{k}={v}".encode() for k, v in {**SECRETS, **KEPT}.items()) + b"\0"
    key = '["read","/proc/1/environ"]'
    host = ReplayHost(transcript={key: {"path": "/proc/1/environ", "error": None,
                                        "data_b64": base64.b64encode(raw).decode()}})
    facts = gather(host, GatherContext(name="old", timeout=3))
    assert facts["container"] == {"kind": "lxc", "evidence": ["/proc/1/environ has container=lxc"]}


def test_scrub_keeps_the_allow_list_and_redacts_secret_names():
    from gpudoctor.host.environ import REDACTED, scrub_raw

    env = {**SECRETS, **KEPT, "LD_LIBRARY_PATH": "/usr/lib", "SSH_AUTH_SOCK": "/tmp/agent", "HOME": "/root",
           "NCCL_IB_HCA": "mlx5", "CUDA_AUTH_TOKEN": "x"}
    raw = b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
    assert dict(x.decode().split("=", 1) for x in scrub_raw(raw).split(b"\0") if x) == {
        **KEPT, "LD_LIBRARY_PATH": "/usr/lib", "NCCL_IB_HCA": "mlx5", "NVIDIA_API_KEY": REDACTED,
        "CUDA_AUTH_TOKEN": REDACTED}


# A serving process's command line as SGLang's users write it (#47): secrets as flags, as flag=value, after `env`.
ARGV_SECRETS = {"--api-key": "sk-s3cret-api-key", "--hf-token": "hf_s3cretFLAGtoken", "--admin-password": "pw-s3cret"}


def test_a_snapshot_keeps_no_secret_of_a_servers_command_line(tmp_path):
    """A process listening on the serving port is recorded with its command line (gather/procs.py): the values of
    secret-looking flags and NAME=value items are redacted on the target, the rest kept; replayed as before."""
    import socket
    import sys
    import time

    needs.root()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = ("import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); print('up', flush=True)\n"
             "while True: s.accept()[0].close()")
    argv = [sys.executable, "-c", serve, str(port), "-m", "sglang.launch_server", "--model-path", "/models/x",
            "--api-key", ARGV_SECRETS["--api-key"], f"--hf-token={ARGV_SECRETS['--hf-token']}",
            "--admin-password", ARGV_SECRETS["--admin-password"], "HF_TOKEN=hf_envSTYLEs3cret",
            "--max-total-tokens", "4096", "--tokenizer-path", "/models/tok"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().strip() == b"up"
        out = tmp_path / "snap.json"
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPUDOCTOR_INVENTORY": ""}
        r = subprocess.run([console_script(), "snapshot", "--sglang-url", f"http://127.0.0.1:{port}", "-o", str(out)],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert out.is_file(), r.stderr
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads(out.read_text())
    blob = decoded(doc)
    for flag, v in {**ARGV_SECRETS, "HF_TOKEN=": "hf_envSTYLEs3cret"}.items():
        assert v.encode() not in blob, f"{flag}'s value is in the snapshot"
    from gpudoctor.target import snapshot_facts

    listener = snapshot_facts(doc)["procs"]["listeners"][str(port)][0]
    cmd = listener["cmdline"]
    assert listener["pid"] == proc.pid
    assert "--api-key <redacted>" in cmd and "--hf-token=<redacted>" in cmd and "HF_TOKEN=<redacted>" in cmd, cmd
    assert "--admin-password <redacted>" in cmd and "--model-path /models/x" in cmd, cmd
    assert "--max-total-tokens 4096" in cmd and "--tokenizer-path /models/tok" in cmd, cmd  # not secrets

    # A snapshot from before #47 recorded the command line whole: its replay shows it redacted all the same.
    old = json.loads(out.read_text())
    for k, rec in old["transcript"].items():
        if isinstance(rec, dict) and '"listeners"' in (rec.get("stdout") or ""):
            rec["stdout"] = rec["stdout"].replace("--api-key <redacted>", f"--api-key {ARGV_SECRETS['--api-key']}")
            break
    else:
        raise AssertionError("no process scan in the snapshot's transcript")
    assert ARGV_SECRETS["--api-key"].encode() in decoded(old)
    replayed = snapshot_facts(old)["procs"]["listeners"][str(port)][0]["cmdline"]
    assert "--api-key <redacted>" in replayed and ARGV_SECRETS["--api-key"] not in replayed, replayed


def test_redact_argv_is_the_environments_rule():
    from gpudoctor.host.environ import REDACTED, redact_argv, secret_name

    assert redact_argv(["--token", "t", "--password=p", "--secret", "s", "--port", "1", "DB_PASSWORD=x", "A=b",
                        "--no-auth", "--port", "2"]) == [
        "--token", REDACTED, f"--password={REDACTED}", "--secret", REDACTED, "--port", "1", f"DB_PASSWORD={REDACTED}",
        "A=b", "--no-auth", "--port", "2"]  # a flag with no value: the next flag is kept
    assert [secret_name(n) for n in ("HF_TOKEN", "api-key", "NVIDIA_API_KEY", "max-total-tokens", "tokenizer-path",
                                     "port")] == [True, True, True, False, False, False]
