"""The one-shot carrier of host/ops.py never turns a request cut short on stdin (a connection lost mid-send) into a
file."""

import errno
from dataclasses import dataclass

import pytest

from gpudoctor.host.base import Host
from gpudoctor.host.local import LocalHost


@dataclass
class HalfInputHost(Host):
    """Carries requests one-shot through a local run() that delivers only half of the input, as a connection cut
    mid-send would (cut=False: all of it)."""

    cut: bool = True

    def __post_init__(self):
        self._local = LocalHost()
        self.python = self._local.python

    def run(self, argv, timeout=None, input=None, env=None):
        if input and self.cut:
            input = input[: len(input) // 2]
        return self._local.run(argv, timeout=timeout, input=input, env=env)


def test_short_input_writes_nothing(tmp_path):
    host = HalfInputHost()
    with pytest.raises(OSError) as e:
        host.write_file(str(tmp_path / "t.tmp"), b"x" * 1000, mode=0o640, exclusive=True)
    assert e.value.errno == errno.EIO and "short input: " in str(e.value)
    assert not (tmp_path / "t.tmp").exists()
    HalfInputHost(cut=False).write_file(str(tmp_path / "whole"), b"y" * 1000)  # the same carrier, whole: written
    assert (tmp_path / "whole").read_bytes() == b"y" * 1000
