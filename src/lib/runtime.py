"""Where and how big: the device, the running mode, and seeds.

* :func:`pick_device` chooses CUDA, then Apple MPS, then the CPU.
* :func:`running_mode` reads the ``POSENC_SIZE`` environment variable:
  ``small`` (seconds per model on a 2-core CPU; used by the tests and the book
  build) or ``full`` (bigger models and cleaner curves). Unset, it is ``full``
  when a CUDA GPU is present and ``small`` otherwise.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["pick_device", "running_mode", "seed_everything", "SIZE_ENV"]

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
