"""The shared argument checks: one rule for integers and one for real numbers, everywhere in posenc."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc._validate import check_int, check_number


@given(st.integers(-1000, 1000), st.integers(-5, 5))
def test_integers_in_every_spelling(value, low):
    spellings = [value, np.int64(value), np.int32(value), torch.tensor(value)]
    for spelled in spellings:
        if value >= low:
            got = check_int("n", spelled, low)
            assert got == value and type(got) is int
        else:
            with pytest.raises(ValueError, match=f"n must be an integer >= {low}"):
                check_int("n", spelled, low)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), torch.tensor(True), 2.0, 2.5, "2", None, torch.tensor([2, 3]),
                                 torch.tensor(2.0)])
def test_not_integers(bad):
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        check_int("window", bad)


@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-math.inf, 0.0, 1.0]), st.booleans())
def test_real_numbers(value, low, inf_ok):
    ok = (value > low) and (math.isfinite(value) or (inf_ok and value == math.inf))
    for spelled in (value, np.float32(value) if math.isfinite(value) and abs(value) < 1e38 else value,
                    torch.tensor(value, dtype=torch.float64)):
        if ok and float(spelled) > low:
            assert check_number("base", spelled, low, inf_ok=inf_ok) == float(spelled)
        elif not ok:
            with pytest.raises(ValueError, match="base must be a"):
                check_number("base", spelled, low, inf_ok=inf_ok)


@pytest.mark.parametrize("bad", [True, np.bool_(False), "0.5", None, [0.5], torch.tensor([0.5, 1.0]),
                                 torch.tensor(1 + 1j), torch.tensor(True)])
def test_not_real_numbers(bad):
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 \(the words\), got"):
        check_number("scale", bad, 0, what=" (the words)")


def test_sizes_given_as_numpy_or_tensor_integers_are_stored_as_python_ints():
    """A model's config (its cache key) is the same however its integers were spelled, and stays JSON."""
    import json

    import posenc as pe

    plain = pe.TinyLM(8, 32, 2, 4, position="rope", window=16, train_len=32)
    spelled = pe.TinyLM(np.int64(8), torch.tensor(32), np.int32(2), np.int64(4), position="rope",
                        window=np.int64(16), train_len=torch.tensor(32))
    assert json.dumps(spelled.config) == json.dumps(plain.config)
    assert type(spelled.window) is int and type(spelled.train_len) is int
    spelled.sinks = np.int64(2)
    assert type(spelled.sinks) is int
    scaling = pe.RopeScaling("self_extend", window=np.int64(8), group=np.int64(2))
    assert type(scaling.window) is int and type(scaling.group) is int
    scaling = pe.RopeScaling("yarn", np.int64(4), original_max_position=np.int64(32))
    assert type(scaling.original_max_position) is int and type(scaling.factor) is float


def test_tensor_checks_live_in_the_shared_module_and_no_topic_module_borrows_them():
    """rerope, rotary and xpos take the tensor checks from posenc._validate, not from posenc.sinusoidal."""
    import importlib
    import inspect

    import posenc._validate as shared
    for helper in ("_tensor", "_float_tensor", "_real_tensor", "_align_positions"):
        assert getattr(shared, helper).__module__ == "posenc._validate"
    for name in ("sinusoidal", "rotary", "xpos", "rerope"):
        module = importlib.import_module(f"posenc.{name}")
        source = inspect.getsource(module)
        assert "def _float_tensor" not in source and "from .sinusoidal import _" not in source, name
        if hasattr(module, "_float_tensor"):
            assert module._float_tensor is shared._float_tensor, name
