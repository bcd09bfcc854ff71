"""Tests of scalelong_edu.ledger: the claims tables read back from executed notebooks, and the
book's ledger page against its chapters."""

import json

import pandas as pd
import pytest

from scalelong_edu import ledger
from scalelong_edu.ledger import Claim, claims_table
from scalelong_edu.stats import paired_test, trend_test
from scalelong_edu.notebooks import ROOT, chapters

LONG = "Thm 3.1: ||h_i||^2 <= C ||x_t||^2 S_i & more " + "words " * 20  # past pandas' 50-character cut


def glue_output(name, frame):
    """A cell output as myst-nb's glue(name, frame, display=False) stores it."""
    with pd.option_context("display.max_colwidth", None):
        html = frame._repr_html_()
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": "x"}},
            "data": {ledger.GLUE_MIME: html, "application/papermill.record/text/plain": repr(frame)}}


def notebook(tmp_path, outputs, name="nb.ipynb"):
    path = tmp_path / name
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": outputs}]}))
    return path


CLAIMS = [Claim(6, LONG, "0.71 [0.52, 0.90] vs 1 (n = 3)", "undecided"),
          Claim(6, "CS <speeds> training up", "x < y", "reproduced")]
CLEAR = paired_test([1.0, 2.0, 3.0, 4.0], [0.5, 1.4, 2.6, 3.5], margin=0.1)  # p = 0.003
NOISY = paired_test([1.0, 2.0, 3.0], [1.5, 1.0, 3.2], margin=0.1)


def test_claim_rejects_an_unknown_verdict_and_needs_a_test_or_a_verdict():
    with pytest.raises(ValueError, match="verdict must be one of"):
        Claim(3, "CS damps oscillation", "less oscillation", "confirmed")
    with pytest.raises(ValueError, match="not both or neither"):
        Claim(3, "CS damps oscillation", "less oscillation")
    with pytest.raises(ValueError, match="not both or neither"):
        Claim(3, "CS damps oscillation", "less oscillation", "reproduced", test=CLEAR)


def test_claims_table_puts_the_verdict_first_and_reports_p_and_seeds():
    claims = [Claim(3, "CS damps feature oscillation", "0.1 vs 0.3", test=CLEAR, margin="0.1"),
              Claim(3, "LS beats CS", "noisy", test=NOISY, margin="0.1"),
              Claim(3, "CIFAR-10's ratio", "offline", "not tested here")]
    table = claims_table(claims)
    assert list(table.columns) == ["verdict", "the paper claims", "we measured", "margin", "p (Holm)",
                                   "seeds to decide"]
    assert table.verdict.tolist() == ["reproduced", "undecided", "not tested here"]
    assert table["p (Holm)"].tolist() == [f"{CLEAR.p:.2g}", f"{NOISY.p:.2g}", ""]
    assert table["seeds to decide"].tolist() == ["", str(NOISY.seeds_needed), ""]
    assert len(claims_table([])) == 0
    weak = trend_test([1, 2, 3, 4, 5, 6], [2.0, 1.0, 4.0, 3.0, 6.0, 5.0], margin=0.3)
    trend = Claim(5, "the bound ranks the runs", "rho", test=weak, margin="|ρ| 0.3")
    assert claims_table([trend])["seeds to decide"][0] == f"{weak.seeds_needed} runs"  # a trend counts runs


def test_a_claim_whose_runs_are_still_landing_stays_undecided_and_says_how_many_landed():
    landing = Claim(3, "CS damps feature oscillation", "0.1 vs 0.3", test=CLEAR, planned=16)
    assert CLEAR.verdict == "reproduced" and landing.landing and landing.decided == "undecided"
    assert landing.stated == "runs landing, verdict held"
    done = Claim(3, "CS damps feature oscillation", "0.1 vs 0.3", test=CLEAR, planned=CLEAR.n)
    assert not done.landing and done.decided == done.stated == "reproduced"
    table = claims_table(ledger.decide([landing, done]))
    assert table["seeds to decide"].tolist() == [f"16 planned, {CLEAR.n} landed", ""]
    assert table.verdict.tolist() == ["undecided", "reproduced"]
    waiting = Claim(3, "CS damps feature oscillation", "runs landing: 1 of 12 seeds", "undecided", planned=12)
    assert waiting.landing and claims_table([waiting])["seeds to decide"][0] == "12 planned"
    with pytest.raises(ValueError, match="more than the 2 planned"):
        Claim(3, "CS damps feature oscillation", "0.1 vs 0.3", test=CLEAR, planned=2)


def test_publish_decides_a_chapters_claims_as_one_holm_family():
    marginal = paired_test([1.0, 2.0, 3.0, 4.0, 5.0], [0.8, 1.9, 2.5, 3.9, 4.6], margin=0.1)
    assert 0.01 < marginal.p < 0.05 and marginal.verdict == "reproduced"  # alone, it passes
    family = [Claim(4, "a", "m", test=marginal)] + [Claim(4, f"b{k}", "m", test=NOISY) for k in range(3)]
    decided = ledger.decide(family + [Claim(4, "rule", "m", "contradicted")])
    assert decided[0].test.p_holm == pytest.approx(min(1, 4 * marginal.p)) and decided[0].decided == "undecided"
    assert decided[-1].decided == "contradicted" and decided[-1].test is None
    table = claims_table(decided)
    assert table["p (Holm)"][0] == f"{marginal.p:.2g} ({4 * marginal.p:.2g})"
    confirmation = Claim(4, "a, on fresh seeds", "m", test=marginal, family="confirmation")
    decided = ledger.decide(family + [confirmation])
    assert decided[0].decided == "undecided" and decided[-1].test.p_holm == marginal.p  # its own family
    assert decided[-1].decided == "reproduced" and decided[1].test.p_holm == pytest.approx(min(1, 4 * NOISY.p))



def test_a_confirmation_takes_the_place_of_its_pilots_row_but_not_of_its_correction():
    marginal = paired_test([1.0, 2.0, 3.0, 4.0, 5.0], [0.8, 1.9, 2.5, 3.9, 4.6], margin=0.1)
    pilot = Claim(4, "a (pilot)", "m", test=NOISY, confirmation="a-confirm")
    others = [Claim(4, "b", "m", test=CLEAR), Claim(4, "rule", "m", "contradicted")]
    fresh = Claim(4, "a (fresh seeds)", "m", test=marginal, family="a-confirm")
    decided = ledger.decide([pilot, *others, fresh])
    assert decided[1].test.p_holm == pytest.approx(2 * CLEAR.p)  # the pilot still counts in its family
    assert decided[3].test.p_holm == marginal.p  # the confirmation is a family of its own
    table = claims_table(decided)
    assert list(table["the paper claims"]) == ["b", "rule", "a (fresh seeds)"]
    assert list(table["verdict"]) == ["reproduced", "contradicted", "reproduced"]
    with pytest.raises(ValueError, match="no claim belongs to"):
        claims_table([pilot, *others])


def test_read_claims_returns_the_full_untruncated_table(tmp_path):
    path = notebook(tmp_path, [glue_output("other", pd.DataFrame({"a": [1]})),
                               glue_output("claims_ch6", claims_table(CLAIMS))])
    table = ledger.read_claims(path)
    assert list(table.columns) == ["chapter", *ledger.COLUMNS]
    assert table["the paper claims"].tolist() == [LONG.strip(), "CS <speeds> training up"]
    assert table["we measured"].tolist() == [c.measured for c in CLAIMS] and set(table.chapter) == {6}


def test_a_chapter_must_glue_exactly_one_claims_table(tmp_path):
    with pytest.raises(ValueError, match="0 claims tables"):
        ledger.read_claims(notebook(tmp_path, []))
    twice = [glue_output("claims_ch6", claims_table(CLAIMS)), glue_output("claims_ch7", claims_table(CLAIMS))]
    with pytest.raises(ValueError, match="2 claims tables"):
        ledger.read_claims(notebook(tmp_path, twice))
    bad = claims_table(CLAIMS).assign(verdict=["reproduced", "probably"])
    with pytest.raises(ValueError, match="unknown verdicts"):
        ledger.read_claims(notebook(tmp_path, [glue_output("claims_ch6", bad)]))
    with pytest.raises(ValueError, match="no 'verdict' column"):
        ledger.read_claims(notebook(tmp_path, [glue_output("claims_ch6", claims_table(CLAIMS).drop(columns="verdict"))]))
    with pytest.raises(ValueError, match="clone of the repository"):
        ledger.collect([])
    with pytest.raises(KeyError, match="no table named 'ledger'"):
        ledger.glued_table(notebook(tmp_path, []), "ledger")


@pytest.mark.parametrize("content, match", [("{not json", "is not a notebook \\(not JSON"),
                                            ("[1, 2]", "is not a notebook \\(no list of 'cells'\\)"),
                                            ('{"cells": 3}', "is not a notebook \\(no list")])
def test_a_file_that_is_not_a_notebook_is_named(tmp_path, content, match):
    path = tmp_path / "broken.ipynb"
    path.write_text(content)
    for read in (ledger.read_claims, ledger.collect, lambda p: ledger.glued_table(p, "ledger")):
        with pytest.raises(ValueError, match=f"broken.ipynb {match}"):
            read(path)


def test_collect_accepts_one_notebook_as_a_string_or_a_path(tmp_path):
    path = notebook(tmp_path, [glue_output("claims_ch6", claims_table(CLAIMS))])
    expected = ledger.collect([path])
    pd.testing.assert_frame_equal(ledger.collect(str(path)), expected)
    pd.testing.assert_frame_equal(ledger.collect(path), expected)


def test_collect_refuses_two_notebooks_with_the_claims_of_one_chapter(tmp_path):
    first = notebook(tmp_path, [glue_output("claims_ch3", claims_table(CLAIMS))], "03_a.ipynb")
    second = notebook(tmp_path, [glue_output("claims_ch3", claims_table(CLAIMS))], "03_b.ipynb")
    with pytest.raises(ValueError, match=r"03_a.ipynb and .*03_b.ipynb both glue claims_ch3"):
        ledger.collect([first, second])
    with pytest.raises(ValueError, match="pass each notebook once"):
        ledger.collect([first, first])


def test_tally_needs_the_ledgers_chapter_and_verdict_columns():
    with pytest.raises(ValueError, match="the ledger has no 'verdict' column.*collect\\(\\) returns"):
        ledger.tally(pd.DataFrame({"chapter": [1]}))
    with pytest.raises(ValueError, match="no 'chapter' column"):
        ledger.tally(claims_table(CLAIMS))


def test_publish_refuses_claims_of_another_chapter():
    with pytest.raises(ValueError, match="chapter=7"):
        ledger.publish(7, CLAIMS)


def test_collect_keeps_chapter_order_and_tally_counts(tmp_path):
    other = [Claim(2, "b", "m", "contradicted"), Claim(2, "c", "m", test=CLEAR)]
    paths = [notebook(tmp_path, [glue_output("claims_ch2", claims_table(other))], "a.ipynb"),
             notebook(tmp_path, [glue_output("claims_ch6", claims_table(CLAIMS))], "b.ipynb")]
    table = ledger.collect(paths)
    assert table.chapter.tolist() == [2, 2, 6, 6]
    counts = ledger.tally(table)
    assert list(counts.columns) == ["reproduced", "contradicted", "absent", "undecided", "not tested here", "family"]
    assert counts.loc[2].tolist() == [1, 1, 0, 0, 0, 1] and counts.loc[6].tolist() == [1, 0, 0, 1, 0, 0]
    assert counts.loc["all"].tolist() == [2, 1, 0, 1, 0, 1]


def test_the_book_ledger_shows_what_the_chapters_glue():
    """The ledger page's table, as executed, equals the claims tables the executed chapters glue:
    re-executing a chapter whose claims changed without re-executing the ledger fails here."""
    pages = [path for path in chapters() if path.stem != "ledger"]
    expected = ledger.collect(pages).astype(str)
    shown = ledger.glued_table(ROOT / "book" / "ledger.ipynb", "ledger")
    assert set(expected.chapter.astype(int)) == set(range(1, 9)), "every chapter 1-8 publishes claims"
    pd.testing.assert_frame_equal(shown, expected)


def test_verdict_counts_sums_up_rows_in_verdict_order():
    assert ledger.verdict_counts(["undecided", "absent", "absent"]) == "2 absent, 1 undecided"
    assert ledger.verdict_counts(iter(["reproduced"])) == "1 reproduced"
    with pytest.raises(ValueError, match="decide"):
        ledger.verdict_counts(["probably"])
    with pytest.raises(ValueError, match="none"):
        ledger.verdict_counts([])
