"""`gpudoctor completion bash|zsh|fish` and `gpudoctor manpage`: click's own completion, a manual from the help."""

from __future__ import annotations

import re

import click

from gpudoctor.exitcodes import EXIT_OK

SHELLS = ("bash", "zsh", "fish")


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell):
    """Print the shell completion script for SHELL (click's own mechanism: the script calls gpudoctor back).

    \b
    Install (docs/cli.md "Completion and manual"):
      bash:  gpudoctor completion bash > /etc/bash_completion.d/gpudoctor        (or source it from ~/.bashrc)
      zsh:   gpudoctor completion zsh > "${fpath[1]}/_gpudoctor"
      fish:  gpudoctor completion fish > ~/.config/fish/completions/gpudoctor.fish

    Exit codes: 0 printed, 3 an unknown shell.
    """
    from click.shell_completion import get_completion_class

    cli = click.get_current_context().find_root().command  # the root group (gpudoctor/cli.py), never imported here

    comp = get_completion_class(shell)(cli, {}, "gpudoctor", "_GPUDOCTOR_COMPLETE")
    click.echo(comp.source(), nl=False)
    raise SystemExit(EXIT_OK)


@click.command("manpage")
@click.option("--conventions-table", "table", is_flag=True, hidden=True,
              help="Print docs/cli.md's table of every command against the conventions (Markdown) instead.")
def manpage(table):
    """Print the manual page gpudoctor(1) in roff, built from every command's help.

    \b
    Install (docs/cli.md "Completion and manual"):
      gpudoctor manpage > /usr/local/share/man/man1/gpudoctor.1 && man gpudoctor
    install.sh installs it there when run as root.

    Exit codes: 0 printed.
    """
    from gpudoctor.manpage import render

    cli = click.get_current_context().find_root().command  # the root group (gpudoctor/cli.py), never imported here
    click.echo(conventions_table(cli) if table else render(cli), nl=False)
    raise SystemExit(EXIT_OK)


# --- what completion completes ---------------------------------------------------------------------------------------
# click completes commands, options and choices; these complete the values only gpudoctor knows: the inventory's hosts
# and groups, the check ids, the remedy ids and the gate profiles. One table, keyed by (command name, parameter name);
# "*" is any command. Completion never prints an error: a value it cannot list (no inventory, a bad one) completes to
# nothing. Old spellings (AliasOption.hidden_aliases, e.g. --verbose-findings) are never offered.

def _inventory(ctx):
    from gpudoctor.conventions import Settings
    from gpudoctor.inventory import load_inventory

    path, c = None, ctx
    while c is not None and path is None:
        path = c.params.get("inventory") or c.params.get("inventory_path")
        c = c.parent
    if path is None:
        s = ctx.find_object(Settings)
        path = getattr(s, "inventory", None)
    return load_inventory(path)


def _hosts(ctx, *, proxmox: bool = False):
    inv = _inventory(ctx)
    items = [(n, h.description or h.ssh.address) for n, h in inv.hosts.items()]
    if proxmox:
        items += [(n, "Proxmox host") for n in inv.proxmox]
    return items + [("local", "this machine")]


def _groups(ctx):
    inv = _inventory(ctx)
    return sorted({(g, "group") for h in inv.hosts.values() for g in h.groups})


def _check_ids(ctx):
    import gpudoctor.checks  # noqa: F401 - registers every check
    from gpudoctor.checkreg import all_checks

    return [(c.id, c.summary) for c in all_checks()]


def _remedy_ids(ctx):
    from gpudoctor import remedies

    return [(i, "remedy") for i in remedies.REMEDIES]


def _profiles(ctx):
    from gpudoctor.gate import BUILTIN_PROFILES

    items = [(n, "built-in") for n in BUILTIN_PROFILES]
    try:
        items += [(n, "inventory") for n in _inventory(ctx).profiles if n not in BUILTIN_PROFILES]
    except Exception:  # noqa: BLE001 - no inventory: the built-in profiles still complete
        pass
    return items


VALUES = {
    ("lxc audit", "host_name"): ("hosts", lambda ctx: _hosts(ctx, proxmox=True)),
    ("lxc fix", "host_name"): ("hosts", lambda ctx: _hosts(ctx, proxmox=True)),
    ("*", "host_name"): ("hosts", _hosts),
    ("daemon", "hosts"): ("hosts", _hosts),
    ("*", "host"): ("hosts", _hosts),                    # release HOST, recovery release HOST
    ("inventory ping", "specs"): ("hosts, groups", lambda ctx: _hosts(ctx)[:-1] + _groups(ctx)),
    ("check", "groups"): ("groups", _groups),
    ("check", "explain"): ("check ids", _check_ids),
    ("fix", "only"): ("remedy ids", _remedy_ids),
    ("gate", "profile"): ("profiles", _profiles),
}


def _entry(where: str, param) -> tuple | None:
    return VALUES.get((where, param.name)) or VALUES.get(("*", param.name))


def values_for(ctx, param) -> list | None:
    """(value, help) pairs gpudoctor completes for `param` of ctx's command, or None where click's own apply."""
    entry = _entry(" ".join(ctx.command_path.split()[1:]), param)
    if entry is None:
        return None
    try:
        return entry[1](ctx)
    except Exception:  # noqa: BLE001 - completion says nothing rather than an error in the middle of a command line
        return []


def hidden_names(ctx) -> set[str]:
    """Option spellings that work but are not offered (old names), of the command being completed."""
    from gpudoctor.conventions import AliasOption

    return {a for p in ctx.command.get_params(ctx) if isinstance(p, AliasOption) for a in p.hidden_aliases}


class _Completing:
    """Mixed into click's bash, zsh and fish completion: values from VALUES, hidden spellings left out."""

    def get_completions(self, args, incomplete):
        from click.shell_completion import CompletionItem, _resolve_context, _resolve_incomplete

        ctx = _resolve_context(self.cli, self.ctx_args, self.prog_name, args)
        obj, incomplete = _resolve_incomplete(ctx, args, incomplete)
        if isinstance(obj, click.Parameter):
            values = values_for(ctx, obj)
            if values is not None:
                return [CompletionItem(v, help=h) for v, h in values if v.startswith(incomplete)]
        hidden = hidden_names(ctx)
        return [c for c in obj.shell_complete(ctx, incomplete) if c.value not in hidden]


def register() -> None:
    """Put gpudoctor's completion classes in click's registry (cli.LazyGroup does, only when completing)."""
    from click.shell_completion import BashComplete, FishComplete, ZshComplete, add_completion_class

    for base in (BashComplete, ZshComplete, FishComplete):
        add_completion_class(type(base.__name__, (_Completing, base), {}), base.name)


# --- docs/cli.md's table of every command against the conventions ---------------------------------------------------
# Generated from the click tree (`gpudoctor manpage --conventions-table`), so a command added, or an option that
# changes how it asks, how it speaks JSON, its exit codes or what it completes, changes the table; tests/docs checks
# that docs/cli.md holds this very table.

_EXIT_CODE = re.compile(r"(?:^|[\s:;,(])([0-3])(?=\s+[(\w])")


def _leaves(group, prefix=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, prefix + (name,))
        else:
            yield " ".join(prefix + (name,)), cmd


def _options(cmd, ctx) -> set[str]:
    return {o for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden for o in p.opts}


def _asks(opts: set[str]) -> str:
    """The rule for a command that changes a host: a dry run by default; `--apply` asks on a terminal and needs
    `--yes` without one."""
    if "--apply" not in opts:
        return "— (no `--apply`)"
    return "yes (`--yes` without a terminal)" if "--yes" in opts else "**no**: `--apply` changes without asking"


def _json(cmd) -> str:
    from gpudoctor.conventions import GlobalOption

    exposed = any(isinstance(p, GlobalOption) and p.concept == "json" and not p.hidden for p in cmd.params)
    return "yes" if exposed else "refused (exit 3)"


def _exit_codes(cmd) -> str:
    text = f"{cmd.help or ''}\n{cmd.epilog or ''}"
    i = text.find("Exit code")
    if i < 0:
        return "**none in its help**"
    section = text[i:].split("Global options", 1)[0]
    return " ".join(sorted(set(_EXIT_CODE.findall(section)))) or "**none in its help**"


def _completes(name: str, cmd, ctx) -> str:
    from gpudoctor.conventions import GlobalOption

    out = []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False) or isinstance(p, GlobalOption):  # -i FILE and the rest: every command's
            continue
        label = p.opts[0] if isinstance(p, click.Option) else p.human_readable_name
        entry = _entry(name, p)
        if entry is not None:
            out.append(f"`{label}` {entry[0]}")
        elif isinstance(p.type, click.Choice) and p.name != "color":
            out.append(f"`{label}` choices")
        elif isinstance(p.type, click.Path):
            out.append(f"`{label}` files")
    return ", ".join(out) or "options"


def conventions_table(cli) -> str:
    rows = ["| command | asks before changing | `--json` | exit codes in its help | completes |",
            "|---|---|---|---|---|"]
    for name, cmd in _leaves(cli):
        ctx = click.Context(cmd, info_name=name.split()[-1])
        rows.append(f"| `{name}` | {_asks(_options(cmd, ctx))} | {_json(cmd)} | {_exit_codes(cmd)} | "
                    f"{_completes(name, cmd, ctx)} |")
    return "\n".join(rows) + "\n"
