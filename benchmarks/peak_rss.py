"""Peak resident memory added by a piece of code on the CPU, for the benchmarks.

PyTorch keeps no allocator statistics on the CPU, so the benchmarks run each
case in a fresh process and read its peak resident set size. The peak must be
reset first: on Linux a process starts with the high-water mark of the process
that forked it (``ru_maxrss`` survives ``fork`` and ``exec``), so a child of a
benchmark that has just run a large case would report that case's memory.
Writing ``5`` to ``/proc/self/clear_refs`` resets the mark (``VmHWM``) to the
current resident size.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Callable


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def start() -> Callable[[], int]:
    """Reset the peak to the current resident size; the returned function gives the bytes added since.

    Elsewhere than Linux it falls back to ``ru_maxrss``, which may still hold an
    earlier, higher peak (then the result is 0 or too small).
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kib("VmRSS") * 1024
        return lambda: max(0, _status_kib("VmHWM") * 1024 - before)
    except OSError:
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        return lambda: max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale - before)
