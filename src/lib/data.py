"""Training data for the tiny models: the data-source interface and the synthetic tasks.

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
* Characters of real text: :mod:`posenc.corpora` (:class:`~posenc.CharCorpus`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ._validate import check_bool, check_int, check_number

__all__ = [
    "IGNORE_INDEX",
    "MarkovChain",
    "FirstTokenRetrieval",
    "LaggedCopy",
]

#: Target value that the loss ignores (PyTorch's ``cross_entropy`` default).
IGNORE_INDEX = -100

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

        A chain that is periodic, or nearly so, makes the power iteration
        oscillate: it then goes on with the lazy chain ``(pi + pi P) / 2``, which
        has the same stationary distribution and no period, and for a chain
        that mixes slowly takes 2^60 of its steps at once by squaring its
        matrix (up to 1024 contexts). Where none of these settles it raises
        ``ValueError`` rather than give a wrong rate.
        """
        v, k = self.vocab_size, self.order
        p = self.transitions  # (V^k, V)
        h_ctx = -torch.special.xlogy(p, p).sum(-1)  # (V^k,)
        pi = torch.full((v ** k,), 1.0 / v ** k, dtype=torch.float64)
        shift = torch.arange(v ** k) % (v ** (k - 1)) * v  # next context = (c mod V^(k-1)) V + x
        to = (shift[:, None] + torch.arange(v)).flatten()

        def step(pi: torch.Tensor) -> torch.Tensor:  # pi P
            return torch.zeros_like(pi).index_add_(0, to, (pi[:, None] * p).flatten())

        for lazy in (False, True):
            for _ in range(2000):
                new = step(pi)
                if lazy:
                    new = (pi + new) / 2
                if torch.allclose(new, pi, atol=1e-13, rtol=0):
                    return float((new * h_ctx).sum())
                pi = new
        if v ** k <= 1024:  # a slow chain: 2^60 lazy steps at once, by squaring its (V^k, V^k) matrix
            lazy_matrix = torch.zeros(v ** k, v ** k, dtype=torch.float64)
            lazy_matrix.index_put_((torch.arange(v ** k).repeat_interleave(v), to), p.flatten(), accumulate=True)
            lazy_matrix = (lazy_matrix + torch.eye(v ** k, dtype=torch.float64)) / 2
            for _ in range(60):  # each row renormalised: a row sum 1 + e would grow as (1 + e)^(2^60)
                lazy_matrix = lazy_matrix @ lazy_matrix
                lazy_matrix = lazy_matrix / lazy_matrix.sum(1, keepdim=True)
            new = pi @ lazy_matrix
            if torch.allclose(new @ lazy_matrix, new, atol=1e-13, rtol=0):
                return float((new * h_ctx).sum())
        raise ValueError(f"{self!r} mixes too slowly: its distribution of contexts did not settle, so it has no "
                         "entropy rate to report here (raise alpha, or use another seed)")


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
