"""book/execute.py: the notebooks executed side by side into the execution cache that the book's build reads."""

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("book_execute", ROOT / "book" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["book_execute"] = module  # the worker processes find its function by name
    spec.loader.exec_module(module)
    return module


def test_it_executes_the_book_s_notebooks_in_the_table_of_contents_order(monkeypatch):
    execute = _load()
    names = [p.name for p in execute.book_notebooks()]
    chapters = sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb"))
    assert sorted(names) == chapters and names[0] == "01_why_position.ipynb"
    assert names[-1] == "appendix_cost.ipynb"
    assert [p.name for p in execute.book_notebooks(["08"])] == ["08_stretching.ipynb"]
    settings = execute.execution_settings()
    assert settings == dict(timeout=1200, allow_errors=False)  # as _config.yml tells the build
    monkeypatch.setenv("POSENC_SIZE", "small")
    monkeypatch.setenv("POSENC_SEED", "1")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    cache = execute.build_cache()  # the build's folder, named by the settings and the library's code
    assert cache.parent == ROOT / "_build" and re.fullmatch(r"\.jupyter_cache-small-lib[0-9a-f]{12}-seed1-avx2", cache.name)
    with pytest.raises(SystemExit):
        execute.main(["99"])
    with pytest.raises(SystemExit):
        execute.main(["--jobs", "0"])


def _notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = dict(name="python3", display_name="Python 3", language="python")
    nbformat.write(nb, path)


def _tiny_book(tmp_path, monkeypatch, timeout: int, **notebooks: str):
    """A book in ``tmp_path`` whose table of contents lists ``notebooks`` (name: one code cell each), in order,
    and book/execute.py pointed at it as on a 2-core machine; returns the loaded script."""
    execute = _load()
    (tmp_path / "nb").mkdir()
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n"
                                       + "".join(f"  - file: nb/{name}\n" for name in notebooks), encoding="utf-8")
    (tmp_path / "_config.yml").write_text(f"execute:\n  timeout: {timeout}\n", encoding="utf-8")
    for name, source in notebooks.items():
        _notebook(tmp_path / "nb" / f"{name}.ipynb", source)
    monkeypatch.setattr(execute, "ROOT", tmp_path)
    monkeypatch.setattr(execute, "build_cache", lambda: tmp_path / "_build" / ".jupyter_cache")
    monkeypatch.setattr(execute, "usable_cores", lambda: 2)
    return execute


def test_notebooks_run_side_by_side_and_only_those_that_succeed_are_cached(tmp_path, monkeypatch, capsys):
    from jupyter_cache import get_cache

    # each runs in its own folder, with one thread per notebook on a 2-job run of a 2-core machine
    execute = _tiny_book(tmp_path, monkeypatch, 60,
                         good="import os, pathlib\nprint(pathlib.Path.cwd().name, os.environ['OMP_NUM_THREADS'])",
                         bad="raise KeyError('broken cell')", other="x = 2 + 2")
    assert execute.main(["--jobs", "2"]) == 1  # one failed: status 1, after the others ran
    out = capsys.readouterr().out
    assert "nb/bad.ipynb FAILED" in out and "broken cell" in out and "2 of 3 notebooks" in out
    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    good = nbformat.read(tmp_path / "nb" / "good.ipynb", as_version=4)
    _, merged = cache.merge_match_into_notebook(good)  # what the build finds for the unchanged notebook
    assert merged.cells[0].outputs[0]["text"].split() == ["nb", "1"]
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(tmp_path / "nb" / "bad.ipynb", as_version=4))
    # again: the cached ones are skipped, the failed one runs again
    _notebook(tmp_path / "nb" / "bad.ipynb", "y = 1")
    assert execute.main(["--jobs", "2"]) == 0
    assert "1 notebook, 2 at a time" in capsys.readouterr().out
    assert execute.main([]) == 0
    assert "all 3 notebooks are in the execution cache" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs CPU affinity and 2 CPUs")
def test_the_cores_are_those_the_process_may_run_on():
    """Under taskset or a container's cpuset the kernels share the allowed cores, not every core of the machine."""
    execute = _load()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
            code = 0 if execute.usable_cores() == 1 < (os.cpu_count() or 1) else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert execute.usable_cores() == len(os.sched_getaffinity(0))


def test_slow_cells_are_named_and_a_cell_past_its_timeout_still_fails(tmp_path, monkeypatch, capsys):
    """The kernel's replies are awaited in short slices (a missed reply costs half a second, not the timeout),
    the deadline still holds, and cells slower than SLOW_CELL are named with their time."""
    from jupyter_client.channels import AsyncZMQSocketChannel

    execute = _load()
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", AsyncZMQSocketChannel.get_msg)  # restored afterwards
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(execute, "SLOW_CELL", 0.5)
    _notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(1.0)", "x = 1")
    path, nb, seconds, error = execute._execute(str(tmp_path / "slow.ipynb"), dict(timeout=60, allow_errors=False), 1)
    assert error is None and seconds >= 1.0
    assert AsyncZMQSocketChannel.get_msg._in_slices
    out = capsys.readouterr().out
    assert "slow.ipynb cell 0: 1 s" in out and "cell 1" not in out
    _notebook(tmp_path / "hang.ipynb", "import time\ntime.sleep(60)")
    start = time.perf_counter()
    _, _, _, error = execute._execute(str(tmp_path / "hang.ipynb"), dict(timeout=2, allow_errors=False), 1)
    assert error is not None and "CellTimeoutError" in error and time.perf_counter() - start < 30


def test_a_kernel_that_dies_before_its_first_cell_is_started_again(tmp_path, monkeypatch, capsys):
    """Kernels started side by side can pick the same free port, and one dies before replying; its notebook is
    run again with a new kernel. A kernel that keeps dying is the notebook's failure, reported, never raised."""
    execute = _load()
    monkeypatch.setattr(execute, "KERNEL_STARTS", 2)
    site = tmp_path / "site"
    site.mkdir()
    # the kernel's interpreter exits at start-up until the marker exists: a real death before kernel_info
    (site / "sitecustomize.py").write_text("import os\nmarker = os.environ['MARKER']\n"
                                           "if marker == 'never' or not os.path.exists(marker):\n"
                                           "    open(marker, 'w').close()\n    os._exit(1)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("MARKER", str(tmp_path / "started-once"))
    _notebook(tmp_path / "ok.ipynb", "print(6 * 7)")
    path, nb, seconds, error = execute._execute(str(tmp_path / "ok.ipynb"), dict(timeout=60, allow_errors=False), 1)
    assert error is None and nb.cells[0].outputs[0]["text"].strip() == "42"
    assert "ok.ipynb: the kernel died before its first cell" in capsys.readouterr().out
    monkeypatch.setenv("MARKER", "never")  # every kernel dies
    path, nb, seconds, error = execute._execute(str(tmp_path / "ok.ipynb"), dict(timeout=60, allow_errors=False), 1)
    assert error is not None and "Kernel died" in error and not nb.cells[0].outputs
    assert capsys.readouterr().out.count("the kernel died before its first cell") == 1  # tried twice in all
    # nbclient leaves an exit hook for a kernel that failed to start, which fails with an AssertionError when
    # the process ends (read as a failure of the build); _execute drops it. Seen from a process of its own:
    script = (f"import importlib.util, os, sys\nspec = importlib.util.spec_from_file_location('book_execute', "
              f"{str(ROOT / 'book' / 'execute.py')!r})\nm = importlib.util.module_from_spec(spec)\n"
              f"sys.modules['book_execute'] = m\nspec.loader.exec_module(m)\nm.KERNEL_STARTS = 1\n"
              f"os.environ.update(PYTHONPATH={str(site)!r}, MARKER='never')  # for the kernel only\n"
              f"print(m._execute({str(tmp_path / 'ok.ipynb')!r}, dict(timeout=60, allow_errors=False), 1)[3] is not None)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MARKER")})
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
    assert "AssertionError" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-2000:]


def test_each_notebook_s_training_and_evaluation_cost_is_written_to_the_cost_table(tmp_path, monkeypatch, capsys):
    """The library's accounted calls reach the table through POSENC_COST_LOG; the rest is the notebook's other time."""
    import csv

    execute = _tiny_book(tmp_path, monkeypatch, 120,
                         trains="import time\nfrom posenc._costs import accounted\n"
                                "with accounted('train', runs=2):\n    t = time.process_time()\n"
                                "    while time.process_time() - t < 0.3: pass\n"
                                "with accounted('evaluate'):\n    with accounted('train', runs=5):\n"
                                "        time.sleep(0.2)\n"
                                "time.sleep(0.3)",
                         idle="x = 1")
    assert execute.main(["--jobs", "2"]) == 0
    assert "their costs in" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "_build" / "build_cost.csv").open()))
    assert [r["notebook"] for r in rows] == ["nb/trains.ipynb", "nb/idle.ipynb"]   # the table of contents' order
    trains, idle = rows
    assert trains["runs_trained"] == "2"                        # the nested call is part of the outer one
    assert float(trains["train_core_s"]) >= 0.25                # the busy loop's CPU time
    assert float(trains["evaluate_core_s"]) < 0.15              # sleeping costs no core-seconds
    assert float(trains["rest_s"]) >= 0.25 and float(trains["seconds"]) >= 0.8
    assert idle["runs_trained"] == "0" and float(idle["train_core_s"]) == 0.0
    assert set(rows[0]) == set(execute.COST_COLUMNS) and trains["kernels"] not in ("", "unknown")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "_build" / "build_cost.csv").stat().st_mode & 0o777 == 0o666 & ~umask   # as open() writes


def test_the_cost_log_skips_a_line_cut_short(tmp_path):
    execute = _load()
    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "train", "wall_s": 2, "core_s": 1.5, "runs": 3}\n{"kind": "evaluate", "wall_s": 1, '
                   '"core_s": 0.5}\n{"kind": "train", "wall', encoding="utf-8")
    totals = execute._cost_log_reader()(log)
    assert totals == dict(runs=3.0, train_wall_s=2.0, train_core_s=1.5, evaluate_wall_s=1.0, evaluate_core_s=0.5)
    assert execute._cost_log_reader()(tmp_path / "missing.jsonl")["runs"] == 0.0


def test_the_longest_notebooks_start_first(tmp_path, monkeypatch):
    """By the last execution's times where known, else by the committed cost tables, else the chapters that
    train models first, later ones first; every chapter that trains has a time in the committed tables."""
    execute = _load()
    committed = execute.committed_seconds()
    training = [p for p in execute.book_notebooks() if execute._trains(nbformat.read(p, as_version=4))]
    assert training and all(p.relative_to(ROOT).as_posix() in committed for p in training)
    assert all(seconds > 0 for seconds in committed.values())
    ordered = execute.longest_first(execute.book_notebooks())
    times = [committed[p.relative_to(ROOT).as_posix()] for p in ordered]
    assert sorted(ordered) == sorted(execute.book_notebooks()) and times == sorted(times, reverse=True)
    last = {str(ordered[-1].resolve()): 1e9}  # the last execution's time wins over the table
    assert execute.longest_first(ordered, last)[0] == ordered[-1]
    # without a table: the chapters that train, later ones first, then the others in their order
    book = _tiny_book(tmp_path, monkeypatch, 60, a="x = 1", b="pe.train(model)", c="y = 2", d="pe.train_seeds(f)")
    names = [p.stem for p in book.longest_first(book.book_notebooks())]
    assert names == ["d", "b", "c", "a"]


def test_nbval_starts_a_kernel_again_when_it_dies_as_it_starts(tmp_path, monkeypatch):
    """The repository's conftest.py wraps nbval's kernel start: a death before kernel_info is retried."""
    from nbval.kernel import RunningKernel

    spec = importlib.util.spec_from_file_location("book_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    # nbval's own start (this session's conftest.py has wrapped it already), restored afterwards
    monkeypatch.setattr(RunningKernel, "__init__", getattr(RunningKernel.__init__, "__wrapped__", RunningKernel.__init__))
    assert not getattr(RunningKernel.__init__, "starts_again", False)
    conftest.pytest_configure(None)
    wrapped = RunningKernel.__init__
    conftest.pytest_configure(None)
    assert wrapped.starts_again and RunningKernel.__init__ is wrapped  # wrapped once only
    site, starts = tmp_path / "site", tmp_path / "starts"
    site.mkdir()
    # every start is logged; the interpreter exits at start-up until the marker exists
    (site / "sitecustomize.py").write_text(f"import os\nopen({str(starts)!r}, 'a').write('x')\n"
                                           "marker = os.environ['MARKER']\n"
                                           "if marker == 'never' or not os.path.exists(marker):\n"
                                           "    open(marker, 'w').close()\n    os._exit(1)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("MARKER", str(tmp_path / "started-once"))
    kernel = RunningKernel("python3", cwd=str(tmp_path))
    try:
        assert kernel.km.is_alive() and starts.read_text() == "xx"
    finally:
        kernel.stop()
    monkeypatch.setenv("MARKER", "never")
    starts.write_text("")
    with pytest.raises(RuntimeError, match="died"):
        RunningKernel("python3", cwd=str(tmp_path))
    assert starts.read_text() == "x" * conftest.KERNEL_STARTS
