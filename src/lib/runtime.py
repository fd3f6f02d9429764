"""Where and how big: the device, the running mode, seeds, and the cache folder.

* :func:`pick_device` chooses CUDA, then Apple MPS, then the CPU.
* :func:`running_mode` reads the ``POSENC_SIZE`` environment variable:
  ``small`` (seconds per model on a 2-core CPU; used by the tests and the book
  build) or ``full`` (bigger models and cleaner curves). Unset, it is ``full``
  when a CUDA GPU is present and ``small`` otherwise.
* :func:`cache_dir` is where downloads and trained runs are kept.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Dict

import numpy as np
import torch

__all__ = ["pick_device", "running_mode", "seed_everything", "cache_dir", "SIZE_ENV"]

SIZE_ENV = "POSENC_SIZE"
_MODES = ("small", "full")


def pick_device() -> torch.device:
    """The fastest available device: ``cuda``, else ``mps``, else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def running_mode() -> str:
    """``"small"`` or ``"full"``, from ``$POSENC_SIZE`` or the hardware.

    Raises:
        ValueError: if ``$POSENC_SIZE`` is set to anything else.
    """
    value = os.environ.get(SIZE_ENV, "").strip().lower()
    if not value:
        return "full" if torch.cuda.is_available() else "small"
    if value not in _MODES:
        raise ValueError(f"${SIZE_ENV} must be one of {_MODES}, got {value!r}")
    return value


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


_RESOLVED: Dict[str, Path] = {}  # POSENC_CACHE as given -> the absolute folder it meant when first used


def cache_dir(sub: str = "") -> Path:
    """``$POSENC_CACHE/sub`` if set, else ``~/.cache/posenc/sub`` (not created); always absolute.

    A relative ``POSENC_CACHE`` is resolved against the working directory of
    its first use, once, so that a later ``os.chdir`` does not move the cache.
    """
    root = os.environ.get("POSENC_CACHE", "").strip()
    if root:
        base = _RESOLVED.setdefault(root, Path(root).expanduser().absolute())
    else:
        base = Path.home() / ".cache" / "posenc"
    return base / sub if sub else base
