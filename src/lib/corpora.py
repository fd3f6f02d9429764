"""Characters of real text as a data source: an offline corpus, and two classic ones downloaded once.

:class:`CharCorpus` follows the data-source interface of :mod:`posenc.data`
(``vocab_size``, ``batch``, ``config``) over a text mapped to
:data:`CHARS`, newline and printable ASCII. :func:`python_docs` builds one
offline from the Python documentation every CPython installation ships
(``pydoc_data.topics``, the text behind ``help("assert")``): nothing to
download or bundle, deterministic for a given Python version.
:func:`tiny_shakespeare` and :func:`wikitext` download classic corpora once
into ``~/.cache/posenc/data`` (or ``$POSENC_CACHE/data``), checked against
pinned SHA-256 hashes within a deadline: a partial or wrong download is never
cached.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import sys
import tempfile
import time
import unicodedata
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from ._validate import check_number
from .data import Batch, _check_batch_args, _check_generator
from .runtime import cache_dir

__all__ = ["CHARS", "CharCorpus", "python_docs", "tiny_shakespeare", "wikitext"]

#: The character vocabulary of :class:`CharCorpus`: newline and printable ASCII.
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

_REPLACE = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
            "\u2014": "-", "\u2026": "...", "\t": "    ", "\u00a0": " "}


def _to_ascii(text: str) -> str:
    """Fold text onto :data:`CHARS`: curly quotes and dashes to ASCII, accents
    stripped (NFKD), anything else dropped; Windows line ends become newlines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for a, b in _REPLACE.items():
        text = text.replace(a, b)
    if not text.isascii():
        text = unicodedata.normalize("NFKD", text)
    allowed = set(CHARS)
    return "".join(c for c in text if c in allowed)


class CharCorpus:
    """Characters of a text as tokens, with a train/validation split.

    The vocabulary is fixed, :data:`CHARS` (newline and the 95 printable ASCII
    characters, so ``vocab_size = 96`` for every corpus); other characters are
    folded onto it first (curly quotes to straight ones, accents stripped, the
    rest dropped). The first ``1 - val_fraction`` of the text is the training
    split, the rest the validation split.

    ``batch`` draws ``batch_size`` windows of ``seq_len + 1`` characters at
    uniformly random offsets of the split; ``targets[:, t] = inputs[:, t + 1]``.

    Args:
        text: the raw text.
        name: a short name (part of the cache key, with the text's SHA-256).
        val_fraction: share of the text held out for validation, in (0, 1).
    """

    vocab_size = len(CHARS)

    def __init__(self, text: str, name: str = "text", val_fraction: float = 0.1) -> None:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        if not isinstance(name, str) or not name.strip():  # part of the cache key: a name, not any object
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not 0 < check_number("val_fraction", val_fraction, what=" in (0, 1)") < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
        clean = _to_ascii(text)
        if len(clean) < 100:
            raise ValueError(f"text too short for a corpus: {len(clean)} usable characters")
        self.name, self.val_fraction = name, float(val_fraction)
        self.text = clean
        self.sha256 = hashlib.sha256(clean.encode("ascii")).hexdigest()
        lookup = np.zeros(128, dtype=np.int64)
        lookup[[ord(c) for c in CHARS]] = np.arange(len(CHARS))
        ids = torch.from_numpy(lookup[np.frombuffer(clean.encode("ascii"), dtype=np.uint8)])
        cut = int(len(ids) * (1 - self.val_fraction))
        self.splits = {"train": ids[:cut], "validation": ids[cut:]}

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the corpus (for caching): name, text hash and split."""
        return dict(kind="chars", name=self.name, sha256=self.sha256, val_fraction=self.val_fraction)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v):,}" for k, v in self.splits.items())
        return f"CharCorpus({self.name!r}, {sizes} characters)"

    def encode(self, text: str) -> torch.Tensor:
        """``(len,)`` int64 ids of ``text`` (folded onto :data:`CHARS` first)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return torch.tensor([CHARS.index(c) for c in _to_ascii(text)], dtype=torch.int64)

    def decode(self, ids: torch.Tensor) -> str:
        """The characters of a 1-D tensor (or list) of ids."""
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"ids must be a 1-D tensor or list of integer ids, got {type(ids).__name__}") from None
        if ids.dtype == torch.bool:
            raise ValueError("ids must be integer ids, got booleans")
        if ids.numel() and (ids.is_floating_point() or ids.is_complex() or int(ids.min()) < 0
                            or int(ids.max()) >= len(CHARS)):
            raise ValueError(f"ids must be integers in [0, {len(CHARS)}) (vocab_size), got values from "
                             f"{ids.min().item()} to {ids.max().item()}")
        return "".join(CHARS[int(i)] for i in ids.flatten())

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        data = self.splits[split]
        if len(data) < seq_len + 1:
            raise ValueError(f"the {split} split has {len(data)} characters, fewer than seq_len + 1 = {seq_len + 1}")
        # offsets as fractions of the admissible range: with the same generator
        # state, different seq_len give nearby offsets (overlapping text)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        starts = (u * (len(data) - seq_len)).long()
        idx = starts[:, None] + torch.arange(seq_len + 1)  # (batch, seq_len + 1)
        seq = data[idx]
        return seq[:, :-1], seq[:, 1:]


def python_docs(val_fraction: float = 0.1) -> CharCorpus:
    """The Python documentation topics shipped with CPython, as a character corpus.

    ``pydoc_data.topics.topics`` holds the plain-text pages that
    ``help("keyword")`` prints: mostly the language reference (about 460,000
    characters of English prose with some code for Python 3.11). Topics are
    joined in sorted order, so the corpus is deterministic for a given
    Python release; releases differ, patch releases included (3.11.2's text
    is not 3.11.7's, and 3.12's has about 6% more characters), so its
    name records the full version and the cache key the text's hash.
    Measure what depends on the text against a control trained and
    evaluated on the same corpus, not against another machine's numbers.
    Nothing is downloaded.
    """
    version = ".".join(str(part) for part in sys.version_info[:3])
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # pragma: no cover - pydoc_data is part of the standard library
        raise ValueError("this Python has no pydoc_data (a trimmed standard library): use "
                         "pe.tiny_shakespeare() or pe.CharCorpus(your_text) instead") from err
    text = "\n\n".join(topics[key].strip("\n") for key in sorted(topics))
    name = f"python-{version}-docs"
    return CharCorpus(text, name=name, val_fraction=val_fraction)


# Optional downloads, cached and checksummed --------------------------------
# Hand-written, not pooch: pooch.HTTPDownloader has only a per-read timeout (a server trickling
# a byte every 0.5 s kept pooch 1.9 busy past 20 s with timeout=2); _fetch has an overall deadline.

_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
_WIKITEXT_URL = "https://wikitext.smerity.com/wikitext-{version}-raw-v1.zip"
# Pinned, from the "download_checksums" of huggingface/datasets, datasets/{tiny_shakespeare,wikitext}/dataset_infos.json
_SHA256 = {"tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
           "wikitext-2-raw-v1.zip": "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
           "wikitext-103-raw-v1.zip": "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"}


def _fetch(url: str, filename: str, sha256: Optional[str], root: Optional[Path],
           timeout: float = 300.0, read_timeout: float = 30.0) -> Path:
    """Download ``url`` once into ``root/filename``, which must have SHA-256 ``sha256`` (default: pinned in
    ``_SHA256``); a cached file that does not is deleted and downloaded again (once per call). Each
    download goes to a unique temporary file, must match its Content-Length and hash, then is renamed into place.
    """
    sha256 = _SHA256.get(filename) if sha256 is None else sha256
    if not (isinstance(sha256, str) and len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256.lower())):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    timeout = check_number("timeout", timeout, 0.0, what=" of seconds")
    root = Path(root) if root is not None else cache_dir("data")
    path, expected = root / filename, sha256.lower()
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == expected:
        return path
    path.unlink(missing_ok=True)  # stale, corrupt or wrong: delete it and download again
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=root)
    try:
        deadline = time.monotonic() + timeout
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=min(read_timeout, timeout)) as response:
            length = response.headers.get("Content-Length")
            while chunk := response.read1(1 << 16):  # at most one socket read, so the deadline is checked often
                out.write(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not finished within timeout={timeout:g} s")
        data = Path(tmp).read_bytes()
        if length is not None and len(data) != int(length):
            raise ConnectionError(f"the response ended after {len(data)} of its {length} bytes")
        if (actual := hashlib.sha256(data).hexdigest()) != expected:
            html = " (an HTML page: a captive portal or login page?)" if data[:99].lstrip()[:1] == b"<" else ""
            raise RuntimeError(f"the download of {url} has SHA-256 {actual}, expected {expected}{html}; "
                               f"it was deleted, nothing was cached. Pass sha256= if the file changed upstream.")
        os.replace(tmp, path)
    except (OSError, http.client.HTTPException, ValueError) as err:  # URLError and timeouts are OSErrors
        raise RuntimeError(f"could not download {url} ({err}); the partial download was deleted. The corpus needs "
                           f"an internet connection the first time (on a slow one, pass a larger timeout=); "
                           f"offline, use pe.python_docs() instead, or place the file at {path} yourself.") from err
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def tiny_shakespeare(*, sha256: Optional[str] = None, root: Optional[Path] = None,
                     val_fraction: float = 0.1, timeout: float = 300.0) -> CharCorpus:
    """TinyShakespeare (about 1.1 million characters; Karpathy's char-rnn), downloaded once.

    The file is cached in ``root`` (default ``~/.cache/posenc/data`` or ``$POSENC_CACHE/data``)
    and must match the SHA-256 pinned in the library (or ``sha256``, if given); a cached copy that
    does not is deleted and downloaded again. ``timeout`` bounds the whole download, in seconds.

    Raises:
        ValueError: for a malformed ``sha256`` or ``timeout``.
        RuntimeError: offline on first use, past ``timeout``, or if the download fails its checksum.
    """
    path = _fetch(_SHAKESPEARE_URL, "tinyshakespeare.txt", sha256, root, timeout)
    return CharCorpus(path.read_text(encoding="utf-8"), name="tinyshakespeare", val_fraction=val_fraction)


def wikitext(version: str = "2", *, sha256: Optional[str] = None, root: Optional[Path] = None,
             timeout: Optional[float] = None) -> CharCorpus:
    """WikiText-2 or WikiText-103 (raw, Merity et al. 2017) as a character corpus, downloaded once.

    Uses the official ``wiki.train.raw`` as the training split and
    ``wiki.valid.raw`` as the validation split. The zip (4.7 MB for WikiText-2,
    about 190 MB for WikiText-103) is cached and checked against its pinned
    SHA-256 as in :func:`tiny_shakespeare`; ``timeout`` defaults to 300 s (1800 s for 103).

    Raises:
        ValueError: if ``version`` is not ``"2"`` or ``"103"``, or as in :func:`tiny_shakespeare`.
        RuntimeError: offline on first use, past ``timeout``, or if the download fails its checksum.
    """
    if version not in ("2", "103"):
        raise ValueError(f"version must be '2' or '103', got {version!r}")
    timeout = (1800.0 if version == "103" else 300.0) if timeout is None else timeout
    path = _fetch(_WIKITEXT_URL.format(version=version), f"wikitext-{version}-raw-v1.zip", sha256, root, timeout)
    with zipfile.ZipFile(path) as z:
        def read(split: str) -> str:
            return io.TextIOWrapper(z.open(f"wikitext-{version}-raw/wiki.{split}.raw"), encoding="utf-8").read()
        train_text, valid_text = read("train"), read("valid")
    corpus = CharCorpus(train_text + valid_text, name=f"wikitext-{version}-raw")
    # replace the proportional split by the official one
    n_train = len(_to_ascii(train_text))
    ids = torch.cat(list(corpus.splits.values()))
    corpus.splits = {"train": ids[:n_train], "validation": ids[n_train:]}
    corpus.val_fraction = 1 - n_train / len(ids)
    return corpus
