"""The config model: byte-for-byte round trip, sections as pve-container's parse_pct_config assigns them, values."""

import pytest

from gpudoctor.errors import ConfigError
from gpudoctor.proxmox import config as C

from .conftest import BAD_CONFIGS, CONFIGS, corpus


def variants(data: bytes):
    """Every corpus file as is, with CRLF endings, without its final newline, with trailing whitespace."""
    yield data
    yield data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    yield data.rstrip(b"\n")
    yield b"".join(ln.rstrip(b"\n") + b" \t\n" for ln in data.splitlines(keepends=True))


@pytest.mark.parametrize("path", corpus(), ids=lambda p: p.name)
def test_round_trip_byte_for_byte(path):
    data = path.read_bytes()
    n = 0
    for v in variants(data):
        cfg = C.parse(v, str(path))
        assert cfg.data == v
        assert [ln.no for ln in cfg.lines] == list(range(1, len(cfg.lines) + 1))
        assert len(cfg.lines) == v.count(b"\n") + (0 if v.endswith(b"\n") or not v else 1)
        n += 1
    assert n == 4


def test_sections_follow_headers_and_appended_line_lands_in_last_section():
    cfg = C.parse((CONFIGS / "201-snapshots.conf").read_bytes(), "201.conf")
    assert cfg.sections == ["", "before-driver", "after-driver"]
    assert cfg.snapshots == ["before-driver", "after-driver"]
    assert cfg.parent == "after-driver"
    last = cfg.lines[-1]
    assert last.text == "c 511:* rwm" and last.section == "after-driver" and last.bare_rule is not None
    assert cfg.first_header.no == 17
    assert [ln.rule.major for ln in cfg.rules()] == [195, 509]
    assert [ln.rule.major for ln in cfg.rules("after-driver")] == [195, 509, 511]
    assert cfg.get("snaptime", "before-driver") == "1760000000"
    assert cfg.get("snaptime") is None  # not in the live section


def test_pending_section_and_equals_form():
    cfg = C.parse((CONFIGS / "202-pending.conf").read_bytes(), "202.conf")
    assert cfg.sections == ["", C.PENDING]
    live = cfg.rules()
    assert len(live) == 1 and live[0].sep == "=" and str(live[0].rule) == "c 195:* rwm"
    assert [m.mount.source for m in cfg.mounts()] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    pend = cfg.section(C.PENDING)
    assert [(ln.key, ln.value) for ln in pend] == [("cores", "32"), ("delete", "swap"),
                                                  (C.ALLOW_KEY, "c 511:* rwm")]
    assert not cfg.invalid  # delete: is fine in [pve:pending]


def test_crlf_values_are_clean_and_eol_detected():
    cfg = C.parse((CONFIGS / "203-crlf.conf").read_bytes(), "203.conf")
    assert cfg.eol == "\r\n"
    assert cfg.get("hostname") == "ct203"
    assert cfg.rules()[0].rule == C.DeviceRule("c", 195, None, "rwm")
    assert cfg.sections == ["", "snap1"]
    assert not cfg.invalid


def test_trailing_whitespace_no_final_newline_and_raw_bytes_survive():
    data = (CONFIGS / "204-trailing-ws-no-eol.conf").read_bytes()
    cfg = C.parse(data, "204.conf")
    assert cfg.data == data and b"\xff" in cfg.data
    assert cfg.get("hostname") == "ct204"
    assert cfg.lines[-1].eol == "" and cfg.lines[-1].rule.major == 226
    assert cfg.eol == "\n"


def test_devn_v1_and_path_rules():
    cfg = C.parse((CONFIGS / "205-devn.conf").read_bytes(), "205.conf")
    devs = {ln.key: ln.device for ln in cfg.passthrough()}
    assert devs["dev0"] == C.Passthrough("dev0", "/dev/nvidia0", gid=44, mode="0666")
    assert devs["dev1"].path == "/dev/nvidiactl" and devs["dev1"].mode == "0666"
    assert devs["dev3"].deny_write is True
    v1 = [ln for ln in cfg.live if ln.deprecated]
    assert [ln.key for ln in v1] == ["lxc.cgroup.devices.allow"]  # lxc.cgroup.dir.* configures LXC: not flagged
    path_rule = [ln.rule for ln in cfg.rules() if ln.rule.path]
    assert path_rule == [C.DeviceRule("", None, None, "r", "/dev/nvidia-caps/nvidia-cap1")]


def test_lock_and_every_malformed_kind_has_its_line_number():
    assert C.parse((CONFIGS / "206-locked.conf").read_bytes(), "206.conf").lock == "backup"
    cfg = C.parse((CONFIGS / "210-malformed-lines.conf").read_bytes(), "210.conf")
    bad = {ln.no: ln.error for ln in cfg.invalid}
    assert sorted(bad) == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert "mode '666'" in bad[4]
    assert "not a valid device path" in bad[5]
    assert "TYPE MAJOR:MINOR ACCESS" in bad[6] and "TYPE MAJOR:MINOR ACCESS" in bad[7]
    assert "not a subset of rwm" in bad[8]
    assert "needs at least SOURCE TARGET FSTYPE" in bad[9]
    assert "unable to parse config: Lock: backup" in bad[10]  # keys are lower case
    assert "unable to parse config" in bad[11] and "unable to parse config" in bad[12]
    assert "only allowed in [pve:pending]" in bad[13]
    assert cfg.lock is None
    assert cfg.lines[-1].rule.major == 195 and not cfg.lines[-1].error


def test_keyless_rule_is_recognised_only_when_it_is_exactly_a_rule():
    cfg = C.parse("arch: amd64\nc 511:* rwm\n  c 511:*   rwm  \nc 511:* rwm please\nb 7:* rw\n", "x.conf")
    assert [str(ln.bare_rule) if ln.bare_rule else None for ln in cfg.lines] == [
        None, "c 511:* rwm", "c 511:* rwm", None, "b 7:* rw"]
    assert "without its key" in cfg.lines[1].error and "meant: lxc.cgroup2.devices.allow: c 511:* rwm" in cfg.lines[1].error


@pytest.mark.parametrize("value,rule", [
    ("a", C.DeviceRule("a")),
    ("c 195:* rwm", C.DeviceRule("c", 195, None, "rwm")),
    ("c *:* m", C.DeviceRule("c", None, None, "m")),
    ("b 8:0 r", C.DeviceRule("b", 8, 0, "r")),
    ("c 10:200", C.DeviceRule("c", 10, 200, "rwm")),
])
def test_rule_grammar(value, rule):
    assert C.DeviceRule.parse(value) == rule
    assert C.DeviceRule.parse(str(rule)) == rule


@pytest.mark.parametrize("value", ["", "c", "c 195", "c 195:* rwx", "c 195:* rr", "d 1:1 r", "c -1:* r", "/dev/x rw"])
def test_rule_grammar_rejects(value):
    with pytest.raises(ValueError):
        C.DeviceRule.parse(value)


def test_matching_wildcards_and_access():
    r = C.DeviceRule.parse("c 511:* rw")
    assert r.matches("c", 511, 0) and r.matches("c", 511, 1) and r.matches("c", 511, None)
    assert not r.matches("c", 509, 0) and not r.matches("b", 511, 0)
    assert r.grants("rw") and not r.grants("rwm")
    assert not C.DeviceRule.parse("c 511:0 rwm").matches("c", 511, None)  # a directory needs every minor


@pytest.mark.parametrize("path", sorted(BAD_CONFIGS.glob("*.conf")), ids=lambda p: p.name)
def test_unusable_files_are_refused_with_a_line(path):
    with pytest.raises(ConfigError) as exc:
        C.read(str(path), path.read_bytes())
    assert exc.value.path == str(path) and exc.value.line is not None
    assert exc.value.one_line().startswith(f"{path}:{exc.value.line}: ")


def test_oversized_and_unreadable():
    with pytest.raises(ConfigError, match="1 MiB"):
        C.read("big.conf", b"arch: amd64\n" + b"#" * (1 << 20))
    with pytest.raises(ConfigError, match="cannot read"):
        C.read("gone.conf", None)
