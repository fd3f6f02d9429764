"""Verdicts on published claims: computed from the seed spread, and never decisive without the test's conditions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc import Spread

values = st.lists(st.floats(-5, 5, allow_nan=False, allow_infinity=False), min_size=3, max_size=6)
spreads = values.map(lambda v: Spread(tuple(v)))


def S(*v):
    return Spread(tuple(float(x) for x in v))


@settings(max_examples=200, deadline=None)
@given(a=spreads, b=spreads, margin=st.floats(0, 1))
def test_a_comparison_is_decisive_only_where_the_ranges_separate(a, b, margin):
    v = pe.judge(a, b, better="lower", margin=margin)
    if a.high + margin < b.low:
        assert v == "reproduced" and v.outcome == "reproduced" and v.decisive
    elif b.high + margin < a.low:
        assert v == "not reproduced" and v.decisive
    else:
        assert v.outcome == "within seed noise" and not v.decisive


@settings(max_examples=200, deadline=None)
@given(a=spreads, b=spreads)
def test_the_direction_of_the_claim_swaps_the_outcome(a, b):
    lower, higher = pe.judge(a, b, better="lower"), pe.judge(a, b, better="higher")
    swap = {"reproduced": "not reproduced", "not reproduced": "reproduced", "within seed noise": "within seed noise"}
    assert higher.outcome == swap[lower.outcome]
    assert pe.judge(b, a, better="lower").outcome == higher.outcome


@settings(max_examples=100, deadline=None)
@given(a=values, b=values, bound=st.sampled_from([0.0, 1.0]), better=st.sampled_from(["lower", "higher"]))
def test_models_at_the_ceiling_or_floor_are_never_ranked(a, b, bound, better):
    """Whatever the seeds, two models pinned to a bound of the task get 'not tested here'."""
    at_bound_a, at_bound_b = Spread(tuple(bound for _ in a)), Spread(tuple(bound for _ in b))
    ceiling, floor = (1.0, 0.0) if bound == 1.0 else (None, bound)
    v = pe.judge(at_bound_a, at_bound_b, better=better, ceiling=ceiling, floor=floor)
    assert v.outcome == "not tested here" and ("ceiling" in v.reason or "floor" in v.reason)


def test_passkey_at_one_against_one_is_not_tested_and_a_gap_below_the_ceiling_is_decided():
    ones = S(1, 1, 1)
    assert pe.judge(ones, ones, better="higher", ceiling=1.0) == "not tested here (every compared model at the ceiling, 1)"
    assert pe.judge(S(0.99, 1, 1), ones, better="higher", ceiling=1.0, tolerance=0.02).outcome == "not tested here"
    assert pe.judge(ones, S(0.4, 0.5, 0.6), better="higher", ceiling=1.0) == "reproduced"
    assert pe.judge(S(0.1, 0.12, 0.13), S(0.11, 0.12, 0.16), better="higher", floor=0.125,
                    tolerance=0.05).outcome == "not tested here"


def test_a_threshold_needs_a_control_that_fails_it():
    flat, broken = S(0.01, 0.015, 0.02), S(0.4, 0.9, 1.3)
    with pytest.raises(ValueError, match="control"):
        pe.judge(flat, 0.05, better="lower")
    assert pe.judge(flat, 0.05, better="lower", control=broken) == "reproduced"
    v = pe.judge(flat, 0.05, better="lower", control=S(0.01, 0.02, 0.03))
    assert v.outcome == "not tested here" and "without the mechanism passes" in v.reason
    # one seed of the control passing is enough to say the task may not need the mechanism
    assert pe.judge(flat, 0.05, better="lower", control=S(0.04, 0.5, 0.6)).outcome == "not tested here"
    assert pe.judge(broken, 0.05, better="lower", control=S(0.3, 0.5, 0.6)) == "not reproduced"


def test_a_comparison_with_a_control_that_beats_the_baseline_is_not_tested():
    """YaRN against PI's bar, when plain RoPE (no scaling) already meets the bar, says nothing about YaRN."""
    yarn, bar, plain = S(0.030, 0.031, 0.033), S(0.035, 0.036, 0.038), S(0.020, 0.022, 0.024)
    assert pe.judge(yarn, bar, better="lower").outcome == "reproduced"
    v = pe.judge(yarn, bar, better="lower", control=plain)
    assert v.outcome == "not tested here" and not v.decisive
    assert v.reason == "a model without the mechanism passes the same test"
    one_seed = pe.judge(yarn, bar, better="lower", control=S(0.020, 0.5, 0.6))  # fails the test on two seeds of three
    assert one_seed.reason == "a model without the mechanism passes the same test on some seeds"
    assert pe.judge(yarn, bar, better="lower", control=S(0.4, 0.5, 0.6)) == "reproduced"


def test_conditions_combine_into_partially_and_name_where():
    a = {"2L": S(0.1, 0.2, 0.2), "4L": S(1, 1.1, 1.2), "8L": S(5, 6, 7)}
    b = {"2L": S(0.5, 0.6, 0.9), "4L": S(1.15, 1.5, 2), "8L": S(3, 4, 4.5)}
    v = pe.judge(a, b, better="lower", what="rise")
    assert v == "partially reproduced (at 2L; not at 8L; within seed noise at 4L)"
    assert v.conditions == {"2L": "reproduced", "4L": "within seed noise", "8L": "not reproduced"}
    assert pe.judge({"2L": a["2L"]}, {"2L": b["2L"]}, better="lower") == "reproduced"
    assert pe.judge({"8L": a["8L"]}, {"8L": b["8L"]}, better="lower") == "not reproduced"
    noise = pe.judge({"4L": a["4L"], "8L": a["8L"]}, {"4L": b["4L"], "8L": b["8L"]}, better="lower", what="rise")
    assert noise == "not reproduced (at 8L; within seed noise at 4L)" and noise.decisive


def test_conditions_at_the_ceiling_are_left_out_and_named():
    ones = S(1, 1, 1)
    v = pe.judge({"L": ones, "4L": S(0.9, 0.95, 1)}, {"L": ones, "4L": S(0.3, 0.4, 0.5)}, better="higher", ceiling=1.0)
    assert v == "reproduced (not tested at L)" and v.conditions["L"] == "not tested here"
    v = pe.judge({"L": ones, "4L": ones}, {"L": ones, "4L": ones}, better="higher", ceiling=1.0)
    assert v.outcome == "not tested here" and v.reason == "every compared model at the ceiling, 1"


def test_untested_and_unsolved_come_first_and_say_why():
    a, b = S(0.1, 0.1, 0.2), S(0.5, 0.6, 0.7)
    v = pe.judge(a, b, better="lower", untested="the task needs only the last two tokens")
    assert v == "not tested here (the task needs only the last two tokens)" and v.reason.startswith("the task")
    assert pe.judge(a, b, better="lower", needs=["gated"], unsolved=["gated", "x"]) == \
        "not tested here (gated not solved within L)"
    assert pe.judge(a, b, better="lower", needs=["gated"], unsolved=["x"]) == "reproduced"


def test_untested_per_condition_leaves_the_verdict_to_the_others():
    a, b = S(0.1, 0.1, 0.2), S(0.5, 0.6, 0.7)
    v = pe.judge({"2L": a, "8L": b}, {"2L": b, "8L": a}, better="lower", untested={"8L": "both worse than a guess"})
    assert v == "reproduced (not tested at 8L)" and v.conditions == {"2L": "reproduced", "8L": "not tested here"}
    v = pe.judge({"2L": a, "8L": b}, {"2L": b, "8L": a}, better="lower", untested={"2L": "x", "8L": "y"})
    assert v.outcome == "not tested here" and v.reason == "x; y"
    # without the exemption 8L separates the other way
    assert pe.judge({"2L": a, "8L": b}, {"2L": b, "8L": a}, better="lower") == "partially reproduced (at 2L; not at 8L)"


@pytest.mark.parametrize("untested, match", [
    ({"16L": "x"}, "some of the conditions"), ({}, "some of the conditions"), ({"8L": ""}, "reason"), ({"8L": 3}, "reason")])
def test_untested_per_condition_is_checked(untested, match):
    with pytest.raises(ValueError, match=match):
        pe.judge({"2L": S(1, 2, 3), "8L": S(1, 2, 3)}, {"2L": S(4, 5, 6), "8L": S(4, 5, 6)}, better="lower", untested=untested)
    with pytest.raises(ValueError, match="some of the conditions"):  # one condition: the plain string says it
        pe.judge(S(1, 2, 3), S(4, 5, 6), better="lower", untested={"": "x"})


def test_a_tolerance_is_named_in_the_reason():
    near = S(0.98, 0.99, 1.0)
    assert pe.judge(near, near, better="higher", ceiling=1.0, tolerance=0.03) == \
        "not tested here (every compared model within 0.03 of the ceiling, 1)"


def test_verdict_is_the_text_a_page_prints():
    v = pe.Verdict("not tested here", "L too short")
    assert isinstance(v, str) and v == "not tested here (L too short)" and v.sentence() == "Not tested here (L too short)"
    assert pe.Verdict("reproduced").sentence() == "Reproduced"
    with pytest.raises(ValueError, match="outcome"):
        pe.Verdict("sort of")


@pytest.mark.parametrize("kwargs, match", [
    (dict(better="smaller"), "better"),
    (dict(margin=-0.1), "margin"),
    (dict(tolerance=float("nan")), "tolerance"),
    (dict(min_seeds=0), "min_seeds"),
    (dict(needs="gated"), "list of model names"),
    (dict(needs=5), "list of model names"),
    (dict(needs=["gated", 1]), "list of model names"),
    (dict(unsolved=["gated"]), "without needs"),                 # would be ignored: refused instead
    (dict(untested=""), "untested"),
    (dict(ceiling=1.0, floor=1.0), "must differ"),
    (dict(ceiling=float("inf")), "ceiling"),
])
def test_bad_options_are_refused(kwargs, match):
    kw = dict(better="higher")
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pe.judge(S(1, 2, 3), S(4, 5, 6), **kw)


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="at least 3 seeds"):
        pe.judge(S(1, 2), S(4, 5, 6), better="lower")
    with pytest.raises(ValueError, match="not finite"):
        pe.judge(S(1, 2, float("nan")), S(4, 5, 6), better="lower")
    with pytest.raises(ValueError, match="Spread over seeds or a finite number"):
        pe.judge(S(1, 2, 3), [4, 5, 6], better="lower")
    for one_number in (1, 0.01, [1, 2, 3]):  # the claim and its control are measured over seeds; only against may be a threshold
        with pytest.raises(ValueError, match="claimed must be a posenc.Spread over at least 3 seeds"):
            pe.judge(one_number, S(4, 5, 6), better="lower")
        with pytest.raises(ValueError, match="control at 2L must be a posenc.Spread"):
            pe.judge({"2L": S(1, 2, 3)}, {"2L": 0.05}, better="lower", control={"2L": one_number})
    with pytest.raises(ValueError, match="conditions of claimed"):
        pe.judge({"2L": S(1, 2, 3)}, {"4L": S(4, 5, 6)}, better="lower")
    with pytest.raises(ValueError, match="conditions of claimed"):
        pe.judge({"2L": S(1, 2, 3)}, {"2L": S(4, 5, 6)}, better="lower", control={"8L": S(1, 1, 1)})
    with pytest.raises(ValueError, match="read the same"):  # 2 and "2" would merge, one value lost
        pe.judge({2: S(1, 2, 3), "2": S(1, 2, 4)}, {2: S(4, 5, 6), "2": S(4, 5, 7)}, better="lower")
    with pytest.raises(ValueError, match="control at 2L"):  # checked even where the verdict is decided earlier
        pe.judge({"2L": S(1, 2, 3)}, {"2L": S(4, 5, 6)}, better="lower", control={"2L": S(1, 1)}, untested="x")


def test_a_claim_that_a_model_fails_a_task_has_the_ceiling_too():
    """'Below the bound retrieval fails': scoring 1.00 contradicts it; a control that fails as well leaves it untested."""
    below, above = S(0.5, 0.6, 0.7), S(1, 1, 1)
    assert pe.judge(below, 0.95, better="lower", control=above, ceiling=1.0, floor=0.125) == "reproduced"
    assert pe.judge(above, 0.95, better="lower", control=above, ceiling=1.0) == "not reproduced"
    assert pe.judge(below, 0.95, better="lower", control=S(0.5, 0.96, 1), ceiling=1.0).outcome == "not tested here"
    assert pe.judge(S(0.97, 0.98, 0.99), 0.95, better="lower", control=S(1, 1, 1)) == "not reproduced"


def test_conditions_that_are_models_read_for_and_lengths_read_at():
    v = pe.judge({"RoPE": S(0.1, 0.1, 0.2), "ALiBi": S(0.5, 0.6, 0.7)}, {"RoPE": S(0.5, 0.6, 0.7), "ALiBi": S(0.5, 0.6, 0.7)},
                 better="lower")
    assert v == "partially reproduced (for RoPE; within seed noise for ALiBi)"
    v = pe.judge({"1.5L": S(0.1, 0.1, 0.2), "16": S(0.9, 0.9, 0.9)}, {"1.5L": S(0.5, 0.6, 0.7), "16": S(0.5, 0.6, 0.7)},
                 better="lower")
    assert v == "partially reproduced (at 1.5L; not at 16)"


def test_the_order_of_the_conditions_does_not_matter_and_none_means_no_models():
    a, b = S(1, 2, 3), S(4, 5, 6)
    ordered = pe.judge({"2L": a, "4L": S(1, 2, 2)}, {"2L": b, "4L": b}, better="lower")
    assert pe.judge({"2L": a, "4L": S(1, 2, 2)}, {"4L": b, "2L": b}, better="lower") == ordered
    with_control = dict(better="lower", control={"2L": S(7, 8, 9), "4L": S(7, 8, 9)})
    assert pe.judge({"2L": a, "4L": a}, {"2L": b, "4L": b}, **with_control) == pe.judge(
        {"2L": a, "4L": a}, {"2L": b, "4L": b}, **dict(with_control, control={"4L": S(7, 8, 9), "2L": S(7, 8, 9)}))
    assert pe.judge(a, b, better="lower", needs=None, unsolved=None) == pe.judge(a, b, better="lower")


def test_conditions_of_one_model_at_several_lengths_read_once():
    a, b, same = S(0.8, 0.9, 0.9), S(0.1, 0.2, 0.3), S(0.5, 0.6, 0.7)
    v = pe.judge({"ALiBi at 1024": a, "ALiBi at 2048": a, "RoPE at 2L": same, "RoPE at 8L": same},
                 {"ALiBi at 1024": b, "ALiBi at 2048": b, "RoPE at 2L": same, "RoPE at 8L": same}, better="higher")
    assert v == "partially reproduced (for ALiBi at 1024, 2048; within seed noise for RoPE at 2L, 8L)"


def test_conditions_that_do_not_group_read_as_they_are():
    a, b = S(0.1, 0.1, 0.2), S(0.5, 0.6, 0.7)
    keys = ["2L", "4L", "one head at 4L"]
    v = pe.judge({"8L": b, **{k: a for k in keys}}, {"8L": a, **{k: b for k in keys}}, better="higher")
    assert v == "partially reproduced (at 8L; not for 2L, 4L, one head at 4L)"
    keys = ["bound to 2L", "level at 2L", "level at 4L", "level with one head at 4L", "bound to 4L"]
    v = pe.judge({"8L": b, **{k: a for k in keys}}, {"8L": a, **{k: b for k in keys}}, better="higher")
    assert v == "partially reproduced (at 8L; not for " + ", ".join(keys) + ")"
