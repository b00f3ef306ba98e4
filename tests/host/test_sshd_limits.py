"""A refused login is not repeated at once (host/sshd_limits.py, issue #34), against this machine's real sshd (the
lab's: any OpenSSH). Each refused login costs an OpenSSH >= 9.8 node a penalty for this address; the same login is
tried again as soon as what decides it (identity files, known_hosts) changes. tests/host/test_openssh10.py shows the
effect on Debian 13's sshd itself."""

from __future__ import annotations

import shutil

import pytest

from gpudoctor.errors import HostKeyError, LoginRefused
from gpudoctor.host import sshd_limits
from tests.sshd import keygen


@pytest.fixture(autouse=True)
def _fresh():
    sshd_limits.forget()
    yield
    sshd_limits.forget()


def test_a_wrong_key_is_refused_once_then_tried_again_when_the_key_changes(sshd, tmp_path):
    key = keygen(tmp_path / "key")  # not in the server's authorized_keys
    a = sshd.make_host(name="a", identity_files=[str(key)])
    b = sshd.make_host(name="b", identity_files=[str(key)])
    with pytest.raises(LoginRefused) as first:
        a.connect()
    assert "authentication failed" in str(first.value) and "not tried again" not in str(first.value)
    with pytest.raises(LoginRefused) as second:
        b.connect()  # the same login: told at once, nothing sent to the server
    msg = str(second.value)
    assert msg.startswith("b: authentication failed") and "not tried again" in msg and "(for a)" in msg
    assert "PerSourcePenalties" in msg
    # the key is fixed (the accepted one copied over it): tried at once, and it logs in
    shutil.copy(sshd.client_key, key)
    b.run(["true"])
    assert b.connected
    b.close()
    a.close()


def test_an_unknown_host_key_is_refused_once_until_known_hosts_changes(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    a = sshd.make_host(name="a", known_hosts=str(kh))
    b = sshd.make_host(name="b", known_hosts=str(kh))
    with pytest.raises(HostKeyError, match="unknown SSH host key"):
        a.connect()
    with pytest.raises(HostKeyError, match="not tried again"):
        b.connect()
    sshd.write_known_hosts(kh)  # the operator accepts the key: the next connect tries
    b.connect()
    assert b.connected
    b.close()
    a.close()
