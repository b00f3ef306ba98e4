"""The command line's conventions, enforced here and only here (docs/cli.md): the global options every command takes
before or after its name, one Settings object commands read them from, hidden old spellings, did-you-mean for
subcommands, short summaries that are whole sentences, and the exit codes."""

from __future__ import annotations

import dataclasses
import difflib
import os

import click

# Exit codes (docs/cli.md "Exit codes"): Nagios for judgments; 130 for Ctrl-C, as a shell reports SIGINT. The table
# is gpudoctor/exitcodes.py's.
from gpudoctor.exitcodes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN  # noqa: F401

COLORS = ("auto", "always", "never")
_KEY = "gpudoctor.settings"


@dataclasses.dataclass
class Settings:
    """What the global options resolved to; every command reads them from here (settings())."""

    verbose: int = 0
    quiet: bool = False
    json: bool = False
    color: str = "auto"
    inventory: str | None = None


# The settings of the last command line parsed (cli.main reads them after the command: -q drops its notes).
last = Settings()


def settings(ctx: click.Context | None = None) -> Settings:
    """The resolved global options of the command line being run (defaults outside one)."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return Settings()
    root = ctx.find_root()
    if isinstance(root.obj, Settings):
        return root.obj
    return root.meta.setdefault(_KEY, Settings())


# concept -> (option strings, help); the one definition of each global option
GLOBAL = {
    "verbose": (("-v", "--verbose"), "More log detail on stderr (-v info, -vv debug)."),
    "quiet": (("-q", "--quiet"), "Say less: only what is not ok and the verdict; no notes on stderr."),
    "json": (("--json",), "Machine-readable output with a `schema` field (docs/json-schema.md)."),
    "color": (("--color",), "Colour: auto (a terminal, unless NO_COLOR), always, never."),
    "inventory": (("-i", "--inventory"), "Inventory file (default: $GPUDOCTOR_INVENTORY, ./inventory.yaml, "
                                         "~/.config/gpudoctor/inventory.yaml)."),
}


GLOBAL_NOTE = "Global options, before or after the command: -v/-vv, -q, --json, --color WHEN, -i FILE (docs/cli.md)."


def _merge(concept: str, ctx: click.Context, param: click.Parameter, value):
    """One global option's callback, wherever it was given: fold it into Settings, apply, return the resolved value."""
    s = settings(ctx)
    if concept == "verbose":
        s.verbose += value or 0
    elif concept in ("quiet", "json"):
        setattr(s, concept, bool(getattr(s, concept) or value))
    elif concept == "color":
        source = ctx.get_parameter_source(param.name)
        if value is not None and (source is None or source.name != "DEFAULT"):
            s.color = value
    elif concept == "inventory" and value is not None:
        source = ctx.get_parameter_source(param.name)
        if s.inventory is None or source is None or source.name == "COMMANDLINE":
            s.inventory = value
    _apply(s)
    return getattr(s, concept)


def _apply(s: Settings) -> None:
    global last
    last = s
    if s.quiet and s.verbose:
        raise click.UsageError("-q and -v contradict each other: give one")
    from gpudoctor import log

    log.set_defaults(-1 if s.quiet else s.verbose)
    if s.color == "always":  # the rule term.Styled and rich both follow (docs/cli.md "Colour")
        os.environ.pop("NO_COLOR", None)
        os.environ["FORCE_COLOR"] = "1"
    elif s.color == "never":
        os.environ.pop("FORCE_COLOR", None)
        os.environ["NO_COLOR"] = "1"


class GlobalOption(click.Option):
    """A global option on a command; `concept` names which (GLOBAL)."""

    def __init__(self, param_decls=None, *, concept: str, name: str | None = None, expose: bool = False,
                 help: str | None = None, root: bool = False, **kw):
        opts, default_help = GLOBAL[concept]
        decls = [*opts, name or concept]
        kw.setdefault("hidden", not (expose or root))
        if concept == "verbose":
            kw.update(count=True)
        elif concept in ("quiet", "json"):
            kw.update(is_flag=True)
        elif concept == "color":
            kw.update(type=click.Choice(COLORS), default="auto", show_default=root, metavar="WHEN")
        elif concept == "inventory":
            kw.update(type=click.Path(dir_okay=False), metavar="FILE", envvar="GPUDOCTOR_INVENTORY")
        super().__init__(decls, expose_value=expose, help=help or default_help,
                         callback=lambda ctx, p, v: _merge(concept, ctx, p, v), **kw)
        self.concept = concept


def root_options(f):
    """The global options on the root group (`gpudoctor -v check`)."""
    for concept in reversed(list(GLOBAL)):
        f = click.option(cls=GlobalOption, concept=concept, root=True)(f)
    return f


class AliasOption(click.Option):
    """An option whose old spellings (hidden_aliases) still work but are not shown in --help (docs/cli.md)."""

    def __init__(self, *a, hidden_aliases=(), **kw):
        super().__init__(*a, **kw)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx):
        opts = self.opts
        self.opts = [o for o in opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


# Old spelling -> the one name (docs/cli.md "One name per concept"): wherever a command still declares the old one,
# adopt() adds the new one and hides the old, which keeps working.
RENAMED = {"--verbose-findings": "--all-findings", "--facts": "--snapshot"}


def _rename(p: click.Parameter) -> None:
    if not isinstance(p, click.Option) or isinstance(p, GlobalOption):
        return
    olds = [o for o in p.opts if o in RENAMED and RENAMED[o] not in p.opts]
    if not olds:
        return
    if not isinstance(p, AliasOption):
        p.__class__, p.hidden_aliases = AliasOption, ()
    p.opts = [*p.opts, *(RENAMED[o] for o in olds)]
    p.hidden_aliases = tuple(dict.fromkeys([*p.hidden_aliases, *olds]))


def alias(*decls, hidden_aliases=(), **kw):
    """click.option with old spellings kept working, hidden from help: alias("--snapshot", "--facts", "path",
    hidden_aliases=["--facts"])."""
    return click.option(*decls, cls=AliasOption, hidden_aliases=hidden_aliases, **kw)


class DidYouMeanGroup(click.Group):
    """A group that names the nearest subcommand when one is mistyped (click < 8.4 did it for options only)."""

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            near = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            if near and not name.startswith("-") and "No such command" in exc.message \
                    and not getattr(exc, "possibilities", None):  # click >= 8.4 says it itself, for some groups
                exc.message += f" Did you mean '{near[0]}'?"
            raise

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        return adopt(cmd) if cmd is not None else None


def adopt(cmd: click.Command) -> click.Command:
    """Make a command (and a group's subcommands) follow the conventions: every global option accepted after its
    name (its own --json/--inventory become the global one, under its own parameter name and help); a group names
    the nearest subcommand; a summary is a whole sentence; --json refused where a command writes no JSON."""
    if getattr(cmd, "_gpudoctor_adopted", False):
        return cmd
    cmd._gpudoctor_adopted = True
    have = set()
    params = []
    for p in cmd.params:
        concept = next((c for c, (opts, _) in GLOBAL.items() if isinstance(p, click.Option)
                        and set(p.opts) & set(opts) and not isinstance(p, GlobalOption)), None)
        if concept:
            have.add(concept)
            p = GlobalOption(concept=concept, name=p.name, expose=True, help=p.help)
        elif isinstance(p, GlobalOption):
            have.add(p.concept)
        _rename(p)
        params.append(p)
    params += [GlobalOption(concept=c) for c in GLOBAL if c not in have]
    cmd.params = params
    if not cmd.short_help and cmd.help:
        cmd.short_help = summary(cmd.help)
    if not isinstance(cmd, click.Group) and cmd.add_help_option:  # (bench standin prints argparse's own help)
        cmd.epilog = (cmd.epilog + "\n\n" if cmd.epilog else "") + GLOBAL_NOTE
    if isinstance(cmd, click.Group):
        if type(cmd) is click.Group:  # the plain groups of gpudoctor/commands/*.py gain did-you-mean
            cmd.__class__ = DidYouMeanGroup
        for sub in cmd.commands.values():
            adopt(sub)
    elif "json" not in have and cmd.callback is not None:
        cmd.callback = _no_json(cmd.callback, cmd.name)
    return cmd


def _no_json(callback, name):
    import functools

    @functools.wraps(callback)
    def run(*a, **kw):
        if settings().json:
            raise click.UsageError(f"--json: `{name}` writes no JSON (docs/cli.md lists the commands that do)")
        return callback(*a, **kw)

    return run


def confirm_change(question: str, yes: bool) -> bool:
    """The one rule of every command that changes a host (fix --apply, lxc fix --apply; docs/cli.md "Asks before
    changing"): --yes goes ahead; on a terminal it asks (default no); without one it refuses, nothing changed."""
    import sys

    from gpudoctor.errors import InputError

    if yes:
        return True
    if not sys.stdin.isatty():
        raise InputError("--apply without --yes asks for confirmation, but stdin is not a terminal: add --yes to "
                         "apply unattended (nothing was changed)")
    return click.confirm(question, default=False, err=True)  # stdout: --json


def summary(help_text: str) -> str:
    """A command's summary in a group's list: its help's first sentence, whole (click cuts it at ~45 characters)."""
    first = help_text.strip().split("\n\n")[0]
    first = " ".join(first.replace("\b", " ").split())
    if ". " in first:
        first = first.split(". ")[0] + "."
    return first if first.endswith((".", "?", "!")) else first + "."
