"""No value that reaches SSHHost can run shell: each payload tries to create a marker file, which must not exist."""

from __future__ import annotations

import pytest

PAYLOADS = [
    "; touch {m}",
    "$(touch {m})",
    "`touch {m}`",
    "' ; touch {m}; '",
    '" ; touch {m}; "',
    "\ntouch {m}\n",
    "x && touch {m}",
    "| touch {m}",
    "$(touch${{IFS}}{m})",
    "\\'; touch {m} #",
]


@pytest.fixture(params=range(len(PAYLOADS)), ids=[p.strip().split()[0][:12] or "nl" for p in PAYLOADS])
def payload(request, tmp_path):
    marker = tmp_path / "marker"
    yield PAYLOADS[request.param].format(m=marker), marker
    assert not marker.exists(), f"payload {PAYLOADS[request.param]!r} ran a shell command"


def test_argv_values_arrive_literally(ssh_host, payload):
    value, _ = payload
    r = ssh_host.run(["printf", "%s", value])
    assert (r.rc, r.stdout) == (0, value)


def test_env_values_arrive_literally(ssh_host, payload):
    value, _ = payload
    r = ssh_host.run(["sh", "-c", 'printf "%s" "$V"'], env={"V": value})
    assert r.stdout == value


def test_env_names_are_validated(ssh_host, payload):
    value, _ = payload
    with pytest.raises(ValueError):
        ssh_host.run(["true"], env={value: "x"})


def test_python_interpreter_value_is_one_argument(sshd, payload):
    value, _ = payload
    host = sshd.make_host(python=["python3" + value])
    st = host.stat("/dev/null", timeout=30)
    assert not st.exists and st.error.startswith("PROBE_FAILED rc=127")
    assert host.try_open_many(["/dev/null"], timeout=30)["/dev/null"].startswith("PROBE_FAILED")
    host.close()


def test_paths_of_every_file_operation(ssh_host, payload, tmp_path):
    value, _ = payload
    p = str(tmp_path / ("f" + value))
    assert ssh_host.read_file(p, timeout=30).error in ("ENOENT", "ENAMETOOLONG")
    assert ssh_host.stat(p, timeout=30).exists is False
    assert ssh_host.try_open_many([p], timeout=30)[p] in ("ENOENT", "ENAMETOOLONG")
    assert ssh_host.listdir(p, timeout=30) in ("ENOENT", "ENAMETOOLONG")
    assert "error" in ssh_host.statvfs(p, timeout=30)


def test_written_file_names_are_literal(ssh_host, payload, tmp_path):
    value, _ = payload
    name = "conf" + value.replace("/", "_")
    target = tmp_path / name
    ssh_host.write_file(str(tmp_path / ".tmp"), b"x")
    ssh_host.rename(str(tmp_path / ".tmp"), str(target))
    assert target.read_bytes() == b"x"


def test_path_prepend_values_are_quoted(sshd, payload, tmp_path):
    value, _ = payload
    host = sshd.make_host(path_prepend=[str(tmp_path / value)])
    r = host.run(["sh", "-c", 'printf "%s" "$PATH"'])
    assert r.stdout.startswith(str(tmp_path / value) + ":")
    host.close()


def test_a_command_named_by_a_hostile_path_runs_only_itself(ssh_host, payload, tmp_path):
    """A `pct` stand-in at a path full of shell syntax runs as exactly that program."""
    value, _ = payload
    d = tmp_path / ("bin" + value.replace("/", "_"))
    d.mkdir()
    tool = d / "pct"
    tool.write_text("#!/bin/sh\necho \"stand-in $*\"\n")
    tool.chmod(0o755)
    r = ssh_host.run([str(tool), "list", value])
    assert (r.rc, r.stdout) == (0, f"stand-in list {value}\n")
