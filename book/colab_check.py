"""Run chapters as Colab would: a bare Python, the library installed by the chapter's first cell.

Colab starts every notebook in a fresh machine that has torch, numpy, plotly,
ipywidgets and tqdm, but not ``posenc``: the chapter's first cell installs it
from the book's public repository (``%pip install "posenc @ git+URL"``). This
script checks that path anywhere, offline except for the package index:

1. a virtual environment with only those packages and a kernel (ipykernel,
   nbclient), never the system's or the book's site-packages; it is cached
   under ``~/.cache/posenc-colab-check/`` and rebuilt when its inputs change;
2. a git repository standing in for the public one: a clone of this checkout's
   HEAD, with uncommitted changes committed on top (``--head`` leaves them out);
3. for each chapter, a copy whose first cell installs ``posenc`` from
   ``git+file://<that clone>``, executed from a folder outside the repository,
   in small mode unless ``POSENC_SIZE`` says otherwise. ``posenc`` is removed
   from the environment before every chapter, so every first cell installs it.

Usage::

    python book/colab_check.py 01 02      # chapters whose file names start so
    python book/colab_check.py            # every chapter of _toc.yml
    make colab-check CHAPTERS="01 02"

torch: ``--torch`` (or ``POSENC_COLAB_TORCH``) is the pip requirement; by
default the version of the torch that runs this script, so that a local CPU
wheel is reused. pip's own settings (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``,
...) apply, e.g. the CPU wheel index on a CI runner.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book"))
from execute import _poll_in_slices  # noqa: E402  (its source runs inside the environment too)

# What Colab has by default that the chapters use, and what executes a notebook.
COLAB_PACKAGES = ["numpy", "plotly", "ipywidgets", "tqdm", "ipykernel", "nbclient"]
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posenc-colab-check" / "venv"
CELL_TIMEOUT = 600
GIT_USER = ["-c", "user.name=colab-check", "-c", "user.email=colab-check@localhost",
            "-c", "commit.gpgsign=false"]

# Runs inside the environment: execute one notebook with nbclient, save it, and report the first error.
RUNNER = r"""
import sys, time, nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
""" + inspect.getsource(_poll_in_slices) + r"""
_poll_in_slices()  # the book's executor's patch: a missed kernel reply costs half a second, not the timeout

src, dst, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
nb = nbformat.read(src, as_version=4)
started = {}
def on_start(cell, cell_index, **_):
    started[cell_index] = time.perf_counter()
def on_done(cell, cell_index, **_):
    seconds = time.perf_counter() - started.get(cell_index, time.perf_counter())
    if seconds >= 5:
        print(f"  cell {cell_index}: {seconds:.0f} s", flush=True)
client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                        resources={"metadata": {"path": sys.argv[4]}},
                        on_cell_start=on_start, on_cell_executed=on_done)
try:
    client.execute()
except CellExecutionError as err:
    nbformat.write(nb, dst)
    print(str(err)[-6000:], file=sys.stderr)
    sys.exit(1)
nbformat.write(nb, dst)
"""

# Where the kernel's posenc came from: it must be the git URL's, installed into the environment.
ORIGIN = r"""
import json, sys
from importlib import metadata
dist = metadata.distribution("posenc")
print(json.dumps({"file": str(dist.locate_file("posenc/__init__.py")),
                  "direct_url": json.loads(dist.read_text("direct_url.json") or "{}")}))
"""


def _install_cells():
    spec = importlib.util.spec_from_file_location("colab_install_cells", ROOT / "book" / "install_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_torch() -> str:
    """``torch==X.Y.Z`` of the torch running this script (its local CPU wheel), else ``torch``."""
    spec = os.environ.get("POSENC_COLAB_TORCH", "").strip()
    if spec:
        return spec
    try:
        from importlib import metadata

        return "torch==" + metadata.version("torch").split("+")[0]
    except Exception:
        return "torch"


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    return subprocess.run([str(c) for c in cmd], **kwargs)


def select(names, chapters) -> list:
    """The chapters whose file names start with one of ``names`` (all of them when none is given)."""
    if not names or names == ["all"]:
        return list(chapters)
    chosen = []
    for name in names:
        hits = [c for c in chapters if c.stem.startswith(name) or c.stem == Path(name).stem]
        if not hits:
            raise SystemExit(f"colab-check: no chapter matches {name!r}")
        chosen += [c for c in hits if c not in chosen]
    return chosen


def environment_key(torch: str) -> str:
    base = getattr(sys, "_base_executable", sys.executable)
    data = {"python": [base, sys.version], "torch": torch, "packages": COLAB_PACKAGES, "format": 2}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv(venv: Path, torch: str, log) -> Path:
    """The cached Colab-like environment, (re)built when its key changed; returns its python."""
    key = environment_key(torch)
    stamp = venv / ".colab-check-key"
    python = venv_python(venv)
    if stamp.exists() and stamp.read_text().strip() == key and python.exists():
        log(f"environment: reusing {venv}")
        return python
    log(f"environment: creating {venv} ({torch}, {' '.join(COLAB_PACKAGES)})")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Never --system-site-packages: the environment sees only what is installed into it.
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv])
    # A current pip, as on Colab (the pip bundled with an older Python rejects git+file:/// URLs).
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--upgrade", "pip"])
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", torch, *COLAB_PACKAGES])
    run([python, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"], stdout=subprocess.DEVNULL)
    stamp.write_text(key + "\n")
    return python


@contextlib.contextmanager
def locked(path: Path):
    """Hold an exclusive lock on ``path`` (runs of this script on one machine share the environment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no lock
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stand_in_repository(target: Path, head_only: bool, log) -> Path:
    """A git repository with this checkout's HEAD, plus its uncommitted changes unless ``head_only``."""
    if run(["git", "-C", ROOT, "rev-parse", "--verify", "HEAD"], capture_output=True, check=False).returncode:
        raise SystemExit("colab-check: needs a git checkout with at least one commit")
    run(["git", "clone", "--quiet", "--no-hardlinks", ROOT, target])
    if not head_only:
        listed = run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                     capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source, copy = ROOT / name, target / name
            if source.is_file() and not source.is_symlink():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, copy)
            elif not source.exists() and copy.exists():
                copy.unlink()
        run(["git", "-C", target, "add", "-A"])
        if run(["git", "-C", target, "status", "--porcelain"], capture_output=True).stdout.strip():
            run(["git", "-C", target, *GIT_USER, "commit", "--quiet", "--no-verify", "-m", "working tree"])
            log("repository: HEAD + uncommitted changes")
        else:
            log("repository: HEAD")
    return target


def kernel_env(python: Path) -> dict:
    """The environment of a fresh machine: the Colab-like venv first, nothing of the book's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "POSENC_STATIC", "JUPYTER_PATH",
                        "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "IPYTHONDIR", "CONDA_PREFIX")}
    venv = python.parent.parent
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    # The venv's own kernel spec comes first, before any the user installed.
    env["JUPYTER_PATH"] = str(venv / "share" / "jupyter")
    env.setdefault("POSENC_SIZE", "small")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def check_chapter(chapter: Path, python: Path, url: str, work: Path, install_cells, log) -> bool:
    import nbformat

    run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "posenc"], check=False,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = kernel_env(python)
    if run([python, "-c", "import posenc"], env=env, cwd=work, capture_output=True, check=False).returncode == 0:
        log(f"{chapter.stem}: FAILED, posenc is importable before the first cell ran")
        return False
    folder = work / chapter.stem
    folder.mkdir()
    nb = nbformat.read(chapter, as_version=4)
    cell = install_cells.first_code_cell(nb)
    cell.source = install_cells.updated(cell.source, install_cells.install_block(url))
    notebook, executed = folder / chapter.name, folder / f"{chapter.stem}.executed.ipynb"
    nbformat.write(nb, notebook)
    start = time.perf_counter()
    result = run([python, "-c", RUNNER, notebook, executed, CELL_TIMEOUT, folder], env=env, cwd=folder,
                 capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if result.returncode:
        log(f"{chapter.stem}: FAILED after {seconds:.0f} s\n{result.stdout}{result.stderr[-6000:]}")
        return False
    origin = run([python, "-c", ORIGIN], env=env, cwd=folder, capture_output=True, text=True, check=False)
    info = json.loads(origin.stdout) if origin.returncode == 0 else {}
    installed_from = (info.get("direct_url") or {}).get("url", "")
    inside = str(info.get("file", "")).startswith(str(python.parent.parent))
    if not inside or installed_from.rstrip("/") != url.rstrip("/"):
        log(f"{chapter.stem}: FAILED, posenc was not installed by the first cell from {url}: {info}")
        return False
    log(f"{chapter.stem}: ok in {seconds:.0f} s" + (f", slow cells:\n{result.stdout.rstrip()}" if result.stdout.strip() else ""))
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="file-name prefixes such as 01 02 (default: all chapters)")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("POSENC_COLAB_VENV") or DEFAULT_VENV),
                        help=f"the cached environment (default: {DEFAULT_VENV})")
    parser.add_argument("--torch", default=default_torch(), help="pip requirement for torch (default: %(default)s)")
    parser.add_argument("--head", action="store_true", help="test the last commit only, not uncommitted changes")
    parser.add_argument("--keep", action="store_true", help="keep the executed notebooks and print where")
    args = parser.parse_args(argv)

    def log(message):
        print(f"colab-check: {message}", flush=True)

    install_cells = _install_cells()
    chosen = select(args.chapters, install_cells.chapters())
    start = time.perf_counter()
    venv = args.venv.expanduser().absolute()
    passed = failed = 0
    with locked(venv.parent / f"{venv.name}.lock"):
        python = ensure_venv(venv, args.torch, log)
        work = Path(tempfile.mkdtemp(prefix="posenc-colab-"))
        try:
            if ROOT in work.parents:
                raise SystemExit("colab-check: the temporary folder must lie outside the repository")
            repo = stand_in_repository(work / "posenc-repo", args.head, log)
            url = repo.as_uri()
            log(f"first cells install \"posenc @ git+{url}\"")
            runs = work / "runs"
            runs.mkdir()
            for chapter in chosen:
                if check_chapter(repo / chapter.relative_to(ROOT), python, url, runs, install_cells, log):
                    passed += 1
                else:
                    failed += 1
        finally:
            if args.keep:
                log(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
            run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "posenc"], check=False,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log(f"{time.perf_counter() - start:.0f} s in all")
    print(f"colab-check: {passed} passed, {failed} failed", flush=True)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
