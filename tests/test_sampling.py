"""Position ids sampled in training: randomized positions (Ruoss et al., 2023) and PoSE (Zhu et al., 2024)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe
from posenc.data import MarkovChain

CHAIN = MarkovChain(vocab_size=6, order=1, alpha=0.2, seed=0)
FAST = dict(steps=8, seq_len=16, batch_size=4, lr=3e-3, warmup=2, progress=False, device="cpu")


def _increasing(ids):
    return bool((ids[:, 1:] > ids[:, :-1]).all())


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 4), seq_len=st.integers(1, 40), extra=st.integers(0, 200), seed=st.integers(0, 99))
def test_randomized_ids_are_sorted_distinct_and_in_range(batch, seq_len, extra, seed):
    ids = pe.randomized_positions(batch, seq_len, seq_len + extra, torch.Generator().manual_seed(seed))
    assert ids.shape == (batch, seq_len) and ids.dtype == torch.int64
    assert _increasing(ids) and int(ids.min()) >= 0 and int(ids.max()) < seq_len + extra
    if extra == 0:
        assert torch.equal(ids, torch.arange(seq_len).expand(batch, seq_len))


def test_randomized_ids_are_a_uniform_subset():
    """Every id of [0, M) is drawn with probability L / M (Ruoss et al. sample a uniform ordered subset)."""
    ids = pe.randomized_positions(4000, 8, 32, torch.Generator().manual_seed(0))
    share = torch.bincount(ids.flatten(), minlength=32).double() / 4000
    assert torch.allclose(share, torch.full((32,), 8 / 32, dtype=torch.float64), atol=0.03)
    gaps = (ids[:, 1:] - ids[:, :-1]).double().mean()
    assert abs(float(gaps) - (32 + 1) / (8 + 1)) < 0.1   # the mean gap of a uniform subset: (M + 1) / (L + 1)


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 4), seq_len=st.integers(2, 40), extra=st.integers(0, 200), chunks=st.integers(1, 4),
       seed=st.integers(0, 99))
def test_pose_ids_are_contiguous_pieces_with_growing_skips(batch, seq_len, extra, chunks, seed):
    chunks = min(chunks, seq_len)
    ids = pe.pose_positions(batch, seq_len, seq_len + extra, chunks, torch.Generator().manual_seed(seed))
    assert ids.shape == (batch, seq_len) and _increasing(ids)
    assert bool((ids[:, 0] == 0).all())                              # u_0 = 0: the first piece starts at 0
    assert int(ids.max()) < seq_len + extra
    steps = ids[:, 1:] - ids[:, :-1]
    assert bool(((steps > 1).sum(1) <= chunks - 1).all())           # jumps only between pieces
    skips = ids - torch.arange(seq_len)                              # u_c of each token: non-decreasing
    assert bool((skips[:, 1:] >= skips[:, :-1]).all()) and int(skips.max()) <= extra
    if extra == 0:
        assert torch.equal(ids, torch.arange(seq_len).expand(batch, seq_len))


def test_pose_skips_reach_the_far_end():
    ids = pe.pose_positions(500, 16, 256, generator=torch.Generator().manual_seed(0))
    assert int(ids[:, -1].max()) >= 250 and int(ids[:, -1].min()) <= 20   # the span covers 16 .. 256


@pytest.mark.parametrize("call, match", [
    (lambda: pe.randomized_positions(2, 8, 4), "must be >= seq_len"),
    (lambda: pe.pose_positions(2, 3, 10, chunks=4), "chunks"),
    (lambda: pe.randomized_positions(2, 8, 10, generator=0), "generator"),
    (lambda: pe.sample_positions("shuffle", 2, 8, 10), "one of"),
    (lambda: pe.sample_positions("pose", 2, 8), "needs max_position"),
    (lambda: pe.sample_positions(None, 2, 8, 10), "max_position is for"),
])
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_contiguous_is_none():
    assert pe.sample_positions(None, 2, 8) is None


# ------------------------------------------------------------------------------------- training

@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


@pytest.mark.parametrize("kind", ["randomized", "pose"])
def test_training_feeds_sampled_ids_and_keys_them(kind):
    model = pe.TinyLM(6, 16, 1, 2, position="alibi")
    seen = []
    forward = type(model).forward

    def spy(self, idx, return_attention=False, *, positions=None):
        seen.append(positions)
        return forward(self, idx, return_attention, positions=positions)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(model), "forward", spy)
        result = pe.train(model, CHAIN, **FAST, position_sampling=kind, max_position=128)
    assert len(seen) == FAST["steps"] and all(s is not None and s.shape == (4, 16) for s in seen)
    assert all(_increasing(s) and int(s.max()) < 128 for s in seen)
    assert len({tuple(s.flatten().tolist()) for s in seen}) == len(seen)           # new ids every step
    assert result.config["train"]["position_sampling"] == dict(kind=kind, max_position=128)
    again = pe.train(pe.TinyLM(6, 16, 1, 2, position="alibi"), CHAIN, **FAST, position_sampling=kind,
                     max_position=128)
    assert again.from_cache and again.losses == result.losses                       # the same ids from the seed
    plain = pe.train(pe.TinyLM(6, 16, 1, 2, position="alibi"), CHAIN, **FAST)
    other = pe.train(pe.TinyLM(6, 16, 1, 2, position="alibi"), CHAIN, **FAST, position_sampling=kind,
                     max_position=64)
    assert len({result.key, plain.key, other.key}) == 3 and "position_sampling" not in plain.config["train"]


def test_training_arguments_are_checked():
    with pytest.raises(ValueError, match="must be >= seq_len"):
        pe.train(pe.TinyLM(6, 16, 1, 2), CHAIN, **FAST, position_sampling="randomized", max_position=8)
    with pytest.raises(ValueError, match="learned table"):
        pe.train(pe.TinyLM(6, 16, 1, 2, position="learned", max_len=32), CHAIN, **FAST,
                 position_sampling="randomized", max_position=64)
    with pytest.raises(ValueError, match="max_position is for"):
        pe.train(pe.TinyLM(6, 16, 1, 2), CHAIN, **FAST, max_position=64)


def test_evaluation_with_sampled_or_contiguous_ids():
    model = pe.train(pe.TinyLM(6, 16, 1, 2, position="rope"), CHAIN, **FAST, position_sampling="randomized",
                     max_position=128).model
    contiguous = pe.evaluate_lengths(model, CHAIN, [16, 32], batches=1, batch_size=2)
    sampled = pe.evaluate_lengths(model, CHAIN, [16, 32], batches=1, batch_size=2, position_sampling="randomized",
                                  max_position=128)
    again = pe.evaluate_lengths(model, CHAIN, [16, 32], batches=1, batch_size=2, position_sampling="randomized",
                                max_position=128)
    assert [r.loss for r in sampled.values()] == [r.loss for r in again.values()]   # seeded
    assert [r.loss for r in sampled.values()] != [r.loss for r in contiguous.values()]
    with pytest.raises(ValueError, match="PoSE is evaluated so"):
        pe.evaluate_lengths(model, CHAIN, [16], position_sampling="pose", max_position=128)
    with pytest.raises(ValueError, match="must be >= seq_len"):
        pe.evaluate_lengths(model, CHAIN, [16, 256], position_sampling="randomized", max_position=128)
