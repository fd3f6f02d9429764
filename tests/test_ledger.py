"""pe.claim: the ledger entry of a re-tested claim, checked on the way in and read back from a notebook's outputs."""

import json

import pytest

import posenc as pe
from posenc.ledger import Claim

GOOD = dict(source="press2022alibi", claim="ALiBi holds its loss beyond the training length.",
            measured="rise 0.010 (0.000–0.020)", verdict=pe.Verdict("reproduced"), section="the-experiment")


def _with(**changes):
    return {**GOOD, **changes}


@pytest.mark.parametrize("key, changes, message", [
    ("Bad Key", {}, "key must be"),
    ("", {}, "key must be"),
    ("ok", {"source": ""}, "BibTeX keys"),
    ("ok", {"source": []}, "non-empty list"),
    ("ok", {"source": ["a2020x", "a2020x"]}, "twice"),
    ("ok", {"source": ["has space"]}, "BibTeX keys"),
    ("ok", {"claim": "  "}, "claim must be a non-empty string"),
    ("ok", {"claim": "one\ntwo"}, "one line"),
    ("ok", {"measured": ""}, "measured must be"),
    ("ok", {"measured": "$x$"}, "no math"),
    ("ok", {"verdict": "Reproduced!"}, "verdict must be"),
    ("ok", {"verdict": True}, "verdict must be"),
    ("ok", {"section": "#the-experiment"}, "anchor"),
    ("ok", {"section": "two words"}, "anchor"),
])
def test_claim_refuses_bad_input(key, changes, message):
    with pytest.raises(ValueError, match=message):
        pe.claim(key, **_with(**changes))


def test_claim_keeps_what_it_was_given():
    verdict = pe.judge(pe.Spread((0.1, 0.2, 0.2)), pe.Spread((0.5, 0.6, 0.9)), better="lower")
    entry = pe.claim("alibi-holds", **_with(source=["press2022alibi", "chi2022kerple"], verdict=verdict,
                                             measured=pe.Spread((0.1, 0.2, 0.3))))
    assert entry == Claim("alibi-holds", ("press2022alibi", "chi2022kerple"), GOOD["claim"],
                          "0.200 (0.100–0.300)", "reproduced", "reproduced", "the-experiment")
    noisy = pe.claim("noise", **_with(verdict=pe.Verdict("within seed noise", "rise")))
    assert (noisy.verdict, noisy.outcome) == ("within seed noise (rise)", "within seed noise")
    assert pe.claim("plain", **_with(verdict="not tested here")).outcome == "not tested here"


def _executed(kernel_code: str) -> dict:
    """A one-cell notebook executed in a real kernel, as the book's build executes the chapters."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(kernel_code)])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return json.loads(nbformat.writes(nb))


def test_the_entry_read_back_from_an_executed_notebook_is_the_one_given():
    nb = _executed(
        "import posenc as pe\n"
        "v = pe.judge(pe.Spread((0.1, 0.2, 0.2)), pe.Spread((0.5, 0.6, 0.9)), better='lower')\n"
        "pe.claim('alibi-holds', source=['press2022alibi', 'chi2022kerple'], claim='ALiBi holds its loss.', "
        "measured='rise 0.17 (0.10–0.20)', verdict=v, section='the-experiment')\n"
        "pe.claim('t5', source='raffel2020t5', claim='The T5 bias holds.', measured='x', "
        "verdict=pe.Verdict('not tested here', 'no long sequences'), section='t5');")
    entries = pe.entries_in_notebook(nb)
    assert entries == [
        Claim("alibi-holds", ("press2022alibi", "chi2022kerple"), "ALiBi holds its loss.", "rise 0.17 (0.10–0.20)",
              "reproduced", "reproduced", "the-experiment"),
        Claim("t5", ("raffel2020t5",), "The T5 bias holds.", "x", "not tested here (no long sequences)",
              "not tested here", "t5"),
    ]
    glued = {o["metadata"]["scrapbook"]["name"]: o["data"] for o in nb["cells"][0]["outputs"]}
    assert glued["claim-alibi-holds"]["application/papermill.record/text/plain"] == "'reproduced'"
    assert glued["claim-t5-sentence"]["application/papermill.record/text/plain"] == "'Not tested here (no long sequences)'"
    assert all(name.startswith("application/papermill.record/") for data in glued.values() for name in data), \
        "glued entries are not shown on the page"


def test_entries_in_notebook_refuses_a_key_recorded_twice_with_other_contents():
    one = Claim("k", ("a2020x",), "c.", "m", "reproduced", "reproduced", "s")
    other = Claim("k", ("a2020x",), "c.", "m", "not reproduced", "not reproduced", "s")

    def output(entry):
        return {"output_type": "display_data", "metadata": {"scrapbook": {"name": f"claim-{entry.key}-entry"}},
                "data": {"application/papermill.record/application/vnd.posenc.claim+json": json.loads(entry.as_json())}}

    cell = {"cell_type": "code", "outputs": [output(one), output(one)]}
    assert pe.entries_in_notebook({"cells": [cell]}) == [one]
    cell["outputs"].append(output(other))
    with pytest.raises(ValueError, match="twice"):
        pe.entries_in_notebook({"cells": [cell]})
    with pytest.raises(ValueError, match="fields"):
        Claim.from_mapping({"key": "k"})
