"""`gpudoctor completion bash|zsh|fish` and `gpudoctor manpage`: click's own completion, a manual from the help."""

from __future__ import annotations

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

    from gpudoctor.cli import cli

    comp = get_completion_class(shell)(cli, {}, "gpudoctor", "_GPUDOCTOR_COMPLETE")
    click.echo(comp.source(), nl=False)
    raise SystemExit(EXIT_OK)


@click.command("manpage")
def manpage():
    """Print the manual page gpudoctor(1) in roff, built from every command's help.

    \b
    Install (docs/cli.md "Completion and manual"):
      gpudoctor manpage > /usr/local/share/man/man1/gpudoctor.1 && man gpudoctor
    install.sh installs it there when run as root.

    Exit codes: 0 printed.
    """
    from gpudoctor.manpage import render

    from gpudoctor.cli import cli

    click.echo(render(cli), nl=False)
    raise SystemExit(EXIT_OK)
