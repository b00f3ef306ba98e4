"""The portable write program never turns a stdin cut short (a connection lost mid-send) into a file."""

import errno
from dataclasses import dataclass

import pytest

from gpudoctor.host.base import Host
from gpudoctor.host.local import LocalHost


@dataclass
class HalfInputHost(Host):
    """Runs locally but delivers only half of the input, as a connection cut mid-send would."""

    def __post_init__(self):
        self._local = LocalHost()
        self.python = self._local.python

    def run(self, argv, timeout=None, input=None, env=None):
        if input:
            input = input[: len(input) // 2]
        return self._local.run(argv, timeout=timeout, input=input, env=env)


def test_short_input_writes_nothing(tmp_path):
    host = HalfInputHost()
    with pytest.raises(OSError) as e:
        host.write_file(str(tmp_path / "t.tmp"), b"x" * 1000, mode=0o640, exclusive=True)
    assert e.value.errno == errno.EIO and "short input: 500 of 1000" in str(e.value)
    assert not (tmp_path / "t.tmp").exists()
    Host.write_file(LocalHost(), str(tmp_path / "whole"), b"y" * 1000)  # the same program, whole input: written
    assert (tmp_path / "whole").read_bytes() == b"y" * 1000
