"""Write the install block of every chapter's first code cell from the book's repository URL.

Every chapter starts by importing the library. On Colab (or any fresh
environment) it is not installed yet, so the first cell installs it from the
book's public repository::

    python book/install_cells.py          # rewrite the chapters (or: make install-cells)
    python book/install_cells.py --check  # exit 1 if a chapter is out of date

The repository URL is found where the book is published, in this order (see
:func:`discover`):

1. ``repository.url`` in ``_config.yml``, when set;
2. GitHub Actions' ``GITHUB_SERVER_URL`` + ``GITHUB_REPOSITORY``;
3. the ``origin`` remote of the checkout, when it points to GitHub (https or
   ssh form, normalised to ``https://github.com/owner/repo``).

The book's Sphinx extension (``book/_ext/posenc_book.py``) uses the same
discovery for the "open in Colab" buttons, so the buttons and the cells agree.
Without a repository URL the cell says how to install the library instead:
``pip install "posenc @ git+<the book's repository URL>"``, or ``pip install -e .``
in a checkout.
The tests run the check, so a changed URL cannot be forgotten in a chapter.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Tuple

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]

# The block starts at "try:" and ends at its last indented line; a plain import is also recognised.
BLOCK = re.compile(r"^try:\n    import posenc as pe\nexcept ImportError.*?(?=\n(?!    )|\Z)|^import posenc as pe$",
                   re.DOTALL | re.MULTILINE)

# Jupyter Book's own default `repository.url`: never the book's repository.
JUPYTER_BOOK_DEFAULT_REPOSITORY = "https://github.com/executablebooks/jupyter-book"

# A GitHub remote: https://[user[:token]@]github.com/o/r[.git], ssh://git@github.com[:22]/o/r.git,
# git://github.com/o/r.git, or the scp-like git@github.com:o/r.git.
_GITHUB_REMOTE = re.compile(
    r"^(?:(?:https?|ssh|git|git\+ssh)://(?:[^@/]+@)?(?:www\.)?github\.com(?::\d+)?/|(?:[^@/:]+@)?github\.com:/?)"
    r"(?P<owner>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)/(?P<repo>[A-Za-z0-9._-]+?)(?:\.git)?/*$",
    re.IGNORECASE,
)
_OWNER_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?/[A-Za-z0-9._-]+$")


def github_url(remote: str) -> str:
    """``https://github.com/owner/repo`` for a GitHub remote URL (https or ssh form), else ``""``.

    Credentials, a ``.git`` suffix and trailing slashes are dropped, so that
    the URL can be shown on a public page.
    """
    match = _GITHUB_REMOTE.match(remote.strip())
    if not match or match["repo"] in (".", ".."):
        return ""
    return f"https://github.com/{match['owner']}/{match['repo']}"


def configured_url(config: Path = ROOT / "_config.yml") -> str:
    """``repository.url`` of ``_config.yml`` ("" when unset or Jupyter Book's default)."""
    data = yaml.safe_load(config.read_text()) or {}
    url = str((data.get("repository") or {}).get("url") or "").strip().rstrip("/")
    return "" if url == JUPYTER_BOOK_DEFAULT_REPOSITORY else url


def ci_url(env: Mapping[str, str]) -> str:
    """The repository a GitHub Actions run belongs to (``GITHUB_SERVER_URL`` + ``GITHUB_REPOSITORY``)."""
    repository = env.get("GITHUB_REPOSITORY", "").strip().strip("/")
    if not _OWNER_REPO.match(repository):
        return ""
    server = (env.get("GITHUB_SERVER_URL", "").strip() or "https://github.com").rstrip("/")
    if not re.match(r"^https?://[^/@\s]+$", server):
        return ""
    return f"{server}/{repository}"


def remote_url(root: Path = ROOT, remote: str = "origin") -> str:
    """The checkout's ``origin`` as ``https://github.com/owner/repo`` when it is on GitHub, else ``""``."""
    try:
        out = subprocess.run(["git", "-C", str(root), "remote", "get-url", remote],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return github_url(out.stdout) if out.returncode == 0 else ""


def discover(config: Path = ROOT / "_config.yml", env: Optional[Mapping[str, str]] = None,
             root: Optional[Path] = None) -> Tuple[str, str]:
    """``(url, where it came from)`` of the book's repository; ``("", "none")`` when unknown."""
    env = os.environ if env is None else env
    for url, source in ((lambda: configured_url(config), "_config.yml"),
                        (lambda: ci_url(env), "GITHUB_REPOSITORY"),
                        (lambda: remote_url(config.parent if root is None else root), "git remote origin")):
        found = url()
        if found:
            return found, source
    return "", "none"


def repository_url(config: Path = ROOT / "_config.yml", env: Optional[Mapping[str, str]] = None,
                   root: Optional[Path] = None) -> str:
    """The book's repository URL ("" when it cannot be found): see :func:`discover`."""
    return discover(config, env, root)[0]


def install_block(url: str) -> str:
    """The lines that import ``posenc``, installing it first where it is missing.

    ``url`` is anything pip takes after ``git+``: ``https://github.com/o/r``,
    ``https://github.com/o/r@v1.0`` or a local ``file:///path/to/clone``.
    """
    if url:
        return ("try:\n    import posenc as pe\n"
                "except ImportError:  # on Colab or in a fresh environment: install the book's library once\n"
                f"    %pip install --quiet \"posenc @ git+{url}\"\n"
                "    import posenc as pe")
    return ("try:\n    import posenc as pe\n"
            "except ImportError as err:  # not installed here: install the book's library first\n"
            "    raise ImportError(\"posenc is not installed: run `pip install \\\"posenc @ git+<the book's repository URL>\\\"`, \"\n"
            "                      \"or `pip install -e .` in a checkout of the book's repository\") from err")


def chapters(root: Path = ROOT) -> list:
    """The chapter notebooks listed in ``_toc.yml``, in order."""
    toc = (root / "_toc.yml").read_text()
    return [root / f"{name}.ipynb" for name in re.findall(r"file:\s*(chapters/\S+)", toc)]


def first_code_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


def updated(source: str, block: str) -> str:
    if not BLOCK.search(source):
        raise ValueError("the first code cell does not import posenc as pe")
    return BLOCK.sub(lambda _: block, source, count=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report chapters that are out of date")
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's folder (default: this checkout)")
    args = parser.parse_args(argv)
    url, source = discover(args.root / "_config.yml")
    print(f"repository URL: {url or '(none)'} (from {source})")
    block = install_block(url)
    stale = []
    for path in chapters(args.root):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        new = updated(cell.source, block)
        if new != cell.source:
            stale.append(path.name)
            if not args.check:
                cell.source = new
                nbformat.write(nb, path)
    verb = "out of date" if args.check else "updated"
    print(f"{len(stale)} chapter(s) {verb}" + (": " + ", ".join(stale) if stale else ""))
    if args.check and stale:
        print("run `make install-cells` (python book/install_cells.py) and commit the chapters")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
