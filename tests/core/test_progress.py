"""gpudoctor.progress.Waiting (#41: `check --all` and `inventory ping` were silent while they waited on hosts, up to
--host-timeout): on a terminal one redrawn line says who answered and who is awaited, erased at the end; to a pipe
nothing at all."""

from __future__ import annotations

import io
import time

from gpudoctor.progress import Waiting


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_it_names_who_is_awaited_and_erases_itself():
    out = Tty()
    with Waiting("check --all", ["ct200", "ct201", "ct202", "ct203", "ct204"], stream=out, interval=0.02) as w:
        w.done("ct200")
        w.done("ct202")
        time.sleep(0.15)
        assert "2 of 5 hosts answered; waiting on ct201, ct203, ct204 (" in out.getvalue()
        for n in ("ct201", "ct203", "ct204"):
            w.done(n)
        time.sleep(0.1)
    text = out.getvalue()
    assert "5 of 5 hosts answered (" in text
    assert text.endswith("\r") and text.rsplit("\r", 2)[-2].strip() == ""  # the last draw erased


def test_more_than_three_awaited_are_counted_and_hostile_names_escaped():
    w = Waiting("inventory ping", ["a", "b\x1b[2J", "c", "d", "e"], stream=Tty())
    assert w.line().startswith("inventory ping: 0 of 5 hosts answered; waiting on a, b\\x1b[2J, c and 2 more (")


def test_to_a_pipe_nothing_is_written():
    out = io.StringIO()
    with Waiting("check --all", ["a", "b"], stream=out, interval=0.01):
        time.sleep(0.05)
    assert out.getvalue() == ""


def test_beneath_the_cli_wrapper_the_carriage_return_reaches_the_terminal():
    """cli.main wraps stderr in term.SafeStream, which escapes control characters: the progress line goes beneath it
    (its text is printable already), so the terminal gets a real \\r, not the four characters '\\r'."""
    from gpudoctor.term import SafeStream

    raw = Tty()
    with Waiting("check --all", ["a", "b"], stream=SafeStream(raw), interval=0.02) as w:
        w.done("a")
        time.sleep(0.1)
    text = raw.getvalue()
    assert "\r" in text and "\\r" not in text and "1 of 2 hosts answered; waiting on b (" in text
