"""Proxmox VE: the LXC container config model, its audit against the host's live device majors, pct helpers."""
