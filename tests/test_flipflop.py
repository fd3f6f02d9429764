"""Flip-Flop: the layout of every sequence, the answer of every read, the instruction rates and bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe

F = pe.FlipFlop


def answers_by_replay(x):
    """Read the sequences as the language defines them: a one-bit memory, written by w, read by r."""
    out = torch.full_like(x, pe.IGNORE_INDEX)
    for b in range(x.shape[0]):
        memory = None
        for t in range(0, x.shape[1], 2):
            instruction, bit = int(x[b, t]), int(x[b, t + 1])
            if instruction == F.WRITE:
                memory = bit
            elif instruction == F.READ:
                out[b, t] = memory
    return out


@settings(max_examples=60, deadline=None)
@given(pairs=st.integers(2, 40), batch=st.integers(1, 5), p_ignore=st.floats(0.0, 0.99),
       read_last=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_every_read_answers_the_last_write_and_only_reads_are_scored(pairs, batch, p_ignore, read_last, seed):
    task = pe.FlipFlop(p_ignore, read_last=read_last)
    x, y = task.batch(batch, 2 * pairs, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (batch, 2 * pairs) and x.dtype == y.dtype == torch.int64
    instructions, bits = x[:, 0::2], x[:, 1::2]
    assert ((instructions >= F.WRITE) & (instructions <= F.IGNORE)).all()
    assert ((bits == F.ZERO) | (bits == F.ONE)).all()
    assert (instructions[:, 0] == F.WRITE).all()                        # every read has a write before it
    if read_last:
        assert (instructions[:, -1] == F.READ).all()
    assert torch.equal(y, answers_by_replay(x))                          # the memory's bit at every read, else ignored
    assert torch.equal((y != pe.IGNORE_INDEX)[:, 0::2], instructions == F.READ)
    assert (y[:, 1::2] == pe.IGNORE_INDEX).all()
    # the distance from each read's bit back to its write's bit, checked against the replay
    distances = task.read_distances(x)
    assert distances.numel() == int((instructions == F.READ).sum()) and (distances >= 2).all()
    expected = []
    for b in range(batch):
        last = None
        for p in range(pairs):
            if int(instructions[b, p]) == F.WRITE:
                last = p
            elif int(instructions[b, p]) == F.READ:
                expected.append(2 * (p - last))
    assert distances.tolist() == expected


@pytest.mark.parametrize("p_ignore", [0.0, 0.5, 0.8, 0.98])
def test_instruction_rates_follow_p_ignore(p_ignore):
    x, _ = pe.FlipFlop(p_ignore, read_last=False).batch(400, 400, torch.Generator().manual_seed(1))
    instructions = x[:, 2::2]                                            # pair 0 is always a write
    n = instructions.numel()
    for token, p in [(F.IGNORE, p_ignore), (F.WRITE, (1 - p_ignore) / 2), (F.READ, (1 - p_ignore) / 2)]:
        share = (instructions == token).sum().item() / n
        assert abs(share - p) < 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (token, share, p)
    bits = x[:, 1::2]
    assert abs((bits == F.ONE).double().mean().item() - 0.5) < 0.01


def test_sparser_sequences_read_further_back():
    g = torch.Generator().manual_seed(0)
    dense, sparse = pe.FlipFlop(0.8), pe.FlipFlop(0.98)
    d = dense.read_distances(dense.batch(200, 128, g)[0]).double().mean()
    s = sparse.read_distances(sparse.batch(200, 128, g)[0]).double().mean()
    assert s > 2 * d


def test_the_same_generator_state_gives_the_same_batch_and_the_config_names_the_task():
    a = pe.FlipFlop(0.8).batch(3, 16, torch.Generator().manual_seed(5))
    b = pe.FlipFlop(0.8).batch(3, 16, torch.Generator().manual_seed(5))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert pe.FlipFlop(0.8).config != pe.FlipFlop(0.98).config != pe.FlipFlop(0.98, read_last=False).config
    assert pe.FlipFlop.vocab_size == 5 and "p_ignore=0.8" in repr(pe.FlipFlop(0.8))


@pytest.mark.parametrize("kwargs, match", [
    (dict(p_ignore=1.0), "below 1"), (dict(p_ignore=-0.1), r"\[0, 1\]"), (dict(p_ignore="a lot"), "p_ignore"),
    (dict(read_last=2), "read_last"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pe.FlipFlop(**kwargs)


@pytest.mark.parametrize("seq_len", [0, 2, 3, 7, -4])
def test_odd_or_short_lengths_raise(seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        pe.FlipFlop().batch(2, seq_len)


def test_bad_split_generator_and_read_distances_input_raise():
    with pytest.raises(ValueError, match="split"):
        pe.FlipFlop().batch(2, 8, split="test-set")
    with pytest.raises(ValueError, match="generator"):
        pe.FlipFlop().batch(2, 8, generator=0)
    with pytest.raises(ValueError, match="seq_len even"):
        pe.FlipFlop().read_distances(torch.zeros(2, 7, dtype=torch.long))


def test_a_model_trains_on_it_and_is_scored_on_reads_only():
    task = pe.FlipFlop(0.8)
    model = pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="rope")
    result = pe.evaluate_lengths(model, task, [16], batches=1, batch_size=4, seed=0)[16]
    reads = sum(int((y != pe.IGNORE_INDEX).sum()) for _, y in pe.evaluation_batches(task, 16, batches=1, batch_size=4, seed=0))
    assert result.tokens == reads > 0 and 0 <= result.accuracy <= 1      # the reads and nothing else are counted
