"""Training data for the tiny models: synthetic tasks and character corpora.

Every data source has the same small interface:

* ``vocab_size``: number of token ids;
* ``batch(batch_size, seq_len, generator=None, *, split="train")`` returns
  ``(inputs, targets)``, two ``(batch_size, seq_len)`` int64 CPU tensors;
  ``targets[:, t]`` is what the model should predict after reading
  ``inputs[:, :t + 1]``, and ``-100`` (:data:`IGNORE_INDEX`) marks positions
  that do not count in the loss;
* ``config``: a dict that identifies the data (used as a cache key).

The same ``generator`` state gives the same batch, so everything is
reproducible from a seed.

Sources:

* :class:`MarkovChain`: a random order-``k`` Markov chain (an ``n``-gram
  source) fixed by a seed. The next token depends only on the previous ``k``
  tokens: a task with purely *local* structure, whose best possible loss (the
  entropy rate) is known exactly (:meth:`MarkovChain.entropy_rate`).
* :class:`FirstTokenRetrieval`: the first token is a key that must be
  reproduced at marked positions arbitrarily far later: a task that needs
  *global* context.
* :class:`LaggedCopy`: each token repeats the one ``lag`` places back with
  probability ``p_copy`` (chapter 10's task for local attention).
* :class:`CharCorpus`: characters of real text. :func:`python_docs` builds
  one offline from the Python documentation every CPython installation ships
  (``pydoc_data.topics``, the text behind ``help("assert")``): nothing to
  download or bundle, deterministic for a given Python version.
  :func:`tiny_shakespeare` and :func:`wikitext` download classic corpora once
  into ``~/.cache/posenc/data`` (or ``$POSENC_CACHE/data``), checked against
  pinned SHA-256 hashes within a deadline: a partial or wrong download is
  never cached.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import math
import os
import sys
import tempfile
import time
import unicodedata
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ._validate import check_bool, check_int, check_number
from .runtime import cache_dir

__all__ = [
    "IGNORE_INDEX",
    "CHARS",
    "MarkovChain",
    "FirstTokenRetrieval",
    "LaggedCopy",
    "CharCorpus",
    "python_docs",
    "tiny_shakespeare",
    "wikitext",
]

#: Target value that the loss ignores (PyTorch's ``cross_entropy`` default).
IGNORE_INDEX = -100

#: The character vocabulary of :class:`CharCorpus`: newline and printable ASCII.
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

_SPLITS = ("train", "validation")
_IDS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)  # dtypes of token ids

Batch = Tuple[torch.Tensor, torch.Tensor]


def _check_batch_args(batch_size: int, seq_len: int, split: str) -> Tuple[int, int]:
    """``(batch_size, seq_len)`` as Python ints >= 1 (NumPy and 0-d tensors too); ``split`` one of the splits."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    return check_int("batch_size", batch_size), check_int("seq_len", seq_len)


def _probability(name: str, value: Any) -> float:
    p = check_number(name, value, what=" (a probability in [0, 1])")
    if not 0 <= p <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return p


def _check_generator(generator: Optional[torch.Generator]) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


# A random Markov chain: local structure ------------------------------------


def _dirichlet_log_space(rng: np.random.RandomState, alpha: float, rows: int, size: int) -> np.ndarray:
    """``rows`` draws of a symmetric Dirichlet(``alpha``) over ``size`` values, exact for any ``alpha > 0``.

    ``Gamma(a) = Gamma(a + 1) U^(1/a)`` (Marsaglia & Tsang), so ``log G = log
    Gamma(a + 1) + log(U) / a`` is finite even where ``G`` underflows, and a
    softmax of the logs normalises.
    """
    log_g = np.log(rng.gamma(alpha + 1.0, size=(rows, size))) + np.log(rng.uniform(size=(rows, size))) / alpha
    g = np.exp(log_g - log_g.max(axis=1, keepdims=True))
    return g / g.sum(axis=1, keepdims=True)


class MarkovChain:
    """A random order-``k`` Markov chain over ``vocab_size`` tokens (an n-gram source).

    For every context ``c = (x_{t-k}, ..., x_{t-1})`` the next-token distribution ``P(. | c)`` is drawn once
    from a symmetric Dirichlet distribution with concentration ``alpha`` (NumPy's ``RandomState(seed)``, whose
    stream is stable across versions); small ``alpha`` makes each context predict a few tokens sharply.
    Sequences start from a uniformly random context. The best achievable loss is the entropy rate
    (:meth:`entropy_rate`): a model that attends to the last ``k`` tokens and nothing else is optimal, so the
    task rewards *local* attention.

    Args:
        vocab_size: number of tokens ``V`` (at most 2**20 contexts ``V**order``, 2**24 probabilities ``V**(order+1)``).
        order: ``k >= 1``.
        alpha: Dirichlet concentration (> 0).
        seed: fixes the transition table.

    ``batch`` returns ``targets[:, t] = inputs[:, t + 1]`` of one chain of ``seq_len + 1`` tokens. ``split``
    is accepted for a common interface (both splits sample the same chain; pass different generators).
    """

    def __init__(self, vocab_size: int = 16, order: int = 2, alpha: float = 0.1, seed: int = 0) -> None:
        vocab_size, order, seed = (check_int(name, value, low) for name, value, low in
                                   (("vocab_size", vocab_size, 2), ("order", order, 1), ("seed", seed, 0)))
        if (entries := vocab_size ** (order + 1)) > 2 ** 24 or vocab_size ** order > 2 ** 20:  # before NumPy allocates
            raise ValueError(f"vocab_size={vocab_size}, order={order}: {vocab_size ** order} contexts (max 2**20), a "
                             f"table of {entries} float64 probabilities, {8 * entries / 2 ** 30:.3g} GiB (max 2**24, "
                             "0.125 GiB), is too many: use a smaller vocab_size or order")
        alpha = check_number("alpha", alpha, 0.0)
        self.vocab_size, self.order, self.alpha, self.seed = vocab_size, order, float(alpha), seed
        rng = np.random.RandomState(seed)
        with np.errstate(invalid="ignore", divide="ignore"):
            probs = rng.dirichlet(np.full(vocab_size, self.alpha), size=vocab_size ** order)
        bad = ~np.isfinite(probs).all(axis=1) | ~np.isclose(probs.sum(axis=1), 1.0)
        if bad.any():  # tiny alpha: every gamma draw of a row underflows (0 / 0); draw in log space instead
            probs[bad] = _dirichlet_log_space(rng, self.alpha, int(bad.sum()), vocab_size)
        #: ``(V**k, V)`` float64 transition table; row ``c`` is ``P(. | context c)``,
        #: with context index ``c = sum_j x_{t-k+j} V^(k-1-j)`` (oldest token most significant).
        self.transitions = torch.from_numpy(probs)
        self._cdf = self.transitions.cumsum(-1).float()
        self._cdf[:, -1] = 1.0 + 1e-6  # guard against rounding at the top end

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the source (for caching)."""
        return dict(kind="markov", vocab_size=self.vocab_size, order=self.order,
                    alpha=self.alpha, seed=self.seed)

    def __repr__(self) -> str:
        return f"MarkovChain(vocab_size={self.vocab_size}, order={self.order}, alpha={self.alpha:g}, seed={self.seed})"

    def sample(self, batch_size: int, length: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(batch_size, length)`` int64 tokens of the chain."""
        batch_size, length = _check_batch_args(batch_size, length, "train")
        _check_generator(generator)
        v, k = self.vocab_size, self.order
        total = length + k
        out = torch.empty(batch_size, total, dtype=torch.int64)
        out[:, :k] = torch.randint(v, (batch_size, k), generator=generator)
        u = torch.rand(total - k, batch_size, 1, generator=generator).numpy()  # all uniforms at once
        # token by token in NumPy (a few times faster than torch calls); writing `tokens` writes `out`
        cdf, tokens = self._cdf.numpy(), out.numpy()
        ctx = np.zeros(batch_size, dtype=np.int64)
        for j in range(k):
            ctx = ctx * v + tokens[:, j]
        shift = (np.arange(v ** k) % v ** (k - 1)) * v  # context -> its last k-1 tokens, shifted left
        for t in range(k, total):  # the last cdf entry exceeds 1 > u: the count is at most v - 1
            nxt = (cdf[ctx] <= u[t - k]).sum(1)  # = searchsorted(right=True)
            tokens[:, t] = nxt
            ctx = shift[ctx] + nxt
        return out[:, k:]

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        seq = self.sample(batch_size, seq_len + 1, generator)
        return seq[:, :-1], seq[:, 1:]

    def optimal_nll(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of the true chain: ``-log P(targets[:, t] | inputs[:, :t+1])``.

        The best any model can do on these very sequences, position by position. Once ``k`` tokens have
        been seen the context is known and the probability is read off :attr:`transitions`; before that,
        the unseen starting context (uniform over ``V**k``) is averaged out exactly by Bayes' rule.

        Args:
            inputs, targets: ``(batch, seq)`` ids from :meth:`batch` (``targets`` = ``inputs`` shifted by one).

        Returns:
            ``(batch, seq)`` float64 negative log-likelihoods in nats.
        """
        pair = (inputs, targets)
        if not all(isinstance(t, torch.Tensor) and t.ndim == 2 and t.dtype in _IDS and not t.is_meta for t in pair) \
                or inputs.shape != targets.shape:
            raise ValueError("inputs and targets must be (batch, seq) integer token ids of one shape (not on meta), "
                             f"got {[(tuple(getattr(t, 'shape', ())), getattr(t, 'dtype', type(t))) for t in pair]}")
        if not torch.equal(inputs[:, 1:], targets[:, :-1]):
            raise ValueError("targets must be the inputs shifted by one token (a batch of this chain)")
        v, k = self.vocab_size, self.order
        x = torch.cat([inputs[:, :1], targets], dim=1).long()  # (B, n+1): x_0 .. x_n
        if bool(((x < 0) | (x >= v)).any()):  # all ids of inputs and targets: no IndexError, no id read from the end
            raise ValueError(f"inputs and targets must be ids in [0, {v}), got {int(x.min())} to {int(x.max())}")
        b, n1 = x.shape
        logp = self.transitions.log()  # (V^k, V)
        out = torch.empty(b, n1 - 1, dtype=torch.float64)
        # contexts fully observed: predicting x_{t+1} for t >= k-1
        if n1 - 1 > k - 1:
            ctx = torch.zeros(b, n1 - k, dtype=torch.int64)
            for j in range(k):
                ctx = ctx * v + x[:, j:j + n1 - k]
            out[:, k - 1:] = -logp[ctx, x[:, k:]]
        # the first k predictions: average over the hidden start c = (c_0 .. c_{k-1})
        start = torch.arange(v ** k)
        c_tok = torch.stack([(start // v ** (k - 1 - j)) % v for j in range(k)])  # (k, V^k)
        log_post = torch.full((b, v ** k), -k * math.log(v), dtype=torch.float64)  # uniform prior
        for s in range(min(k, n1)):  # x_s has context (c_s .. c_{k-1}, x_0 .. x_{s-1})
            ctx = torch.zeros(b, v ** k, dtype=torch.int64)
            for j in range(k):
                pos = s + j  # position in the stream c_0 .. c_{k-1}, x_0, x_1, ...
                tok = c_tok[pos][None, :].expand(b, -1) if pos < k else x[:, pos - k, None].expand(-1, v ** k)
                ctx = ctx * v + tok
            step = logp[ctx, x[:, s, None].expand(-1, v ** k)]  # (B, V^k): log P(x_s | c, x_<s)
            if s >= 1:  # predictive probability of x_s given x_0 .. x_{s-1} (target s-1)
                out[:, s - 1] = -torch.logsumexp(log_post + step, dim=1)
            log_post = log_post + step
            log_post = log_post - torch.logsumexp(log_post, dim=1, keepdim=True)
        return out

    def entropy_rate(self) -> float:
        """Entropy rate in nats: the lowest mean loss any model can reach.

        ``H = sum_c pi(c) H(P(. | c))`` with ``pi`` the stationary distribution of contexts (power iteration
        on the chain of contexts). Sequences start from uniformly random contexts; with ``alpha`` well below
        1 the chain mixes within a few tokens, so the loss of long sequences approaches ``H``.
        """
        v, k = self.vocab_size, self.order
        p = self.transitions  # (V^k, V)
        h_ctx = -torch.special.xlogy(p, p).sum(-1)  # (V^k,)
        pi = torch.full((v ** k,), 1.0 / v ** k, dtype=torch.float64)
        shift = torch.arange(v ** k) % (v ** (k - 1)) * v  # next context = (c mod V^(k-1)) V + x
        for _ in range(2000):
            new = torch.zeros_like(pi)
            new.index_add_(0, (shift[:, None] + torch.arange(v)).flatten(), (pi[:, None] * p).flatten())
            if torch.allclose(new, pi, atol=1e-13, rtol=0):
                pi = new
                break
            pi = new
        return float((pi * h_ctx).sum())


# First-token retrieval: global context -------------------------------------


class FirstTokenRetrieval:
    """Reproduce the first token of the sequence at marked positions far later.

    Token ids: ``0 .. n_filler-1`` are filler, ``n_filler .. n_filler+n_keys-1``
    are keys, and ``n_filler + n_keys`` is the marker, so
    ``vocab_size = n_filler + n_keys + 1`` (with ``distinct_keys=False`` the
    keys are the first ``n_keys`` filler tokens instead, and
    ``vocab_size = n_filler + 1``). A sequence is

    ``[key, f, f, ..., MARK, f, ..., MARK]``

    with a uniformly random key at position 0, i.i.d. uniform filler elsewhere,
    and a marker at each position ``t >= min_distance`` independently with
    probability ``mark_prob`` (and always at the last position if ``mark_last``).
    The target at a marker is the key; every other target is ignored (``-100``).
    The token after a marker is filler, not the key, so the key never appears
    again: the only way to answer is to look back at position 0, however far
    it is. A model that cannot see (or is biased away from) the start of the
    sequence must guess, with accuracy ``1 / n_keys``.

    With ``distinct_keys=True`` the key is the only token of its kind, so a
    model can find it by content alone. With ``distinct_keys=False`` the key is
    an ordinary token that also occurs as filler: the model must find
    *position 0* ("output the first token of the sequence"), which takes
    position information.

    Args:
        n_keys: number of distinct keys (chance accuracy ``1/n_keys``).
        n_filler: number of filler tokens.
        mark_prob: probability of a marker at each eligible position.
        mark_last: always put a marker at the last position.
        min_distance: markers only at positions ``>= min_distance``.
        distinct_keys: keys have token ids of their own (see above).
    """

    def __init__(self, n_keys: int = 8, n_filler: int = 16, mark_prob: float = 0.1,
                 mark_last: bool = True, min_distance: int = 1, distinct_keys: bool = True) -> None:
        n_keys, n_filler, min_distance = (check_int(name, value, low) for name, value, low in (
            ("n_keys", n_keys, 2), ("n_filler", n_filler, 1), ("min_distance", min_distance, 1)))
        mark_prob = _probability("mark_prob", mark_prob)
        if mark_prob == 0 and not mark_last:
            raise ValueError("no markers at all: set mark_prob > 0 or mark_last=True")
        self.n_keys, self.n_filler = n_keys, n_filler
        self.mark_prob, self.mark_last, self.min_distance = mark_prob, check_bool("mark_last", mark_last), min_distance
        distinct_keys = check_bool("distinct_keys", distinct_keys)
        if not distinct_keys and n_keys > n_filler:
            raise ValueError(f"distinct_keys=False draws keys from the filler: need n_keys <= n_filler, "
                             f"got {n_keys} > {n_filler}")
        self.distinct_keys = distinct_keys
        self.key_offset = n_filler if distinct_keys else 0
        self.marker = self.key_offset + n_keys if distinct_keys else n_filler
        self.vocab_size = self.marker + 1

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind="first_token_retrieval", n_keys=self.n_keys, n_filler=self.n_filler,
                    mark_prob=self.mark_prob, mark_last=self.mark_last, min_distance=self.min_distance,
                    distinct_keys=self.distinct_keys)

    def __repr__(self) -> str:
        return (f"FirstTokenRetrieval(n_keys={self.n_keys}, n_filler={self.n_filler}, "
                f"mark_prob={self.mark_prob:g}, mark_last={self.mark_last}, min_distance={self.min_distance}, "
                f"distinct_keys={self.distinct_keys})")

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; ``seq_len >= 2`` and ``> min_distance``."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (a key and a marker), got {seq_len}")
        if seq_len <= self.min_distance:  # the last position, 0-based seq_len - 1, is nearer than min_distance
            raise ValueError(f"seq_len must be > min_distance = {self.min_distance}: markers sit only at positions "
                             f">= min_distance, got seq_len={seq_len}")
        keys = torch.randint(self.n_keys, (batch_size,), generator=generator) + self.key_offset
        inputs = torch.randint(self.n_filler, (batch_size, seq_len), generator=generator)
        inputs[:, 0] = keys
        marks = torch.rand(batch_size, seq_len, generator=generator) < self.mark_prob
        marks[:, : self.min_distance] = False
        marks[:, 0] = False
        if self.mark_last:
            marks[:, -1] = True
        inputs[marks] = self.marker
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[marks] = keys[:, None].expand(-1, seq_len)[marks]
        return inputs, targets


# Lagged copy: a sharp local look-back --------------------------------------


class LaggedCopy:
    """Random tokens where each one repeats the token ``lag`` places back with probability ``p_copy``.

    ``x_t = x_{t - lag}`` with probability ``p_copy``, else uniform over the
    ``vocab_size`` tokens (the first ``lag`` are uniform): a purely local task,
    solved by a sharp "look back" head, which diluted linear attention
    struggles with (Qin et al., 2022). ``batch`` returns ``targets[:, t] =
    inputs[:, t + 1]``, the unpredictable first ``lag - 1`` ignored (``-100``),
    so the best loss is :meth:`optimal_loss`, the entropy of ``p_copy * onehot +
    (1 - p_copy) * uniform``. ``split`` is accepted for a common interface.
    """

    def __init__(self, vocab_size: int = 32, lag: int = 2, p_copy: float = 0.8) -> None:
        vocab_size, lag = check_int("vocab_size", vocab_size, 2), check_int("lag", lag, 1)
        p_copy = _probability("p_copy", p_copy)
        self.vocab_size, self.lag, self.p_copy = vocab_size, lag, float(p_copy)

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind="lagged_copy", vocab_size=self.vocab_size, lag=self.lag, p_copy=self.p_copy)

    def __repr__(self) -> str:
        return f"LaggedCopy(vocab_size={self.vocab_size}, lag={self.lag}, p_copy={self.p_copy:g})"

    def sample(self, batch_size: int, length: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(batch_size, length)`` int64 tokens."""
        batch_size, length = _check_batch_args(batch_size, length, "train")
        _check_generator(generator)
        x = torch.randint(self.vocab_size, (batch_size, length), generator=generator)
        copy = torch.rand(batch_size, length, generator=generator) < self.p_copy
        # x_t = x_{t-lag} where copy_t (t >= lag), in order of t: x_t ends as the drawn token at the latest
        # s = t - j lag with no copy. On a (batch, rows, lag) grid of t = i lag + r, s is a running max per column.
        lag, rows = self.lag, -(-length // self.lag)
        copy[:, :lag] = False
        grid = lambda a: torch.nn.functional.pad(a, (0, rows * lag - length)).view(batch_size, rows, lag)  # noqa: E731
        latest = torch.where(grid(copy), 0, torch.arange(rows)[:, None].expand(rows, lag)).cummax(dim=1).values
        return grid(x).gather(1, latest).view(batch_size, -1)[:, :length]

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        seq = self.sample(batch_size, seq_len + 1, generator)
        targets = seq[:, 1:].clone()
        targets[:, : self.lag - 1] = IGNORE_INDEX  # x_1 .. x_{lag-1}: uniform, nothing to copy
        return seq[:, :-1], targets

    def optimal_loss(self) -> float:
        """The best achievable loss per counted target (nats): the entropy of the copy mixture."""
        v, p = self.vocab_size, self.p_copy
        hit, miss = p + (1 - p) / v, (1 - p) / v
        return -sum(q * math.log(q) for q in [hit] + [miss] * (v - 1) if q > 0)


# Character corpora ---------------------------------------------------------

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
        if not 0 < val_fraction < 1:
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
        return torch.tensor([CHARS.index(c) for c in _to_ascii(text)], dtype=torch.int64)

    def decode(self, ids: torch.Tensor) -> str:
        """The characters of a 1-D tensor (or list) of ids."""
        ids = torch.as_tensor(ids)
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
