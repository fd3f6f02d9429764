"""Argument checks shared by the modules: clear ``ValueError``s on bad input."""

from __future__ import annotations

from typing import Any

__all__: list = []  # private helpers


def check_int(name: str, value: Any, low: int = 1) -> int:
    """Return ``value`` if it is an integer (not a bool) ``>= low``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_even_dim(dim: Any, what: str) -> int:
    """Return ``dim`` if it is an even integer ``>= 2`` (channel pairs), else raise ``ValueError``."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"{what} needs an even dimension >= 2, got dim={dim!r}")
    return dim
