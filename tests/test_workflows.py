"""Publishing: the GitHub workflows, the repository URL the site and the chapters use, and the package.

The workflows cannot run here, so they are checked as files: against GitHub's
workflow schema (check-jsonschema's vendored copy) and by zizmor's offline
audits, both without the network (a dead proxy makes any request fail).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
# Any request a tool tries goes to a closed port on this machine and fails at once.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
# and no token that would let a tool go online
TOKENS = ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


install_cells = _load("install_cells_for_publishing", ROOT / "book" / "install_cells.py")
lowest = _load("lowest_constraints", ROOT / ".github" / "lowest_constraints.py")
colab_check = _load("colab_check", ROOT / "book" / "colab_check.py")


def _tool(name: str) -> str:
    """An executable of this environment (requirements.txt installs it), else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is missing: install requirements.txt (`make venv`)")
    return found


def _run(cmd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in TOKENS}
    env.update(OFFLINE)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=300, **kwargs)


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _steps(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


# --- the workflow files ---------------------------------------------------------------------------------

def test_the_workflows_exist():
    assert {p.name for p in WORKFLOW_FILES} >= {"ci.yml", "weekly.yml", "release.yml"}


def test_workflows_match_github_schema():
    result = _run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *WORKFLOW_FILES])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_finds_nothing_of_medium_severity_or_above():
    result = _run([_tool("zizmor"), "--offline", "--min-severity", "medium", WORKFLOWS])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_would_catch_a_bad_workflow(tmp_path):
    """The audit is not vacuous: credentials left in the checkout and a title run as shell code are findings."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: pull_request_target\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - uses: actions/checkout@v4\n"
                   "      - run: echo \"${{ github.event.pull_request.title }}\"\n")
    result = _run([_tool("zizmor"), "--offline", "--min-severity", "medium", bad.parent])
    assert result.returncode != 0 and "template-injection" in result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_actions_are_pinned_and_checkouts_keep_no_credentials(path):
    workflow = _workflow(path.name)
    assert workflow.get("permissions") == {}, "no permission by default; each job asks for its own"
    for job, step in _steps(workflow):
        uses = step.get("uses")
        if uses:
            ref = uses.rpartition("@")[2]
            assert len(ref) == 40 and all(c in "0123456789abcdef" for c in ref), f"{job}: {uses} not pinned by SHA"
        if uses and uses.startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{job}: checkout persists credentials"


def test_ci_builds_tests_and_deploys_main_to_pages():
    ci = _workflow("ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    assert "download.pytorch.org/whl/cpu" in ci["env"]["PIP_EXTRA_INDEX_URL"], "CPU torch wheels only"
    runs = "\n".join(step.get("run", "") for _, step in _steps(ci))
    assert "make book" in runs and "make test" in runs and "POSENC_REQUIRE_SITE=1" in runs
    cached = [step["with"]["path"] for _, step in _steps(ci) if step.get("uses", "").startswith("actions/cache@")]
    assert any(".venv" in p for p in cached) and any(".jupyter_cache" in p for p in cached)
    assert any("~/.cache/posenc" in p for p in cached), "the run cache of trained models"
    venv_key = next(s["with"]["key"] for _, s in _steps(ci) if s.get("with", {}).get("path") == ".venv")
    assert "requirements.txt" in venv_key and "pyproject.toml" in venv_key
    deploy = ci["jobs"]["deploy"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert "refs/heads/main" in deploy["if"] and deploy["environment"]["name"] == "github-pages"
    used = {step.get("uses", "").split("@")[0] for _, step in _steps(ci)}
    assert {"actions/configure-pages", "actions/upload-pages-artifact", "actions/deploy-pages"} <= used
    assert ci["jobs"]["book"]["permissions"] == {"contents": "read"}


def test_ci_publishes_the_reader_notebooks_where_the_colab_buttons_open_them():
    ci = _workflow("ci.yml")
    ext = _load("posenc_book_for_workflow_test", ROOT / "book" / "_ext" / "posenc_book.py")
    upload = next(s for _, s in _steps(ci) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"].rstrip("/") == "_build/html/_notebooks"       # where the site writes them
    job = ci["jobs"]["reader-notebooks"]
    assert job["needs"] == "book" and "refs/heads/main" in job["if"]
    assert job["permissions"] == {"contents": "write"}                            # this job only
    push = "\n".join(step.get("run", "") for step in job["steps"])
    assert f"HEAD:{ext.READER_BRANCH}" in push and "--force" in push
    assert "${{" not in push                                                       # no expression in the script


def test_weekly_checks_newest_oldest_and_colab_and_reports_failures():
    weekly = _workflow("weekly.yml")
    assert weekly["on"]["schedule"][0]["cron"]
    jobs = weekly["jobs"]
    assert {"newest", "oldest", "colab", "report"} <= set(jobs)
    oldest = "\n".join(step.get("run", "") for step in jobs["oldest"]["steps"])
    assert "lowest_constraints.py" in oldest and "PIP_CONSTRAINT" in oldest and "make test" in oldest
    assert "colab_check.py" in "\n".join(step.get("run", "") for step in jobs["colab"]["steps"])
    report = jobs["report"]
    assert "failure()" in report["if"] and set(report["needs"]) == {"newest", "oldest", "colab"}
    assert report["permissions"] == {"issues": "write"}
    assert "gh issue create" in report["steps"][-1]["run"]


def test_release_builds_checks_and_publishes_with_trusted_publishing_only():
    release = _workflow("release.yml")
    assert release["on"]["push"]["tags"] == ["v*"]
    dist = "\n".join(step.get("run", "") for step in release["jobs"]["dist"]["steps"])
    assert "python -m build" in dist and "twine check --strict" in dist
    assert release["jobs"]["dist"]["permissions"] == {"contents": "read"}
    assert release["jobs"]["pypi"]["permissions"] == {"id-token": "write"}
    assert "secrets." not in (WORKFLOWS / "release.yml").read_text(), "trusted publishing, no token"


# --- the repository URL -----------------------------------------------------------------------------------

@pytest.mark.parametrize("remote", [
    "https://github.com/example/train-short-test-long",
    "https://github.com/example/train-short-test-long.git",
    "https://github.com/example/train-short-test-long/",
    "http://github.com/example/train-short-test-long.git",
    "https://user:ghp_secret@github.com/example/train-short-test-long.git",
    "git@github.com:example/train-short-test-long.git",
    "git@github.com:example/train-short-test-long",
    "ssh://git@github.com/example/train-short-test-long.git",
    "ssh://git@github.com:22/example/train-short-test-long",
    "git://github.com/example/train-short-test-long.git",
    "  https://GitHub.com/example/train-short-test-long.git\n",
])
def test_github_remotes_are_normalised(remote):
    assert install_cells.github_url(remote) == "https://github.com/example/train-short-test-long"


@pytest.mark.parametrize("remote", [
    "", "/work/main", "file:///work/main", "../book.git",
    "https://gitlab.com/example/book.git", "git@gitlab.com:example/book.git",
    "https://github.com/example", "https://github.com.evil.org/example/book",
    "https://example.org/github.com/example/book",
])
def test_other_remotes_give_no_url(remote):
    assert install_cells.github_url(remote) == ""


def test_github_actions_environment():
    env = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "example/book"}
    assert install_cells.ci_url(env) == "https://github.com/example/book"
    assert install_cells.ci_url({"GITHUB_REPOSITORY": "example/book"}) == "https://github.com/example/book"
    assert install_cells.ci_url({}) == ""
    assert install_cells.ci_url({"GITHUB_REPOSITORY": "not a repository"}) == ""
    assert install_cells.ci_url({"GITHUB_REPOSITORY": "a/b", "GITHUB_SERVER_URL": "javascript:alert(1)"}) == ""


def _book(tmp_path: Path, url: str = "", origin: str = "") -> Path:
    book = tmp_path / "book"
    book.mkdir()
    (book / "_config.yml").write_text(f'title: t\nrepository:\n  url: "{url}"\n  branch: main\n')
    subprocess.run(["git", "init", "-q", str(book)], check=True)
    if origin:
        subprocess.run(["git", "-C", str(book), "remote", "add", "origin", origin], check=True)
    return book


def test_discovery_order(tmp_path):
    ci = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "ci/book"}
    book = _book(tmp_path, origin="git@github.com:remote/book.git")
    config = book / "_config.yml"
    assert install_cells.discover(config, env=ci) == ("https://github.com/ci/book", "GITHUB_REPOSITORY")
    assert install_cells.discover(config, env={}) == ("https://github.com/remote/book", "git remote origin")
    config.write_text('repository:\n  url: "https://github.com/configured/book/"\n')
    assert install_cells.discover(config, env=ci) == ("https://github.com/configured/book", "_config.yml")
    # Jupyter Book's own default is never the book's repository.
    config.write_text("repository:\n  url: https://github.com/executablebooks/jupyter-book\n")
    assert install_cells.discover(config, env={})[0] == "https://github.com/remote/book"


def test_no_url_without_github(tmp_path):
    book = _book(tmp_path, origin="https://gitlab.com/example/book.git")
    assert install_cells.discover(book / "_config.yml", env={}) == ("", "none")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "_config.yml").write_text("title: t\n")
    assert install_cells.repository_url(plain / "_config.yml", env={}) == ""


def test_install_cells_writes_the_discovered_url(tmp_path, monkeypatch):
    """The command rewrites every chapter from the discovered URL, and --check then passes."""
    book = _book(tmp_path, origin="git@github.com:example/book.git")
    (book / "chapters").mkdir()
    (book / "_toc.yml").write_text("root: intro\nchapters:\n  - file: chapters/one\n")
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                     "source": "import torch\nimport posenc as pe\n"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 4}
    (book / "chapters" / "one.ipynb").write_text(json.dumps(nb))
    for name in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    assert install_cells.main(["--check", "--root", str(book)]) == 1
    assert install_cells.main(["--root", str(book)]) == 0
    assert install_cells.main(["--check", "--root", str(book)]) == 0
    cell = json.loads((book / "chapters" / "one.ipynb").read_text())["cells"][0]
    assert '%pip install --quiet "posenc @ git+https://github.com/example/book"' in "".join(cell["source"])


def test_this_checkout_has_no_url_and_plain_cells(monkeypatch):
    """Here: no URL in _config.yml, no GitHub remote; outside GitHub Actions the chapters keep the plain block."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        pytest.skip("on GitHub Actions the repository is known")
    if install_cells.configured_url() or install_cells.remote_url():
        pytest.skip("this checkout is published: its URL is set or its origin is on GitHub")
    for name in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    assert install_cells.repository_url() == ""


def _theme(app_dir: Path, monkeypatch, env: dict, repository_url=""):
    for name in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ext = _load("posenc_book_for_test", ROOT / "book" / "_ext" / "posenc_book.py")
    config = SimpleNamespace(html_theme_options={"repository_url": repository_url, "repository_branch": "main",
                                                 "path_to_docs": ""})
    ext._colab_button(SimpleNamespace(srcdir=str(app_dir)), config)
    return config.html_theme_options


def test_site_gets_colab_buttons_from_the_ci_environment(tmp_path, monkeypatch):
    book = _book(tmp_path)
    options = _theme(book, monkeypatch, {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "ci/book"})
    assert options["repository_url"] == "https://github.com/ci/book"
    assert options["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert options["use_repository_button"] is True


def test_site_gets_colab_buttons_from_a_github_remote(tmp_path, monkeypatch):
    book = _book(tmp_path, origin="git@github.com:example/train-short-test-long.git")
    options = _theme(book, monkeypatch, {})
    assert options["repository_url"] == "https://github.com/example/train-short-test-long"
    assert options["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


def test_site_has_no_colab_button_without_a_repository(tmp_path, monkeypatch):
    book = _book(tmp_path, origin="https://gitlab.com/example/book.git")
    options = _theme(book, monkeypatch, {})
    assert options["launch_buttons"]["colab_url"] == "" and not options["repository_url"]
    assert not options.get("use_repository_button")


def test_configured_url_wins_on_the_site(tmp_path, monkeypatch):
    book = _book(tmp_path, origin="git@github.com:remote/book.git")
    options = _theme(book, monkeypatch, {"GITHUB_REPOSITORY": "ci/book"}, "https://github.com/configured/book")
    assert options["repository_url"] == "https://github.com/configured/book"


# --- the Colab-like check -----------------------------------------------------------------------------------

def test_colab_check_selects_chapters_by_prefix():
    chapters = install_cells.chapters()
    assert [c.stem[:2] for c in colab_check.select(["01", "02"], chapters)] == ["01", "02"]
    assert colab_check.select([], chapters) == chapters == colab_check.select(["all"], chapters)
    with pytest.raises(SystemExit, match="no chapter matches"):
        colab_check.select(["99"], chapters)


def test_colab_kernel_sees_nothing_of_the_book_environment(monkeypatch, tmp_path):
    for name, value in {"VIRTUAL_ENV": str(ROOT / ".venv"), "PYTHONPATH": str(ROOT / "src"),
                        "POSENC_STATIC": "1", "JUPYTER_PATH": "/elsewhere"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("POSENC_SIZE", raising=False)
    python = tmp_path / "venv" / "bin" / "python"
    env = colab_check.kernel_env(python)
    assert "PYTHONPATH" not in env and "POSENC_STATIC" not in env
    assert env["VIRTUAL_ENV"] == str(tmp_path / "venv") and env["PATH"].startswith(str(python.parent))
    assert env["JUPYTER_PATH"] == str(tmp_path / "venv" / "share" / "jupyter")
    assert env["POSENC_SIZE"] == "small"


def test_install_block_takes_a_local_git_url():
    block = install_cells.install_block("file:///tmp/posenc-repo")
    assert '%pip install --quiet "posenc @ git+file:///tmp/posenc-repo"' in block


# --- the lowest declared dependencies -----------------------------------------------------------------------

def test_lowest_constraints_read_requirements_and_pyproject():
    pins = lowest.constraints()
    assert pins["torch"] == "2.1" and pins["numpy"] == "1.23" and pins["jupyter-book"] == "1.0.4"
    assert pins["plotly"] == "5.20", "the upper bound is not a lower bound"
    assert "posenc" not in pins


def test_lowest_constraints_parsing():
    assert lowest.lower_bound("plotly>=5.20,<8") == ("plotly", "5.20")
    assert lowest.lower_bound("Foo_Bar[extra] >= 1.2 ; python_version < '3.10'") == ("foo-bar", "1.2")
    assert lowest.lower_bound("torch") is None and lowest.lower_bound("x<2") is None
    text = '[project]\ndependencies = [\n    "torch>=2.1",\n]\n[project.optional-dependencies]\nw = ["ipywidgets>=8"]\n'
    assert lowest.pyproject_dependencies(text) == ["torch>=2.1", "ipywidgets>=8"]
    assert lowest.requirements_txt("# c\n-e .\npytest>=7  # why\n\n") == ["pytest>=7"]


def test_lowest_available_release():
    versions = ["3.8.0", "3.0.2", "2.5.0", "3.1.0rc1", "3.0.2+cpu"]
    assert lowest.lowest_available("3", versions) == "3.0.2"
    assert lowest.lowest_available("2.1", ["2.1.0+cpu", "2.1.0", "2.0.1"]) == "2.1.0"
    assert lowest.lowest_available("9", versions) == "9", "no release: the bound itself, and pip says why"


# --- the package ------------------------------------------------------------------------------------------

def test_wheel_and_sdist_build_and_pass_twine_check(tmp_path):
    """python -m build (this environment's setuptools, no download) makes a wheel and sdist twine accepts."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src" / "lib", src / "src" / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], cwd=src)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, = dist.glob("posenc-*.whl")
    sdist, = dist.glob("posenc-*.tar.gz")
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = zipfile.ZipFile(wheel).namelist()
    assert "posenc/__init__.py" in names and "posenc/py.typed" in names
    shipped = sorted(p.name for p in (ROOT / "src" / "lib" / "measured").glob("*.csv"))
    assert shipped and all(f"posenc/measured/{name}" in names for name in shipped), "measurements are package data"
    # installed from the wheel (no checkout in sight), the chapters' measurements are read from the package
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", site,
                      wheel])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    kinds = sorted({name.rsplit("-", 1)[0] for name in shipped})      # attention, flex_profile, train_throughput
    code = ("import posenc as pe; assert pe.__file__.startswith(%r), pe.__file__; "
            "print(sorted(source for kind in %r for source in pe.measured_costs(kind)))" % (str(site), kinds))
    read = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=elsewhere,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert read.returncode == 0, read.stderr[-3000:]
    assert read.stdout.strip() == str([f"posenc/measured/{name}" for name in shipped])
    with tarfile.open(sdist) as tar:
        assert any(n.endswith("/src/lib/__init__.py") for n in tar.getnames())
