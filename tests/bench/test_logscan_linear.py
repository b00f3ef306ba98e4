"""Log scans are linear in their input: a 1 MB hostile log costs about ten times a 100 kB one, never a hundred.

The hostile logs are built from the knowledge base itself: for every known failure, the literal words of its pattern
(the first half of `A.*B` without the B, so the search fails the slow way), one per line and all on one long line,
under every logger prefix; its `also` words are left out so the whole-log condition keeps failing. Ratios, not
absolute times, and CPU time of this thread (two shared cores): the 100 kB one best of three.
"""

from __future__ import annotations

import re
import time

import pytest

from gpudoctor.bench.server import logscan
from gpudoctor.catalog.xid import parse_line
from gpudoctor.gather.kernel_log import parse_dmesg

SMALL, BIG = 100_000, 1_000_000
MAX_RATIO = 20  # linear is ~10; quadratic is ~100
PREFIXES = ["", "[2026-12-01 10:00:00 TP0] ", "Dec 01 10:00:00 host python3[42]: ",
            "ERROR 12-01 10:00:00 [core.py:1] ", "[rank0]:"]


def literals(pattern: str) -> list[str]:
    """The literal runs of a regex source (escapes undone), three characters or more."""
    runs = re.findall(r"(?:\\.|[^\\()\[\]|?*+{}^$.])+", pattern)
    return [r for r in (re.sub(r"\\(.)", r"\1", x).strip() for x in runs) if len(r) >= 3]


def hostile(words: list[str], size: int) -> str:
    """`size` characters: the words one per line under each prefix, then all of them over and over on one line."""
    unit = "".join(f"{p}{w}\n" for w in words for p in PREFIXES)
    half = (unit * (size // 2 // len(unit) + 1))[: size // 2]
    half = half[: half.rfind("\n") + 1]
    line = " ".join(words) + " "
    return half + (line * (size // 2 // len(line) + 1))[: size // 2] + "\n"


def best(fn, text: str, runs: int = 3) -> float:
    out = []
    for _ in range(runs):
        t0 = time.thread_time()
        fn(text)
        out.append(time.thread_time() - t0)
    return min(out)


def ratio(fn, words: list[str]) -> tuple[float, float, float]:
    small, big = best(fn, hostile(words, SMALL)), best(fn, hostile(words, BIG), runs=1)  # noise only raises it
    return big / max(small, 1e-4), small, big


def cases() -> list[tuple[str, list[str]]]:
    out = []
    for k in logscan.knowledge():
        words = literals(k.match.pattern) + (literals(k.near.pattern) if k.near else [])
        # example lines cut before their last character: the start of the message without its end
        m = k.match.search(logscan.message(k.example))
        if m and m.end() - m.start() > 4:
            words.append(logscan.message(k.example)[m.start(): m.end() - 1])
        out.append((k.id, words))
    out.append(("generic", [w for _, p in logscan.GENERIC for w in literals(p.pattern)] + ["] ValueError", "Error:"]))
    return out


@pytest.mark.parametrize("name, words", cases(), ids=[c[0] for c in cases()])
def test_diagnose_is_linear_on_a_hostile_log_built_from_each_known_failure(name, words):
    def explain(text):  # what `sglang explain` and a campaign's crash record do with a log
        logscan.diagnose(text)
        logscan.excerpt(text)

    r, small, big = ratio(explain, words)
    assert r < MAX_RATIO, f"{name}: 1 MB took {big:.3f}s, 100 kB {small:.3f}s: ratio {r:.0f} (words {words!r})"


def test_the_issue_log_a_max_running_zero_flood_without_the_hybrid_words():
    """The reported case: 'max_running_request is zero' on every line and no mamba/ssm word: the hybrid entry's
    whole-log `also` was searched again for every line (560 kB took more than 60 s)."""
    line = "[2026-12-01 10:00:00 TP0] AssertionError: max_running_request is zero\n"
    found = logscan.diagnose(line * (SMALL // len(line)))
    assert found is not None and found.id == "max-running-zero"
    r, small, big = ratio(logscan.diagnose, [line.strip()])
    assert r < MAX_RATIO, (small, big)


def test_the_rewritten_patterns_match_what_they_matched():
    kb = {k.id: k for k in logscan.knowledge()}
    nccl, kv = kb["nccl-timeout"].match, kb["vllm-kv-cache-below-max-model-len"].match
    for line, hit in [("[E ProcessGroupNCCL.cpp:1] Timeout at NCCL work: 5", True),
                      ("NCCL NCCL ProcessGroupNCCL x timed out", True), ("ProcessGroupNCCL ready", False),
                      ("timed out before NCCL", False), ("NCCL op timed out", True)]:
        assert bool(nccl.search(line)) is hit, line
    m = kv.search("max seq len (7) x max seq len (9) is larger than the available KV cache memory (1 GiB)")
    assert m and m.group("len") == "7"
    assert not kv.search("larger than the available KV cache memory; max seq len (7)")


def test_kernel_log_xid_parsing_is_linear():
    xid = "[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=" + "'<unknown>', name=" * 3 + "x, GPU has fallen off\n"
    junk = "NVRM: Xid (PCI:0000:3b:00): " + "pid=1, name=" * 20 + "\n"

    def parse(text):
        for t, msg in parse_dmesg(text, 100.0, None):
            parse_line(msg, t)
        for ln in text.splitlines():
            parse_line(ln)

    r, small, big = ratio(parse, [xid.strip(), junk.strip(), "NVRM: Xid (PCI:0000:3b:00): 79, " + "pid=" * 50])
    assert r < MAX_RATIO, (small, big)
