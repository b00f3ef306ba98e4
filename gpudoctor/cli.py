"""The command line: thin. It parses, calls the library, renders. Subcommands load lazily so `check` starts fast."""

from __future__ import annotations

import importlib
import os
import sys

import click

from gpudoctor import __version__, conventions
from gpudoctor.errors import GpudoctorError
from gpudoctor.exitcodes import EXIT_OK, EXIT_PIPE, EXIT_UNKNOWN
from gpudoctor.term import SafeStream

# name -> "module:attribute"; each command lives in gpudoctor/commands/<module>.py
COMMANDS = {
    "check": ("gpudoctor.commands.check:check", "Diagnose a GPU host layer by layer and name the root cause."),
    "snapshot": ("gpudoctor.commands.check:snapshot", "Gather a host's facts into a JSON snapshot for offline diagnosis."),
    "checks": ("gpudoctor.commands.check:list_checks", "List every check id, its layer and purpose."),
    "fix": ("gpudoctor.commands.fix:fix", "Plan (and with --apply, make) guarded fixes for failing checks."),
    "lxc": ("gpudoctor.commands.lxc:lxc", "Audit and fix a Proxmox LXC container's GPU device boundary."),
    "model": ("gpudoctor.commands.model:model", "Verify and stage model weights (tmpfs, Hugging Face cache)."),
    "gate": ("gpudoctor.commands.gate:gate", "Pre-flight gate: exit 0 only when the host is ready for a campaign."),
    "daemon": ("gpudoctor.commands.daemon:daemon", "Watch the host and heal it after reboots, within budgets."),
    "release": ("gpudoctor.commands.recovery:release", "Verify a host, then return it to service (after an inspection)."),
    "recovery": ("gpudoctor.commands.recovery:recovery", "Where each host stands on the recovery ladder."),
    "bench": ("gpudoctor.commands.bench:bench", "The benchmark stage: load generator, campaigns, reports."),
    "sglang": ("gpudoctor.commands.sglang:sglang", "Validate SGLang arguments before a long model load; explain a failed server log."),
    "inventory": ("gpudoctor.commands.inventory:inventory", "Show the inventory and test SSH to every host."),
    "completion": ("gpudoctor.commands.shell:completion", "Print the shell completion script (bash, zsh, fish)."),
    "manpage": ("gpudoctor.commands.shell:manpage", "Print the manual page, built from every command's help."),
}


def _help_command(args: list[str]) -> list[str]:
    """`gpudoctor help [COMMAND...]` is `gpudoctor [COMMAND...] --help`, as git, kubectl and pip have it."""
    if args[:1] == ["help"]:
        return [*args[1:], "--help"]
    return args


class Interrupted(Exception):
    """Ctrl-C during a command: cli.main says one line and exits 130 (click would print a blank line and Abort)."""


class LazyGroup(conventions.DidYouMeanGroup):
    """A click group whose subcommands are imported only when used; each follows gpudoctor.conventions."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        mod, attr = target.split(":")
        return conventions.adopt(getattr(importlib.import_module(mod), attr))

    def make_context(self, info_name, args, parent=None, **extra):
        extra.setdefault("obj", conventions.Settings())  # before any option's callback runs
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted() from None

    def _main_shell_completion(self, ctx_args, prog_name, complete_var=None):
        from gpudoctor.commands.shell import register  # hosts, check ids, profiles; no hidden spellings

        register()
        return super()._main_shell_completion(ctx_args, prog_name, complete_var)

    def format_commands(self, ctx, formatter):
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, help="Show the version and git commit.",
              callback=lambda ctx, p, v: _print_version(ctx) if v and not ctx.resilient_parsing else None)
@conventions.root_options
def cli():
    """gpudoctor keeps GPU inference hosts healthy.

    \b
    Typical use:
      gpudoctor check                      diagnose this host
      gpudoctor check --host ct200         diagnose an inventory host over SSH
      gpudoctor check --snapshot FILE      diagnose a saved snapshot offline
      gpudoctor fix                        show the plan (dry run); --apply to change
      gpudoctor gate --profile benchmark   pre-flight gate before a campaign
      gpudoctor help COMMAND               a command's help (as COMMAND --help)

    \b
    Global options (-v, -q, --json, --color, -i) go before or after the command.
    Exit codes: 0 ok, 1 warning, 2 failure, 3 unknown or bad input, 130 interrupted (docs/cli.md).
    """


def _print_version(ctx) -> None:
    """--version is eager: --json may come after it on the line (`gpudoctor --version --json`), so look for it there."""
    from gpudoctor.buildinfo import commit

    args = sys.argv[1:] if _ARGV is None else _ARGV
    if "--json" in args[: args.index("--") if "--" in args else len(args)]:
        import json

        click.echo(json.dumps({"schema": "gpudoctor.version/1", "version": __version__, "commit": commit()}))
    else:
        click.echo(f"gpudoctor {__version__} (commit {commit()})")
    ctx.exit(EXIT_OK)


_ARGV: list[str] | None = None  # the command line main() was given (None: sys.argv)


def _is_live_check(args: list[str]) -> bool:
    from gpudoctor.host.early import is_live_check

    return is_live_check(args)


def _prestart_probes(args: list[str]) -> None:
    """A live local check: start the slow probes (cuInit, nvidia-smi) now, unless gpudoctor/entry.py already did
    (the console script starts them before this module is imported)."""
    from gpudoctor.host.early import start_probes

    def gather_argvs(a):  # as gpudoctor/entry.py does; imported here, not from there (entry imports this module)
        from gpudoctor.gather.prestart import argvs

        return argvs(a)

    start_probes(args, more=gather_argvs)


def main(argv=None) -> None:
    """Entry point: run the CLI and turn gpudoctor errors into one line and an exit code.

    stdout and stderr are wrapped in term.SafeStream for the whole run: no byte of input reaches the terminal raw.
    A reader that went away (`gpudoctor checks | head`) ends the run quietly with EXIT_PIPE."""
    global _ARGV
    args = list(sys.argv[1:] if argv is None else argv)
    _ARGV = args
    args = _help_command(args)
    if argv is not None or args != list(sys.argv[1:]):
        argv = args
    conventions.last = conventions.Settings()
    _prestart_probes(args)
    saved = sys.stdout, sys.stderr
    out = _PipeAware(sys.stdout if sys.stdout is not None else _Closed("stdout"), "stdout")
    err = _PipeAware(sys.stderr if sys.stderr is not None else _Closed("stderr"), "stderr")
    sys.stdout, sys.stderr = out, err
    old_sigint = _arm_sigint()
    try:
        try:
            _run(argv)
        except SystemExit as exc:
            code = exc.code
        except BrokenPipeError:  # an error line to a closed stderr
            code = EXIT_PIPE
        except OutputLost:  # raised outside click's reach (a flush at the end)
            pass
        _say_notes()
        if _pipe_closed(saved, (out, err)):
            code = EXIT_PIPE
        if out.lost is not None:  # what the command printed did not arrive: its verdict is unknown to its reader
            code = _output_lost(out, err, saved)
        if argv is None and _is_live_check(args):
            _fast_exit(code)
        if code == conventions.EXIT_INTERRUPTED and _threads_left():
            _fast_exit(code)  # a worker still blocked in a connect or a read must not hold the exit (docs/cli.md)
        raise SystemExit(code)
    finally:
        _restore_sigint(old_sigint)
        _drop_notes()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, OutputLost):
                pass
        sys.stdout, sys.stderr = saved


# A reader closed the pipe: the exit status a shell shows for a command killed by SIGPIPE (128 + 13), as `git log |
# head` gives, without the signal (gpudoctor's own cleanup still runs). Never 0: `gpudoctor gate | head` must not pass.
# EXIT_PIPE (141) is gpudoctor/exitcodes.py's.


class OutputLost(GpudoctorError):
    """Standard output could not be written (a full disk, /dev/full, a closed descriptor): one line, exit 3.

    Decided (docs/cli.md "Exit codes"): the verdict did not reach its reader, so its class is unknown, 3 — also when
    standard error is closed too and the line cannot be said; never 1 (Nagios's WARNING for a host that FAILs)."""

    exit_code = EXIT_UNKNOWN


class _Closed:
    """A standard stream that was closed when gpudoctor started (`>&-`): every write fails as a closed one does."""

    def __init__(self, name: str):
        self.name = name

    def write(self, s) -> int:
        import errno

        raise OSError(errno.EBADF, f"{self.name} is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("fileno")


class _PipeAware(SafeStream):
    """SafeStream that remembers a write or flush to a closed pipe (click turns that EPIPE into exit 1), and one that
    could not be written at all (`lost`): on stdout that is OutputLost, on stderr the line is dropped."""

    pipe_closed = False
    lost: OSError | None = None
    wrote = False  # anything printed (an error document is printed only where the command printed nothing)

    def __init__(self, inner, role: str = "stdout"):
        super().__init__(inner)
        self.role = role

    def broken_pipe(self) -> None:  # the rich Console's writes bypass write() (term.RawWriter)
        self.pipe_closed = True

    def write_failed(self, exc: OSError) -> None:
        self.lost = self.lost or exc
        if self.role == "stdout":
            raise OutputLost(_lost_line(exc)) from None

    def write(self, s) -> int:
        if isinstance(s, (bytes, bytearray)):  # click.echo(bytes) finds no .buffer here: shell completion's script
            s = bytes(s).decode("utf-8", "replace")
        self.wrote = self.wrote or bool(s)
        try:
            return super().write(s)
        except BrokenPipeError:
            self.pipe_closed = True
            raise
        except OSError as exc:
            self.write_failed(exc)
            return len(s)

    def flush(self) -> None:
        try:
            self.raw_stream.flush()
        except BrokenPipeError:
            self.pipe_closed = True
            raise
        except OSError as exc:
            self.write_failed(exc)


def _lost_line(exc: OSError) -> str:
    return f"cannot write standard output: {exc.strerror or exc}; what this command printed is lost"


def _output_lost(out: "_PipeAware", err: "_PipeAware", saved) -> int:
    """stdout failed: say so in one line (unless _run said it already), silence the descriptor, exit 3."""
    import os

    if not getattr(out, "said", False):
        try:
            err.write(f"gpudoctor: {_lost_line(out.lost)}\n")
            err.flush()
        except OSError:
            pass
    for raw in saved[:1]:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, raw.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
    try:  # what is still buffered would fail again at the interpreter's exit ("Exception ignored")
        saved[0].flush()
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_UNKNOWN


def _say_notes() -> None:
    """What the command asked to say at its end (gpudoctor.commands.NOTES: which inventory it read)."""
    commands = sys.modules.get("gpudoctor.commands")
    notes = getattr(commands, "NOTES", None)
    if notes and conventions.last.quiet:  # -q: no notes
        notes.clear()
    while notes:
        try:
            click.echo(notes.pop(0), err=True)
        except BrokenPipeError:
            break


def _pipe_closed(saved, wrapped) -> bool:
    """Flush what is buffered; where the reader is gone, point the descriptor at /dev/null so that neither this
    process nor the interpreter's exit writes to it again (no "Exception ignored ... BrokenPipeError")."""
    import os

    closed = False
    for raw, w in zip(saved, wrapped):
        try:
            w.flush()
        except BrokenPipeError:
            pass
        except (OSError, ValueError, OutputLost):
            continue
        if not w.pipe_closed:
            continue
        closed = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, raw.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # not a real descriptor (a test's StringIO): nothing to silence
            pass
    return closed


def _fast_exit(code) -> None:
    """A live `check`/`gate` process has printed everything: leave without the interpreter's teardown of every loaded
    module (30-60 ms on the H200, a sixth of a whole check). Output and logs are flushed, unadopted probes killed."""
    import logging
    import os

    from gpudoctor.host.local import _reap_prestarted

    if isinstance(code, str):  # sys.exit("message") prints it, as the interpreter would
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    _reap_prestarted()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


# Ctrl-C: what cleans up after it (closing SSH connections: each agent sees EOF and kills what it runs) has this long in
# all, so that every command stops within 1 s of SIGINT, whatever it was waiting on (docs/cli.md "Exit codes").
INTERRUPT_CLEANUP_S = 0.6


def _on_sigint(signum, frame) -> None:
    """SIGINT: from now on every close and settle hurries (host/ssh.py), then Ctrl-C unwinds as KeyboardInterrupt."""
    ssh = sys.modules.get("gpudoctor.host.ssh")
    if ssh is not None:
        ssh.hurry(INTERRUPT_CLEANUP_S)
    raise KeyboardInterrupt


def _arm_sigint():
    """Install _on_sigint where SIGINT has Python's default handler (not where it is ignored: a background job's)."""
    import signal

    try:
        old = signal.getsignal(signal.SIGINT)
        if old is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
        return old
    except ValueError:  # not the main thread (a test calling main() from a thread): leave signals alone
        return None


def _restore_sigint(old) -> None:
    import signal

    if old is not None:
        try:
            if signal.getsignal(signal.SIGINT) is _on_sigint:
                signal.signal(signal.SIGINT, old)
        except ValueError:
            pass


def _threads_left() -> bool:
    """A thread the interpreter would wait for at exit (a pool's worker blocked in a connect) is still running."""
    import threading

    return any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread())


def _close_connections() -> None:
    """An interrupted run closes its SSH connections itself (each agent sees EOF and kills what it runs), within
    INTERRUPT_CLEANUP_S."""
    ssh = sys.modules.get("gpudoctor.host.ssh")
    if ssh is not None:
        ssh.hurry(INTERRUPT_CLEANUP_S)
        ssh.close_all(wait=0.1, settle=INTERRUPT_CLEANUP_S)


# click >= 8.2 raises this for a bare group (click 8.1 printed the help itself, exit 0).
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _drop_notes() -> None:
    """The command ends in an error line: that one line is all it says."""
    commands = sys.modules.get("gpudoctor.commands")
    if commands is not None:
        commands.NOTES.clear()


def _error_document(argv, message: str, code: int) -> None:
    """`--json` prints one document whatever happened (docs/cli.md "JSON"): a command that ends in an error line
    before it printed its own document prints `gpudoctor.error/1` on stdout too, with the same line and exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    args = args[: args.index("--")] if "--" in args else args
    out = sys.stdout
    pairs = set(zip(args, args[1:]))
    wanted = "--json" in args or conventions.last.json or ("-o", "json") in pairs or ("--output", "json") in pairs \
        or "--output=json" in args
    if not wanted or "--npd" in args or not isinstance(out, _PipeAware) or out.wrote or "writes no JSON" in message:
        return
    import json

    from gpudoctor.host.early import command_args

    words = command_args(args)[:2]
    if words[:1] and words[0] in COMMANDS:
        group = COMMANDS[words[0]][0]
        words = words if len(words) == 2 and group.endswith((":lxc", ":model", ":bench", ":sglang", ":inventory",
                                                              ":recovery")) else words[:1]
    else:
        words = []
    try:
        click.echo(json.dumps({"schema": "gpudoctor.error/1", "command": " ".join(words), "error": message,
                               "exit_code": code}))
    except (OSError, GpudoctorError):
        pass


def _run(argv) -> None:
    try:
        cli.main(args=argv, prog_name="gpudoctor", standalone_mode=False)
    except GpudoctorError as exc:
        _drop_notes()
        if isinstance(exc, OutputLost) and isinstance(sys.stdout, _PipeAware):
            sys.stdout.said = True
        else:
            _error_document(argv, exc.one_line(), exc.exit_code)
        click.echo(f"gpudoctor: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except NO_ARGS_IS_HELP as exc:  # a bare `gpudoctor` or group asks for its help: as --help does, exit 0
        click.echo(exc.ctx.get_help())
        sys.exit(EXIT_OK)
    except click.UsageError as exc:  # bad flags are bad input: one line, exit 3
        _drop_notes()
        cmd = exc.ctx.command_path if exc.ctx else "gpudoctor"
        msg = " ".join(exc.format_message().split())
        from gpudoctor.host.early import command_args

        args = list(sys.argv[1:] if argv is None else argv)
        if command_args(args)[:1] == ["gate"] and "--npd" in args:  # node-problem-detector's contract: one line on stdout, 0/1/2
            from gpudoctor.integrations.npd import error_verdict

            code, line = error_verdict(f"{cmd}: {msg}")
            click.echo(line)
            sys.exit(code)
        _error_document(argv, f"{cmd}: {msg}", EXIT_UNKNOWN)
        click.echo(f"{cmd}: Error: {msg} (try '{cmd} --help')", err=True)
        sys.exit(EXIT_UNKNOWN)
    except click.ClickException as exc:
        _drop_notes()
        _error_document(argv, " ".join(exc.format_message().split()), EXIT_UNKNOWN)
        click.echo(f"gpudoctor: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(EXIT_UNKNOWN)
    except click.exceptions.Abort as exc:
        _close_connections()
        _drop_notes()
        if isinstance(exc.__cause__, KeyboardInterrupt):
            click.echo("gpudoctor: interrupted", err=True)
            sys.exit(conventions.EXIT_INTERRUPTED)
        click.echo("gpudoctor: aborted (no answer on standard input)", err=True)
        sys.exit(EXIT_UNKNOWN)
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C: one line, 130, whatever the command (docs/cli.md)
        _close_connections()
        _drop_notes()
        click.echo("gpudoctor: interrupted", err=True)
        sys.exit(conventions.EXIT_INTERRUPTED)
    except PermissionError as exc:  # an ordinary user's --apply: which permission failed, never a traceback
        _drop_notes()
        what = f"{exc.strerror or 'permission denied'}: {exc.filename}" if exc.filename else str(exc)
        click.echo(f"gpudoctor: {what}: this needs root (gpudoctor runs as uid {os.geteuid()})", err=True)
        sys.exit(EXIT_UNKNOWN)
    except RecursionError:  # input nested deeper than a parser could follow: bad input, never a traceback
        click.echo("gpudoctor: input nests too deeply to read", err=True)
        sys.exit(EXIT_UNKNOWN)
    sys.exit(EXIT_OK)
