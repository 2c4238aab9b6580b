"""Small text helpers shared by the readers' descriptions and the CLI."""

from __future__ import annotations


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"1.5 KiB"``, ... up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
