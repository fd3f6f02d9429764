"""Model and training sizes for each running mode: seconds per model on a CPU, or bigger on request.

:func:`training_preset` gives the :class:`TrainingPreset` of the running
mode (:func:`posenc.running_mode`): ``"small"``, the default everywhere, trains
a model of about 100k parameters in seconds on a 2-core CPU (the website's
figures); ``"full"`` trains about 3M parameters for 3000 steps, for a GPU.
Every chapter that trains reads its sizes from here, so one setting changes
them all.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Dict, Optional, TypedDict

from ._validate import check_int, check_number, one_of
from .model import TinyLM
from .scheme import scheme_name
from .runtime import running_mode

__all__ = ["TrainingPreset", "training_preset"]

_ModelSizes = TypedDict("_ModelSizes", {"d_model": int, "n_layers": int, "n_heads": int})  # typed model_kwargs()


@dataclass(frozen=True)
class TrainingPreset:
    """Model and training sizes for one running mode.

    ``model_kwargs()`` feeds :class:`~posenc.model.TinyLM`, ``train_kwargs()``
    feeds :func:`train` (``retrieval_kwargs()`` for the retrieval tasks);
    :meth:`make_model` does both jobs of building a model.
    """

    mode: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    eval_batches: int
    eval_batch_size: int

    def __post_init__(self) -> None:  # every field checked (and a Python value), so overrides fail early
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "lr":
                object.__setattr__(self, f.name, check_number("lr", value, 0.0))
            elif f.name == "warmup":
                object.__setattr__(self, f.name, check_int("warmup", value, low=0))
            elif f.name != "mode":
                object.__setattr__(self, f.name, check_int(f.name, value))

    def model_kwargs(self) -> _ModelSizes:
        """``d_model``, ``n_layers``, ``n_heads``."""
        return _ModelSizes(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads)

    def train_kwargs(self) -> Dict[str, Any]:
        """``steps``, ``seq_len``, ``batch_size``, ``lr``, ``warmup``."""
        return dict(steps=self.steps, seq_len=self.seq_len, batch_size=self.batch_size,
                    lr=self.lr, warmup=self.warmup)

    def retrieval_kwargs(self) -> Dict[str, Any]:
        """:meth:`train_kwargs` for the retrieval tasks (passkey, multi-key): twice the batch, two thirds of the steps.

        A retrieval task is learned in a jump (the model finds the key, then
        copies what follows it), and how soon it comes depends on the number of
        sequences seen more than on the number of steps: twice the batch for
        two thirds of the steps (4/3 of the tokens) gets every seed of the
        softmax models of chapters 8 and 9 to the answer within ``seq_len``,
        which the chapters check before they test beyond it. Chapter 10's
        linear layouts, slower learners, train at half the rate for all of
        ``steps``.

        >>> kw = training_preset("small").retrieval_kwargs()
        >>> kw["batch_size"], kw["steps"]
        (32, 200)
        """
        return dict(self.train_kwargs(), batch_size=2 * self.batch_size, steps=max(1, round(2 * self.steps / 3)))

    def make_model(self, vocab_size: int, position: Any, *, max_len_factor: int = 8,
                   **overrides: Any) -> TinyLM:
        """A :class:`TinyLM` of this preset's size, with ``position`` a scheme name or object.

        For ``position="learned"`` the table gets ``max_len_factor * seq_len``
        rows, so the model can be *run* at longer lengths even though only the
        first ``seq_len`` rows are ever trained. ``train_len`` is set to
        ``seq_len``.
        """
        kwargs: Dict[str, Any] = dict(self.model_kwargs(), train_len=self.seq_len)
        if isinstance(position, str):  # as TinyLM reads it ("T5" is "t5"), so that its size below applies
            position = scheme_name(position)
        if position == "learned":
            kwargs["max_len"] = check_int("max_len_factor", max_len_factor) * self.seq_len
        if position == "t5":  # T5: 32 buckets up to 128 for L = 512; here up to L / 2
            kwargs["max_distance"] = max(17, self.seq_len // 2)
        kwargs.update(overrides)
        return TinyLM(vocab_size, position=position, **kwargs)


_PRESETS = {
    # A 2-core CPU trains one model in a few seconds (~100k parameters).
    "small": TrainingPreset(mode="small", d_model=64, n_layers=2, n_heads=4, seq_len=64,
                            batch_size=16, steps=300, lr=6e-3, warmup=30,
                            eval_batches=4, eval_batch_size=8),
    # A GPU (bf16) trains one model in about a minute (~3M parameters).
    "full": TrainingPreset(mode="full", d_model=256, n_layers=4, n_heads=8, seq_len=256,
                           batch_size=64, steps=3000, lr=1e-3, warmup=200,
                           eval_batches=16, eval_batch_size=16),
}


def training_preset(mode: Optional[str] = None, **overrides: Any) -> TrainingPreset:
    """The preset of ``mode`` (default :func:`posenc.running_mode`), with overrides.

    >>> training_preset("small").seq_len
    64
    >>> training_preset("small", steps=10).steps
    10
    """
    mode = running_mode() if mode is None else one_of("mode", mode, tuple(_PRESETS))
    unknown = set(overrides) - set(TrainingPreset.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown preset fields {sorted(unknown)}")
    return replace(_PRESETS[mode], **overrides)
