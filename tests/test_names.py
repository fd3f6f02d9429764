"""Names from a fixed list (schemes, attention kinds and paths, decays, scaling rules, methods, layouts), from the
user's side: any case (the book writes RoPE and ALiBi), '-' for '_', and "did you mean ...?" for a near miss."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc._validate import one_of


def _spellings(name):
    """The name in upper, title and mixed case, and with '-' for '_'."""
    mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(name))
    return {name.upper(), name.title(), mixed, name.replace("_", "-")}


@pytest.mark.parametrize("spelled,name", [("RoPE", "rope"), ("ALiBi", "alibi"), ("xPos", "xpos"), ("T5", "t5"),
                                          ("p-RoPE", "p_rope"), ("KERPLE-log", "kerple_log"), ("NoPE", "none")])
def test_scheme_names_as_the_book_writes_them(spelled, name):
    model = pe.TinyLM(8, 16, 1, 2, position=spelled)
    assert model.position.name == name
    assert model.position.config() == pe.TinyLM(8, 16, 1, 2, position=name).position.config()


@pytest.mark.parametrize("typo,meant", [("alibbi", "alibi"), ("rotary", None), ("sinusoid", "sinusoidal"),
                                        ("kerple", "kerple_log"), ("ropee", "rope")])
def test_a_misspelled_scheme_is_refused_with_a_suggestion(typo, meant):
    with pytest.raises(ValueError, match="position must be one of") as err:
        pe.TinyLM(8, 16, 1, 2, position=typo)
    assert ("did you mean" in str(err.value)) == (meant is not None)
    if meant is not None:
        assert f"did you mean {meant!r}?" in str(err.value) or "did you mean 'kerple_power'?" in str(err.value)


CHECKS = {  # a call that names one item of each fixed list, and the list
    "position": (lambda n: pe.TinyLM(8, 16, 1, 2, position=n, **({"max_len": 16} if n.lower() == "learned" else {}))
                 .position.name, pe.POSITION_SCHEMES),
    "attention kind": (lambda n: pe.TinyLM(8, 16, 1, 2, attention=n).attention_kinds[0], pe.layers.ATTENTION_KINDS),
    "attention layer": (lambda n: type(pe.attention_layer(n, 16, 2)).__name__, pe.layers.ATTENTION_KINDS),
    "decay": (lambda n: pe.decay.decay_rates(n, 4).tolist(), pe.decay.DECAY_RATES),
    "rope scaling": (lambda n: pe.RopeScaling(n, 2.0).method, ("linear", "ntk", "dynamic", "yarn", "llama3")),
    "path": (lambda n: pe.relative_attention(*(torch.ones(1, 1, 3, 2),) * 3, slopes=torch.ones(1), path=n).sum().item(),
             pe.ATTENTION_PATHS),
    "linear method": (lambda n: pe.linear_attention(*(torch.ones(1, 1, 3, 2),) * 3, method=n).sum().item(),
                      ("chunked", "recurrent", "cumsum", "quadratic")),
}


@given(st.sampled_from(sorted(CHECKS)), st.data())
@settings(max_examples=40, deadline=None)
def test_every_fixed_list_takes_any_case_and_suggests_a_near_miss(which, data):
    call, names = CHECKS[which]
    name = data.draw(st.sampled_from([n for n in names if which != "path" or n not in ("flex", "key_bias")]))
    expected = call(name)
    for spelled in _spellings(name):
        assert call(spelled) == expected, (which, spelled)
    typo = name[:-1] + ("x" if name[-1] != "x" else "y") if len(name) > 3 else name + name[-1]
    if typo.lower() in names:
        return
    with pytest.raises(ValueError, match=r"must be one of .*did you mean"):
        call(typo)


def test_one_of_names_and_suggestions():
    assert one_of("layout", "BSHD", ("bhsd", "bshd")) == "bshd"
    with pytest.raises(ValueError, match=r"got 3$"):
        one_of("position", 3, ("rope",))
    with pytest.raises(ValueError, match=r"got 'zzz'$"):  # nothing near: no suggestion
        one_of("position", "zzz", ("rope", "alibi"))
