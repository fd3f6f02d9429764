"""Print pip constraints that pin every requirement to the lowest version its range declares.

    python .github/lowest_constraints.py --available > constraints-lowest.txt
    PIP_CONSTRAINT=constraints-lowest.txt make test

Reads ``requirements.txt`` and ``pyproject.toml``'s dependencies (the highest
lower bound wins when both name a package); a requirement without a lower
bound is left free. A bound need not be a release (``pytest-xdist>=3`` has no
3.0.0): ``--available`` asks the package index (``pip index versions``, with
pip's settings, for the running Python) for the lowest release at or above
each bound. Standard library only, so that it runs on any Python >= 3.9
before a virtual environment exists (the weekly workflow's "oldest" job).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name[extras] followed by version specifiers, an optional environment marker after ";".
_REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;#]*)")
_LOWER = re.compile(r"(>=|==|~=)\s*(?P<version>[0-9][A-Za-z0-9.!+*-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_key(version: str):
    return [int(part) if part.isdigit() else 0 for part in re.split(r"[.+!-]", version)]


def lower_bound(requirement: str):
    """``(name, version)`` of a requirement's lower bound (``>=``, ``==``, ``~=``), else ``None``."""
    match = _REQUIREMENT.match(requirement)
    if not match:
        return None
    bounds = [m["version"].rstrip(".*") for m in _LOWER.finditer(match["spec"])]
    if not bounds:
        return None
    return canonical(match["name"]), max(bounds, key=_version_key)


def requirements_txt(text: str) -> list:
    lines = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            lines.append(line)
    return lines


def pyproject_dependencies(text: str) -> list:
    """The quoted strings of ``dependencies = [...]`` and of ``[project.optional-dependencies]``."""
    found = []
    for block in re.findall(r"^dependencies\s*=\s*\[(.*?)\]", text, re.DOTALL | re.MULTILINE):
        found += re.findall(r"\"([^\"]+)\"|'([^']+)'", block)
    optional = re.search(r"^\[project\.optional-dependencies\]\s*$(.*?)(?=^\[|\Z)", text, re.DOTALL | re.MULTILINE)
    if optional:
        for block in re.findall(r"=\s*\[(.*?)\]", optional.group(1), re.DOTALL):
            found += re.findall(r"\"([^\"]+)\"|'([^']+)'", block)
    return [a or b for a, b in found]


def constraints(root: Path = ROOT) -> dict:
    """``{name: lowest version}`` over requirements.txt and pyproject.toml."""
    pins = {}
    requirements = requirements_txt((root / "requirements.txt").read_text())
    requirements += pyproject_dependencies((root / "pyproject.toml").read_text())
    for requirement in requirements:
        bound = lower_bound(requirement)
        if bound:
            name, version = bound
            if name not in pins or _version_key(version) > _version_key(pins[name]):
                pins[name] = version
    return pins


_RELEASE = re.compile(r"^[0-9]+(?:\.[0-9]+)*(?:\.post[0-9]+)?(?:\+[A-Za-z0-9.]+)?$")


def lowest_available(bound: str, versions) -> str:
    """The lowest final release in ``versions`` at or above ``bound`` (local labels such as +cpu dropped)."""
    releases = {v.strip().split("+")[0] for v in versions if _RELEASE.match(v.strip())}
    at_least = [v for v in releases if _version_key(v) >= _version_key(bound)]
    return min(at_least, key=_version_key) if at_least else bound


def index_versions(name: str) -> list:
    """The versions ``pip index versions`` lists for ``name`` ([] when the index cannot be asked)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                         capture_output=True, text=True, check=False)
    match = re.search(r"^Available versions:\s*(.*)$", out.stdout, re.MULTILINE)
    return match.group(1).split(",") if match else []


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    available = "--available" in args
    print("# The lowest versions the requirement ranges declare: python .github/lowest_constraints.py"
          + (" --available" if available else ""))
    for name, version in sorted(constraints().items()):
        if available:
            versions = index_versions(name)
            if not versions:
                print(f"lowest_constraints: the index lists no version of {name}", file=sys.stderr)
            version = lowest_available(version, versions)
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
