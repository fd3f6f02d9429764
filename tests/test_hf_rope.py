"""The RoPE scaling rules against Hugging Face transformers (skipped when it is not installed).

``transformers`` is not a requirement of the book; install it in a separate
environment to run this file. Hugging Face computes frequencies in float32,
hence the tolerances.
"""

import pytest
import torch

import posenc as pe

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
ROPE_INIT_FUNCTIONS = rope_utils.ROPE_INIT_FUNCTIONS

HEADS = 4


def hf_config(head_dim, max_position, parameters, partial=1.0):
    """A LlamaConfig with these RoPE parameters (transformers 5 spelling, else 4's)."""
    base = parameters.pop("rope_theta")
    kw = dict(hidden_size=head_dim * HEADS, num_attention_heads=HEADS, max_position_embeddings=max_position)
    if partial != 1.0:
        kw["partial_rotary_factor"] = partial
    config = transformers.LlamaConfig(**kw, rope_parameters=dict(parameters, rope_theta=base))
    if getattr(config, "rope_parameters", None) is None or config.rope_parameters.get("rope_type") != parameters.get(
            "rope_type"):  # transformers 4
        old = {("type" if k == "rope_type" else k): v for k, v in parameters.items()}
        config = transformers.LlamaConfig(**kw, rope_theta=base, rope_scaling=dict(old, rope_type=old["type"]))
    return config


def hf(name, config, seq_len=None):
    inv_freq, factor = ROPE_INIT_FUNCTIONS[name](config, "cpu", seq_len=seq_len) if seq_len else \
        ROPE_INIT_FUNCTIONS[name](config, "cpu")
    return inv_freq.double(), factor


@pytest.mark.parametrize("head_dim,base,factor", [(64, 10000.0, 4.0), (16, 500.0, 2.5), (128, 500000.0, 8.0)])
def test_linear_is_position_interpolation(head_dim, base, factor):
    config = hf_config(head_dim, 64, dict(rope_type="linear", rope_theta=base, factor=factor))
    inv_freq, scale = hf("linear", config)
    assert scale == 1.0
    assert torch.allclose(pe.rope_frequencies_interpolated(head_dim, base, factor), inv_freq, rtol=1e-6)
    assert torch.allclose(pe.RopeScaling("linear", factor).inv_freq(head_dim, base), inv_freq, rtol=1e-6)


@pytest.mark.parametrize("head_dim,base,factor,original", [
    (64, 10000.0, 4.0, 64), (128, 10000.0, 8.0, 4096), (32, 500000.0, 16.0, 256), (16, 10000.0, 2.0, 32)])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_yarn_frequencies_and_temperature(head_dim, base, factor, original, partial):
    config = hf_config(head_dim, original, dict(rope_type="yarn", rope_theta=base, factor=factor,
                                                original_max_position_embeddings=original), partial)
    inv_freq, scale = hf("yarn", config)
    dim = int(head_dim * partial)
    ours = pe.RopeScaling("yarn", factor, original)
    assert torch.allclose(ours.inv_freq(dim, base), inv_freq, rtol=1e-6)
    assert torch.allclose(pe.rope_frequencies_yarn(dim, base, factor, original), inv_freq, rtol=1e-6)
    assert scale == pytest.approx(ours.attention_scale(), rel=1e-12)  # multiplies cos and sin in HF too


@pytest.mark.parametrize("head_dim,base,factor,original", [(64, 10000.0, 1.0, 64), (32, 10000.0, 2.0, 100),
                                                           (128, 500000.0, 4.0, 2048)])
@pytest.mark.parametrize("seq_len_ratio", [0.5, 1.0, 1.5, 4.0, 13.0])
def test_dynamic_ntk(head_dim, base, factor, original, seq_len_ratio):
    seq_len = max(1, int(original * seq_len_ratio))
    config = hf_config(head_dim, original, dict(rope_type="dynamic", rope_theta=base, factor=factor))
    inv_freq, scale = hf("dynamic", config, seq_len)
    assert scale == 1.0
    ours = pe.rope_frequencies_dynamic_ntk(head_dim, seq_len, original, base, factor)
    assert torch.allclose(ours, inv_freq, rtol=1e-5)
    assert torch.allclose(pe.RopeScaling("dynamic", factor, original).inv_freq(head_dim, base, seq_len), inv_freq,
                          rtol=1e-5)


def test_ntk_aware_is_dynamic_at_the_scaled_length():
    """HF has no static NTK-aware rule; with factor 1, dynamic at length s L is base * s^(d/(d-2))."""
    config = hf_config(64, 128, dict(rope_type="dynamic", rope_theta=10000.0, factor=1.0))
    inv_freq, _ = hf("dynamic", config, 4 * 128)
    assert torch.allclose(pe.rope_frequencies_ntk(64, 10000.0, 4.0), inv_freq, rtol=1e-5)


@pytest.mark.parametrize("head_dim,base,factor,low,high,original", [
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),    # Llama 3.1
    (64, 500000.0, 32.0, 1.0, 4.0, 8192),    # Llama 3.2
    (64, 10000.0, 4.0, 1.0, 4.0, 64),
    (32, 10000.0, 2.0, 2.0, 16.0, 512),
])
def test_llama3(head_dim, base, factor, low, high, original):
    config = hf_config(head_dim, original * 4, dict(rope_type="llama3", rope_theta=base, factor=factor,
                                                    low_freq_factor=low, high_freq_factor=high,
                                                    original_max_position_embeddings=original))
    inv_freq, scale = hf("llama3", config)
    assert scale == 1.0
    ours = pe.rope_frequencies_llama3(head_dim, base, factor, low, high, original)
    assert torch.allclose(ours, inv_freq, rtol=1e-5)
    got = pe.RopeScaling("llama3", factor, original, low_freq_factor=low, high_freq_factor=high)
    assert torch.allclose(got.inv_freq(head_dim, base), inv_freq, rtol=1e-5)


def test_scheme_rotation_matches_hf_llama_rotary_embedding_with_yarn():
    """End to end: the RoPE scheme's rotation equals HF's cos/sin (attention factor included) applied to q, k."""
    from transformers.models.llama import modeling_llama as ml

    head_dim, original, n = 16, 32, 100
    config = hf_config(head_dim, original, dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                original_max_position_embeddings=original))
    rotary = ml.LlamaRotaryEmbedding(config)
    qk = torch.randn(2, 1, HEADS, n, head_dim)
    cos, sin = rotary(qk[0], torch.arange(n)[None])
    q_hf, k_hf = ml.apply_rotary_pos_emb(qk[0], qk[1], cos, sin)
    scheme = pe.RoPE()
    scheme.bind(d_model=head_dim * HEADS, n_heads=HEADS, n_layers=1)
    scheme.set_scaling(("yarn", 4.0), train_len=original)
    ours = scheme.rotate(qk)
    assert torch.allclose(ours[0], q_hf, atol=1e-5) and torch.allclose(ours[1], k_hf, atol=1e-5)
