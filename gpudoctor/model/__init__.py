"""Model weights: verify a model directory or Hugging Face cache by its headers, and stage it into tmpfs."""

from __future__ import annotations


def human_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '?'."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - unreachable
