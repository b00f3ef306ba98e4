"""Completion in the real bash, zsh and fish (#49): the inventory's hosts, check ids, gate profiles and remedy ids
complete; old spellings (`--verbose-findings`) are never offered. Each shell runs the script `gpudoctor completion
SHELL` prints, which calls the installed console script back, as a user's shell does:

- bash: the script sourced, COMP_WORDS/COMP_CWORD set, its function called, COMPREPLY read;
- zsh: an interactive `zsh -f` on a pty with compinit, the script sourced, the words typed and TAB pressed; what zsh
  lists (or inserts) is read from the terminal;
- fish: the script sourced, `complete -C 'gpudoctor …'`."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.console import console_script, gpudoctor
from tests.needs import need

INVENTORY = """\
hosts:
  ct200:
    address: 192.0.2.10
    groups: [lab]
  gpu1:
    address: 192.0.2.11
    groups: [lab, h200]
proxmox:
  kpro6:
    address: 192.0.2.2
profiles:
  nightly: ["devices.*"]
"""

# (the words after `gpudoctor`, the last one being completed; what must be offered; what must not)
CASES = {
    "check-host": ("check --inventory {inv} --host ", {"ct200", "gpu1", "local"}, {"kpro6"}),
    "lxc-host": ("lxc audit --inventory {inv} --host ", {"ct200", "kpro6"}, set()),
    "check-group": ("check --inventory {inv} --group ", {"lab", "h200"}, {"ct200"}),
    "check-explain": ("check --explain devices.node.", {"devices.node.major", "devices.node.open",
                                                        "devices.node.present"}, set()),
    "gate-profile": ("gate --inventory {inv} --profile ", {"default", "serve", "benchmark", "nightly"}, set()),
    "fix-only": ("fix --only devices.", {"devices.node.create", "devices.node.mode"}, set()),
    "check-hidden": ("check --verb", set(), {"--verbose-findings"}),
    "lxc-hidden": ("lxc audit --verb", set(), {"--verbose-findings"}),
    "check-options": ("check --all", {"--all", "--all-findings"}, {"--verbose-findings"}),
}


@pytest.fixture(scope="module")
def inv(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("completion") / "inventory.yaml"
    p.write_text(INVENTORY)
    return str(p)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GPUDOCTOR_INVENTORY"}
    env["PATH"] = f"{Path(console_script()).parent}:{env.get('PATH', '')}"
    return env


def _script(shell: str, tmp_path: Path) -> Path:
    r = gpudoctor("completion", shell)
    assert r.returncode == 0, r.stderr
    p = tmp_path / f"gpudoctor.{shell}"
    p.write_text(r.stdout)
    return p


def _check(got: set[str], want: set[str], never: set[str], words: str) -> None:
    assert want <= got, (words, sorted(got))
    assert not (never & got), (words, sorted(got))


def bash_complete(script: Path, words: str) -> set[str]:
    # a trailing space: the word being completed is the empty one after the last (as bash's readline gives it)
    prog = (f"source {script}\nCOMP_WORDS=(gpudoctor {words}); "
            f"COMP_CWORD={len(words.split()) + (1 if words.endswith(' ') else 0)}; _gpudoctor_completion gpudoctor; "
            'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run([need("bash"), "--norc", "--noprofile", "-c", prog], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def fish_complete(script: Path, words: str) -> set[str]:
    r = subprocess.run([need("fish"), "--no-config", "-c", f"source {script}; complete -C 'gpudoctor {words}'"],
                       capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    return {ln.split("\t", 1)[0] for ln in r.stdout.splitlines() if ln}


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[=>()][0-9A-Za-z]?|[\r\x07\x08]")


class Zsh:
    """An interactive `zsh -f` on a pty, with compinit and the script; `complete(words)` types them and TAB."""

    def __init__(self, script: Path):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            env = {**_env(), "TERM": "dumb", "PS1": "> ", "HOME": str(script.parent)}
            os.execve(need("zsh"), ["zsh", "-f", "-i"], env)
        self.n = 0
        self.send(f"autoload -Uz compinit && compinit -u -D; source {script}; LISTMAX=1000; unsetopt beep list_ambiguous; "
                  "zstyle ':completion:*' list-prompt ''\n")
        self.read_to_mark()

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def read_to_mark(self, timeout: float = 60) -> str:
        """Everything until the shell printed a fresh marker (an echo typed after the completion)."""
        self.n += 1
        self.send(f"\x15echo MARK$(( {self.n} * 1000 + 1 ))\n")
        want, out, deadline = f"MARK{self.n * 1000 + 1}", b"", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.5)[0]:
                try:
                    out += os.read(self.fd, 65536)
                except OSError:
                    break
                if re.search(rf"(^|\n){want}\b", _ANSI.sub("", out.decode("utf-8", "replace"))):
                    return _ANSI.sub("", out.decode("utf-8", "replace"))
        raise AssertionError(f"zsh did not answer: {out[-2000:]!r}")

    def complete(self, words: str) -> set[str]:
        self.send(f"gpudoctor {words}\t")
        time.sleep(0.05)  # the TAB's widget runs before the kill-line of read_to_mark
        text = self.read_to_mark()
        text = text.rsplit("\n", 1)[0]
        return set(re.findall(r"(?<![\w.-])([\w][\w.-]*|--[\w-]+)(?![\w.-])", text))

    def close(self) -> None:
        os.close(self.fd)
        os.waitpid(self.pid, 0)


@pytest.mark.parametrize("words, want, never", CASES.values(), ids=CASES)
def test_bash_completes_hosts_check_ids_and_profiles(words, want, never, inv, tmp_path):
    w = words.format(inv=inv)
    _check(bash_complete(_script("bash", tmp_path), w), want, never, w)


@pytest.mark.parametrize("words, want, never", CASES.values(), ids=CASES)
def test_fish_completes_hosts_check_ids_and_profiles(words, want, never, inv, tmp_path):
    w = words.format(inv=inv)
    _check(fish_complete(_script("fish", tmp_path), w), want, never, w)


def test_zsh_completes_hosts_check_ids_and_profiles(inv, tmp_path):
    need("zsh")
    z = Zsh(_script("zsh", tmp_path))
    try:
        for words, want, never in CASES.values():
            w = words.format(inv=inv)
            _check(z.complete(w), want, never, w)
    finally:
        z.close()


def test_a_bad_inventory_completes_to_nothing_and_says_nothing(tmp_path):
    bad = tmp_path / "inventory.yaml"
    bad.write_text("hosts: [\n")
    env = {**_env(), "_GPUDOCTOR_COMPLETE": "bash_complete", "COMP_WORDS": f"gpudoctor check --inventory {bad} --host ",
           "COMP_CWORD": "5"}
    r = subprocess.run([console_script()], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr == ""  # click prints an empty line
