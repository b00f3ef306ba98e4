"""CLI subcommands, one module per command group (loaded lazily by gpudoctor.cli)."""
