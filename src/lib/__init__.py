"""posenc: position encodings for Transformers and their length extrapolation.

The library behind the book *Train Short, Test Long*. One import serves every
chapter::

    import posenc as pe

    q = pe.apply_rope(q)                       # RoPE, (batch, heads, seq, head_dim)
    bias = pe.alibi_bias(8, q_len=512)         # (heads, q_len, k_len)
    out = pe.attention(q, k, v, bias=bias)     # causal softmax attention via SDPA

Conventions: tensors are ``(batch, heads, seq, head_dim)``; biases are
``(heads, q_len, k_len)``; masks are boolean with True = may attend; when
``k_len > q_len`` the queries are the last ``q_len`` key positions.

Every public name of the topic modules (``posenc.rope``, ``posenc.alibi``, ...)
is re-exported here, explicitly, so that editors and type checkers see them;
``posenc.viz`` holds the plotting helpers and ``posenc.exercises`` the answer
checkers of the chapters' exercises.
"""

from . import exercises, viz
from .sinusoidal import (
    sinusoidal_frequencies,
    sinusoidal_embedding,
    sinusoidal_similarity,
    sinusoidal_wavelengths,
    sinusoidal_shift_matrix,
    sinusoidal_period_coverage,
    sinusoidal_nearest_distance,
    SinusoidalPositionalEmbedding,
    LearnedPositions,
    SinusoidalPositions,
)
from .rope import (
    rope_frequencies,
    p_rope_frequencies,
    rope_angles,
    rope_cos_sin,
    apply_rope,
    rope_rotation_matrix,
    interleaved_to_half_split,
    half_split_to_interleaved,
    rope_decay_bound,
    RotaryEmbedding,
)
from .rerope import (
    rerope_positions,
    self_extend_positions,
    rerope_attention,
    self_extend_attention,
    streaming_attention,
)
from .extend import (
    rope_frequencies_interpolated,
    rope_frequencies_ntk,
    rope_frequencies_yarn,
    yarn_attention_factor,
    rope_frequencies_llama3,
    rope_frequencies_dynamic_ntk,
    ROPE_SCALING_METHODS,
    RopeScaling,
    rope_scaling,
    rope_min_base,
)
from .rope import PRoPE, RoPE
from .alibi import (
    alibi_slopes,
    alibi_bias,
    ALiBi,
)
from .kerple import kerple_power_bias, kerple_log_bias, KerpleBias, Kerple
from .sandwich import sandwich_bias, sandwich_qk, Sandwich
from .t5 import t5_relative_buckets, T5RelativeBias, T5Bias
from .xpos import (
    xpos_zeta,
    xpos_scales,
    apply_xpos,
    XPos,
    blockwise_causal_mask,
    XPosRotation,
)
from .masks import (
    check_lengths,
    relative_positions,
    causal_mask,
    sliding_window_mask,
)
from .autotune import (
    AUTOTUNE_ENV,
    autotune_decisions,
    autotune_enabled,
    choose_fastest,
    clear_autotune_decisions,
    length_bucket,
    time_in_turns,
)
from .attention import (
    attention,
    combine_bias_and_mask,
    relative_attention,
    ATTENTION_PATHS,
    attention_entropy,
    log_length_scale,
)
from .sinks import (
    sink_attention,
    attention_on_first_tokens,
    attention_logsumexp,
    sink_logit_attention,
)
from .linear import (
    FEATURE_MAPS,
    elu_plus_one,
    relu_feature,
    feature_map,
    linear_attention,
    linear_attention_weights,
    rope_linear_attention,
)
from .transnormer import (
    rms_norm,
    norm_attention,
    block_diagonal_mask,
    diag_attention,
    locally_accumulated_attention,
    gradient_relative_std,
    transnormer_layout,
)
from .decay import (
    DECAY_RATES,
    decay_rates,
    gate_decay,
    decayed_linear_attention,
    decayed_linear_attention_recurrent,
    decayed_attention_weights,
)
from .layers import (
    ATTENTION_KINDS,
    Positions,
    SoftmaxAttention,
    LinearAttention,
    NormAttention,
    DiagAttention,
    DecayAttention,
    GatedDecayAttention,
    attention_layer,
)
from .ssmax import keys_seen, log_n_factors, ssmax_factors, scalable_softmax
from .forgetting import FORGETTING_PATHS, forgetting_bias, forgetting_attention, ForgettingAttention
from .stick_breaking import stick_breaking_weights, stick_breaking_attention, StickBreakingAttention
from .cope import cope_positions, cope_position_logits, cope_attention, CoPE
from .scheme import (  # after the topic modules, which register their schemes
    PositionScheme,
    NoPE,
    LayerSchemes,
    register_scheme,
    position_scheme,
)
from .model import (
    TinyLM,
    save_model,
    load_model,
)
from .data import IGNORE_INDEX, MarkovChain, FirstTokenRetrieval, LaggedCopy
from .corpora import CHARS, CharCorpus, python_docs, tiny_shakespeare, wikitext
from .ruler import MultiKeyRetrieval, MultiValueRetrieval, VariableTracking
from .recall import AssociativeRecall, PeriodicSequence
from .flipflop import FlipFlop
from .even_pairs import EvenPairs
from .passkey import (
    PasskeyRetrieval,
    effective_length,
    passkey_accuracy,
    passkey_sequences,
)
from .presets import TrainingPreset, training_preset
from .train import (
    TrainResult,
    run_key,
    train,
)
from .evaluate import LengthResult, evaluate_lengths, evaluation_batches, recall_accuracy
from .sampling import POSITION_SAMPLINGS, pose_positions, randomized_positions, sample_positions
from .spread import Spread, spread, separated, glue
from .evidence import (
    SEED_ENV,
    seed_offset,
    seeds,
    evaluation_seed,
    over_seeds,
    per_seed,
    train_seeds,
    train_recall_seeds,
    RecallOverSeeds,
    recall_over_seeds,
)
from .claims import Verdict, judge
from .ledger import Claim, claim, entries_in_notebook
from .runtime import (
    pick_device,
    running_mode,
    seed_everything,
    cache_dir,
    measured_costs,
    SIZE_ENV,
)

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_embedding",
    "sinusoidal_similarity",
    "sinusoidal_wavelengths",
    "sinusoidal_shift_matrix",
    "sinusoidal_period_coverage",
    "sinusoidal_nearest_distance",
    "SinusoidalPositionalEmbedding",
    "LearnedPositions",
    "SinusoidalPositions",
    "rope_frequencies",
    "p_rope_frequencies",
    "rope_angles",
    "rope_cos_sin",
    "apply_rope",
    "rope_rotation_matrix",
    "interleaved_to_half_split",
    "half_split_to_interleaved",
    "rope_frequencies_interpolated",
    "rope_frequencies_ntk",
    "rope_frequencies_yarn",
    "yarn_attention_factor",
    "rope_decay_bound",
    "RotaryEmbedding",
    "rerope_positions",
    "self_extend_positions",
    "rerope_attention",
    "self_extend_attention",
    "streaming_attention",
    "rope_frequencies_llama3",
    "rope_frequencies_dynamic_ntk",
    "rope_min_base",
    "ROPE_SCALING_METHODS",
    "RopeScaling",
    "rope_scaling",
    "RoPE",
    "PRoPE",
    "alibi_slopes",
    "alibi_bias",
    "ALiBi",
    "kerple_power_bias",
    "kerple_log_bias",
    "KerpleBias",
    "sandwich_bias",
    "sandwich_qk",
    "t5_relative_buckets",
    "T5RelativeBias",
    "Kerple",
    "Sandwich",
    "T5Bias",
    "xpos_zeta",
    "xpos_scales",
    "apply_xpos",
    "XPos",
    "blockwise_causal_mask",
    "XPosRotation",
    "check_lengths",
    "relative_positions",
    "causal_mask",
    "sliding_window_mask",
    "attention",
    "combine_bias_and_mask",
    "relative_attention",
    "ATTENTION_PATHS",
    "attention_entropy",
    "AUTOTUNE_ENV",
    "autotune_decisions",
    "autotune_enabled",
    "choose_fastest",
    "clear_autotune_decisions",
    "time_in_turns",
    "length_bucket",
    "log_length_scale",
    "sink_attention",
    "attention_on_first_tokens",
    "attention_logsumexp",
    "sink_logit_attention",
    "FEATURE_MAPS",
    "elu_plus_one",
    "relu_feature",
    "feature_map",
    "linear_attention",
    "linear_attention_weights",
    "rms_norm",
    "norm_attention",
    "rope_linear_attention",
    "locally_accumulated_attention",
    "gradient_relative_std",
    "transnormer_layout",
    "DECAY_RATES",
    "decay_rates",
    "gate_decay",
    "decayed_linear_attention",
    "decayed_linear_attention_recurrent",
    "decayed_attention_weights",
    "ATTENTION_KINDS",
    "Positions",
    "block_diagonal_mask",
    "diag_attention",
    "SoftmaxAttention",
    "LinearAttention",
    "NormAttention",
    "DiagAttention",
    "DecayAttention",
    "GatedDecayAttention",
    "attention_layer",
    "keys_seen",
    "log_n_factors",
    "ssmax_factors",
    "scalable_softmax",
    "FORGETTING_PATHS",
    "forgetting_bias",
    "forgetting_attention",
    "ForgettingAttention",
    "stick_breaking_weights",
    "stick_breaking_attention",
    "StickBreakingAttention",
    "cope_positions",
    "cope_position_logits",
    "cope_attention",
    "CoPE",
    "PositionScheme",
    "NoPE",
    "LayerSchemes",
    "POSITION_SCHEMES",
    "register_scheme",
    "position_scheme",
    "TinyLM",
    "save_model",
    "load_model",
    "IGNORE_INDEX",
    "CHARS",
    "MarkovChain",
    "FirstTokenRetrieval",
    "LaggedCopy",
    "FlipFlop",
    "EvenPairs",
    "CharCorpus",
    "python_docs",
    "tiny_shakespeare",
    "wikitext",
    "PasskeyRetrieval",
    "passkey_accuracy",
    "passkey_sequences",
    "effective_length",
    "MultiKeyRetrieval",
    "MultiValueRetrieval",
    "VariableTracking",
    "AssociativeRecall",
    "PeriodicSequence",
    "Verdict",
    "judge",
    "Claim",
    "claim",
    "entries_in_notebook",
    "TrainResult",
    "LengthResult",
    "TrainingPreset",
    "training_preset",
    "SEED_ENV",
    "seed_offset",
    "seeds",
    "evaluation_seed",
    "Spread",
    "spread",
    "over_seeds",
    "per_seed",
    "train_seeds",
    "train_recall_seeds",
    "RecallOverSeeds",
    "recall_over_seeds",
    "recall_accuracy",
    "separated",
    "glue",
    "run_key",
    "train",
    "evaluate_lengths",
    "evaluation_batches",
    "POSITION_SAMPLINGS",
    "randomized_positions",
    "pose_positions",
    "sample_positions",
    "pick_device",
    "running_mode",
    "seed_everything",
    "cache_dir",
    "measured_costs",
    "SIZE_ENV",
    "exercises",
    "viz",
]

__version__ = "0.1.0"

# ``pe.train`` and ``pe.attention`` are their modules, callable as their functions: ``pe.train(model,
# data)`` trains and ``import posenc.train as m`` gives the module (neither name shadows the other).
# Type checkers skip this block, so they see the functions imported above, with their signatures and
# overloads (``pe.attention(q, k, v)`` is a Tensor, ``pe.train(...)`` a TrainResult).
from typing import TYPE_CHECKING  # by this name: checkers recognise no alias

if not TYPE_CHECKING:
    import sys as _sys

    train = _sys.modules[__name__ + ".train"]  # noqa: F811
    attention = _sys.modules[__name__ + ".attention"]  # noqa: F811
    del _sys
del TYPE_CHECKING


def __dir__():
    return sorted([*globals(), "POSITION_SCHEMES"])


def __getattr__(name: str):
    """``pe.POSITION_SCHEMES`` read when asked for: it lists the schemes you register too."""
    if name == "POSITION_SCHEMES":
        from . import scheme

        return scheme.POSITION_SCHEMES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
