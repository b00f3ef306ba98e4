"""A Slurm gpudoctor does not know (older than 22.05, newer than 24.11, or no version shown) is said in one line with
what was read where, and the node is left as it is — its drain/resume behaviour is never guessed (#42 item 5).
The version is the node's Version= in `scontrol show node` (the read gpudoctor already makes); scontrol is a stand-in
script on PATH (tests/gate/test_slurm_reads.py's), in scontrol's words."""

from __future__ import annotations

import pytest

from gpudoctor.gate import GateResult
from gpudoctor.host.local import LocalHost
from gpudoctor.integrations.slurm import apply, parse_show_node, version_problem

from tests.gate.test_slurm_reads import sc  # noqa: F401 - the stand-in scontrol fixture

SHOW = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=32\n"
        "   NodeAddr=gpu01 NodeHostName=gpu01 {version}\n"
        "   State=IDLE+DRAIN ThreadsPerCore=1\n"
        "   Reason=gpudoctor: Xid 79 on GPU 0 [root@2024-05-02T09:00:00]\n")


def passing():
    return GateResult("gpu01", "default")


@pytest.mark.parametrize("version, words", [
    ("Version=21.08.8", "Slurm 21.08.8 (Version= of `scontrol show node gpu01`) is older than the releases gpudoctor "
                        "knows (22.05 to 24.11): how it keeps a drain and its reason across a resume is not guessed"),
    ("Version=25.05.1", "Slurm 25.05.1 (Version= of `scontrol show node gpu01`) is newer than the releases gpudoctor "
                        "knows (22.05 to 24.11)"),
    ("Version=(null)", "the Slurm version is unknown (`scontrol show node gpu01` shows Version=(null)); gpudoctor "
                       "drains and resumes only on the releases it knows (22.05 to 24.11)"),
    ("", "the Slurm version is unknown (`scontrol show node gpu01` shows no Version=)"),
], ids=["older", "newer", "null", "absent"])
def test_an_unknown_slurm_leaves_the_node_in_one_line(sc, version, words):  # noqa: F811
    tmp, calls = sc
    (tmp / "show").write_text(SHOW.format(version=version))
    act = apply(passing(), LocalHost(), node="gpu01")  # a pass would resume this gpudoctor drain on a known Slurm
    assert act.action == "kept" and act.argv is None
    assert act.detail.startswith("gpu01 left as is: ") and words in act.detail, act.detail
    assert "\n" not in act.detail
    assert not [c for c in calls() if c.startswith("update")]


@pytest.mark.parametrize("version", ["22.05.8", "23.02.7", "23.11.4", "24.05.0", "24.11.5"])
def test_a_known_slurm_is_resumed_as_before(sc, version):  # noqa: F811
    tmp, calls = sc
    (tmp / "show").write_text(SHOW.format(version=f"Version={version}"))
    assert version_problem(version, "gpu01") is None
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "resumed" and act.argv == ["scontrol", "update", "nodename=gpu01", "state=resume"]


def test_a_version_in_someone_elses_reason_is_not_the_version():
    text = SHOW.format(version="Version=22.05.8").replace("Xid 79 on GPU 0", "upgrade to Version=25.05 pending")
    assert parse_show_node(text).version == "22.05.8"
    text = SHOW.format(version="").replace("Xid 79 on GPU 0", "Version=24.11.1 soon")
    assert parse_show_node(text).version is None
