"""CLI command modules, one per command group; loaded lazily by gpudoctor.cli."""


# Lines a command has to say once it has finished (gpudoctor.cli prints them last on stderr, and drops them when the
# command ends in an error line instead: bad input stays one line, which names the file itself).
NOTES: list[str] = []


def say_inventory(target_or_inventory) -> None:
    """Every command that read an inventory says which file (a line on stderr at the end; stdout stays the
    command's own)."""
    inv = getattr(target_or_inventory, "inventory", target_or_inventory)
    if inv is not None and getattr(inv, "path", None):
        from gpudoctor.inventory import source_line

        line = source_line(inv)
        if line not in NOTES:
            NOTES.append(line)
