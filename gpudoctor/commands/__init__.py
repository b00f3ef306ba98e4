"""CLI command modules, one per command group; loaded lazily by gpudoctor.cli."""
