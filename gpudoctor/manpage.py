"""gpudoctor(1) in roff, built from the click tree's own help: every command, its usage, text and options."""

from __future__ import annotations

import click

from gpudoctor import __version__


def walk(group: click.Group, ctx: click.Context, prefix=()):
    """(path, command, context) for every command under group, depth first."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield prefix + (name,), cmd, sub
        if isinstance(cmd, click.Group):
            yield from walk(cmd, sub, prefix + (name,))


def _esc(text: str) -> str:
    """Text as roff shows it: backslashes doubled, a leading dot or quote guarded."""
    out = []
    for line in text.replace("\\", "\\e").replace("\b", "").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _text(help_text: str) -> str:
    """A command's help: its \\b blocks kept as they are (.nf), the rest as paragraphs."""
    import inspect

    parts = []
    for para in inspect.cleandoc(help_text or "").split("\n\n"):
        if para.startswith("\b"):
            parts.append(".nf\n" + _esc(para[1:].strip("\n")) + "\n.fi")
        else:
            parts.append(_esc(" ".join(para.split())))
    return "\n.PP\n".join(p for p in parts if p.strip())


def _options(cmd: click.Command, ctx: click.Context) -> str:
    rows = [r for r in (p.get_help_record(ctx) for p in cmd.get_params(ctx)) if r]
    return "\n".join(f".TP\n.B {_esc(opt)}\n{_esc(' '.join(doc.split()))}" for opt, doc in rows)


def render(root: click.Group) -> str:
    """The whole manual page."""
    ctx = click.Context(root, info_name="gpudoctor")
    out = [f'.TH GPUDOCTOR 1 "" "gpudoctor {__version__}" "User Commands"',
           ".SH NAME", "gpudoctor \\- keep GPU inference hosts healthy",
           ".SH SYNOPSIS", ".B gpudoctor", "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]",
           ".SH DESCRIPTION", _text(root.help),
           ".SH GLOBAL OPTIONS", "Accepted before or after the command (docs/cli.md).", _options(root, ctx),
           ".SH COMMANDS"]
    for path, cmd, sub in walk(root, ctx):
        out.append(f'.SS "gpudoctor {" ".join(path)}"')
        pieces = " ".join(cmd.collect_usage_pieces(sub))
        out.append(f".B gpudoctor {_esc(' '.join(path))}\n{_esc(pieces)}\n.PP")
        out.append(_text(cmd.help or cmd.short_help or ""))
        if cmd.epilog:
            out.append(".PP\n" + _text(cmd.epilog))
        opts = _options(cmd, sub)
        if opts:
            out.append(opts)
    out += [".SH EXIT STATUS", "0 ok, 1 warning, 2 failure, 3 unknown or bad input, 130 interrupted; each command's "
            "table is in its help and in docs/cli.md.",
            ".SH SEE ALSO", "docs/cli.md and docs/checks.md in the gpudoctor source; \\fBgpudoctor check --explain ID\\fR."]
    return "\n".join(out) + "\n"
