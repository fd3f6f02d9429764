"""Write the install block of every chapter's first code cell from ``_config.yml``.

Every chapter starts by importing the library. On Colab (or any fresh
environment) it is not installed yet, so the first cell installs it from the
book's repository, ``repository.url`` in ``_config.yml``, the one place that
URL is set::

    python book/install_cells.py          # rewrite the chapters
    python book/install_cells.py --check  # exit 1 if a chapter is out of date

Without a repository URL the cell explains how to install the library instead.
The tests run the check, so a changed URL cannot be forgotten in a chapter.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]

# The block starts at "try:" and ends at its last indented line; a plain import is also recognised.
BLOCK = re.compile(r"^try:\n    import posenc as pe\nexcept ImportError.*?(?=\n(?!    )|\Z)|^import posenc as pe$",
                   re.DOTALL | re.MULTILINE)


def repository_url(config: Path = ROOT / "_config.yml") -> str:
    """``repository.url`` of the book ("" when unset)."""
    data = yaml.safe_load(config.read_text()) or {}
    return str((data.get("repository") or {}).get("url") or "").strip().rstrip("/")


def install_block(url: str) -> str:
    """The lines that import ``posenc``, installing it first where it is missing."""
    if url:
        return ("try:\n    import posenc as pe\n"
                "except ImportError:  # on Colab or in a fresh environment: install the book's library once\n"
                f"    %pip install --quiet \"posenc @ git+{url}\"\n"
                "    import posenc as pe")
    return ("try:\n    import posenc as pe\n"
            "except ImportError as err:  # run the notebooks from the book's repository, or install the library\n"
            "    raise ImportError(\"posenc is not installed: run `pip install -e .` in the book's repository\") from err")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report chapters that are out of date")
    args = parser.parse_args()
    block = install_block(repository_url())
    stale = []
    for path in chapters():
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
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
