"""The claims ledger: every published claim the book re-tests, recorded once, where it is tested.

A chapter that re-tests a paper's claim records it with :func:`claim`: the
source (BibTeX keys of the book's bibliography), the claim in one sentence,
the measured numbers as the page prints them (``mean (min–max)`` over seeds,
:class:`~posenc.spread.Spread`'s format), the verdict that
:func:`~posenc.judge` computed, and the anchor of the section that tests it.

:func:`claim` hands the verdict to the page's prose (``{glue:text}`claim-<key>```,
and ``claim-<key>-sentence`` with a capital first letter), so that a chapter
states a verdict only through its ledger entry, and leaves the whole entry in
the cell's output as JSON (glued as ``claim-<key>-entry``, not shown), from
which the book's build collects the "Claims re-tested" page
(:func:`entries_in_notebook` reads them back). Nothing is written to files.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from .claims import OUTCOMES, Verdict
from .spread import Spread, _myst_glue

__all__ = ["Claim", "claim", "entries_in_notebook"]

#: The mime type of an entry in a notebook's outputs (glued, so myst-nb stores it without showing it).
ENTRY_MIME = "application/vnd.posenc.claim+json"
_GLUE_PREFIX = "application/papermill.record/"
_KEY = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_BIBKEY = re.compile(r"[A-Za-z][A-Za-z0-9_:.+-]*")
_ANCHOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Claim:
    """One entry of the ledger (see :func:`claim`); ``verdict`` is the verdict's text, ``outcome`` one of the five."""

    key: str
    source: Tuple[str, ...]
    claim: str
    measured: str
    verdict: str
    outcome: str
    section: str

    def as_json(self) -> str:
        """The entry as a JSON object (``source`` a list)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Claim":
        """The entry back from :meth:`as_json`'s object; a missing or unknown field raises ``ValueError``."""
        fields = set(cls.__dataclass_fields__)
        if not isinstance(data, Mapping) or set(data) != fields:
            raise ValueError(f"a ledger entry has the fields {sorted(fields)}, got {data!r}")
        if not isinstance(data["source"], (list, tuple)):  # as written: a list, never one key's characters
            raise ValueError(f"a ledger entry's source is a list of BibTeX keys, got {data['source']!r}")
        key, sources, text, numbers, section = _checked(data["key"], data["source"], data["claim"], data["measured"],
                                                        data["section"])
        outcome, verdict = data["outcome"], data["verdict"]
        if outcome not in OUTCOMES or not isinstance(verdict, str) or not verdict.startswith(outcome):
            raise ValueError(f"a ledger entry's outcome is one of {OUTCOMES} and its verdict begins with it, got "
                             f"outcome {outcome!r}, verdict {verdict!r}")
        return cls(key, sources, text, numbers, verdict, outcome, section)


def _sentence(name: str, text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name} must be a non-empty string, got {text!r}")
    if "\n" in text.strip() or "$" in text:
        raise ValueError(f"{name} is one line of plain text (no line breaks, no math), got {text!r}")
    return " ".join(text.split())


def claim(key: str, *, source: Union[str, Sequence[str]], claim: str, measured: Union[str, Spread],
          verdict: Union[Verdict, str], section: str) -> Claim:
    """Record a re-tested claim in the ledger and hand its verdict to the prose; returns the entry.

    Args:
        key: the claim's name, lower-case words joined by ``-`` (``"alibi-holds"``);
            the prose reads the verdict as ``{glue:text}`claim-<key>``` (or
            ``claim-<key>-sentence``, capitalised).
        source: the BibTeX key of the paper in ``book/references.bib``, or a list of keys.
        claim: the claim in one sentence, as the paper makes it.
        measured: the numbers of the test, as the page prints them (a
            :class:`~posenc.spread.Spread` is written ``mean (min–max)`` with 3 decimals).
        verdict: the verdict of :func:`~posenc.judge` (a :class:`~posenc.Verdict`),
            or one of the five outcomes as a string.
        section: the anchor of the section that tests the claim: a MyST heading's
            slug (``"what-the-tiny-models-reproduce"``) or a ``(label)=`` target.

    Raises:
        ValueError: a key, source or anchor that is not a name, an empty claim or
            measurement, or a verdict that is not one of the five outcomes.

    >>> c = claim("demo", source="press2022alibi", claim="ALiBi holds its loss beyond L.",
    ...           measured="rise 0.01 (0.00–0.02)", verdict=Verdict("reproduced"), section="the-experiment")
    >>> c.verdict, c.source
    ('reproduced', ('press2022alibi',))
    """
    if isinstance(measured, Spread):
        measured = format(measured, ".3f")
    key, sources, text, numbers, section = _checked(key, source, claim, measured, section)
    if isinstance(verdict, Verdict):
        outcome = verdict.outcome
    elif isinstance(verdict, str) and verdict in OUTCOMES:
        outcome = verdict
    else:
        raise ValueError(f"verdict must be a posenc.Verdict (from posenc.judge) or one of {OUTCOMES}, got {verdict!r}")
    entry = Claim(key, sources, text, numbers, str(verdict), outcome, section)
    _publish(entry)
    return entry


def _checked(key: Any, source: Any, claim: Any, measured: Any, section: Any) -> tuple:
    """The fields of an entry as :func:`claim` takes them, checked: ``(key, sources, claim, measured, section)``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"key must be lower-case words joined by '-' (letters and digits), got {key!r}")
    sources = (source,) if isinstance(source, str) else source
    if not isinstance(sources, (list, tuple)) or not sources:
        raise ValueError(f"source must be a BibTeX key or a non-empty list of them, got {source!r}")
    for s in sources:
        if not isinstance(s, str) or not _BIBKEY.fullmatch(s):
            raise ValueError(f"source must hold BibTeX keys of book/references.bib, got {s!r}")
    if len(set(sources)) != len(sources):
        raise ValueError(f"source lists a key twice: {list(sources)}")
    if not isinstance(section, str) or not _ANCHOR.fullmatch(section):
        raise ValueError(f"section must be the anchor of a section (a heading's slug or a label), got {section!r}")
    return key, tuple(sources), _sentence("claim", claim), _sentence("measured", measured), section


def _publish(entry: Claim) -> None:
    """Glue the verdict for the prose and the whole entry for the build (nothing without myst-nb or a kernel)."""
    _myst_glue(f"claim-{entry.key}", entry.verdict)
    _myst_glue(f"claim-{entry.key}-sentence", entry.verdict[:1].upper() + entry.verdict[1:])
    _myst_glue(f"claim-{entry.key}-entry", _Entry(entry))


class _Entry:
    """An entry as a display object: its JSON under :data:`ENTRY_MIME`, and its key as text."""

    def __init__(self, entry: Claim):
        self.entry = entry

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {ENTRY_MIME: json.loads(self.entry.as_json()), "text/plain": f"claim {self.entry.key}"}


def entries_in_notebook(notebook: Mapping[str, Any]) -> List[Claim]:
    """The ledger entries an executed notebook (nbformat 4, as a dict) holds, in the order of its cells.

    Raises:
        ValueError: an entry that cannot be read back, or the same key recorded twice with other contents.
    """
    if not isinstance(notebook, Mapping) or not isinstance(notebook.get("cells", []), list):
        raise ValueError(f"notebook must be an executed notebook as a dict (nbformat 4: json.load of the file), got "
                         f"{type(notebook).__name__}")
    found: Dict[str, Claim] = {}
    for cell in notebook.get("cells", []):
        outputs = cell.get("outputs", []) if isinstance(cell, Mapping) and cell.get("cell_type") == "code" else []
        for output in outputs if isinstance(outputs, list) else []:
            if not isinstance(output, Mapping):
                continue
            name = (output.get("metadata") or {}).get("scrapbook", {}).get("name", "")
            if not (name.startswith("claim-") and name.endswith("-entry")):
                continue
            data = (output.get("data") or {}).get(_GLUE_PREFIX + ENTRY_MIME)
            if isinstance(data, str):
                data = json.loads(data)
            entry = Claim.from_mapping(data)
            if name != f"claim-{entry.key}-entry":
                raise ValueError(f"the output {name} holds the entry of {entry.key!r}")
            if entry.key in found and found[entry.key] != entry:
                raise ValueError(f"claim {entry.key!r} is recorded twice with different contents")
            found[entry.key] = entry
    return list(found.values())
