"""Training and evaluation runs seen from the user's side: interrupts, progress, what a run reports, the cost line."""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import posenc as pe

LINUX = sys.platform.startswith("linux")


def _children(pid: int) -> dict:
    """``{child pid: its start time}`` for the processes whose parent is ``pid`` (from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[1]) == pid:
            found[int(stat.parent.name)] = rest[19]
    return found


def _alive(pid: int, start: str) -> bool:
    """The process ``pid`` that started at ``start`` still exists and is not a zombie."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return rest[19] == start and rest[0] != "Z"


def _wait_for(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not LINUX, reason="forked workers: Linux only")
def test_an_interrupt_stops_the_workers_and_frees_their_run_locks(tmp_path):
    """Jupyter's "interrupt kernel" sends SIGINT to the kernel alone: the forked trainers must stop with it."""
    code = ("import posenc as pe\n"
            "task = pe.MarkovChain(vocab_size=4, order=1, seed=0)\n"
            "make = lambda: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position='rope')\n"
            "pe.train_seeds(make, task, [0, 1], workers=2, steps=10**7, seq_len=8, batch_size=2, progress=False)\n")
    env = dict(os.environ, POSENC_CACHE=str(tmp_path), POSENC_PROGRESS="0", OMP_NUM_THREADS="2")
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    workers: dict = {}
    try:
        runs = tmp_path / "runs"
        def training():
            workers.update(_children(parent.pid))
            return len(workers) >= 2 and len(list(runs.glob("*.lock"))) >= 2
        assert _wait_for(training, 240), "the workers did not start"
        locks = sorted(runs.glob("*.lock"))
        time.sleep(0.5)  # each worker is past taking its lock
        os.kill(parent.pid, signal.SIGINT)
        parent.wait(timeout=60)
        assert _wait_for(lambda: not any(_alive(p, s) for p, s in workers.items()), 30), "workers left training"
        for lock in locks:  # the run locks can be taken at once
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while held
            finally:
                os.close(fd)
    finally:
        for pid, start in workers.items():
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
