"""The reproduction ledger: every chapter's claims table, collected from the executed chapters.

A chapter ends with :func:`publish`: it decides its claims as one family (Holm's correction over
the claims that rest on a test, :func:`scalelong_edu.stats.holm`; a test declared apart, such as a
confirmation on fresh seeds, as its own: :attr:`Claim.family`), shows the claims table (verdict
first, then the paper's claim, what we measured, the margin declared with the claim, raw and
adjusted p, and for an undecided claim the seeds that would decide it) and glues the same table
under the name ``claims_ch<N>``. The ledger page does not recompute anything: :func:`collect`
reads the glued tables out of the executed notebooks, so it shows exactly what the chapters show,
and a test compares the two.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from .stats import VERDICTS, PairedTest, RateTest, TrendTest, holm

if TYPE_CHECKING:
    import pandas as pd
    from pandas.io.formats.style import Styler

GLUE_MIME = "application/papermill.record/text/html"
NAME = re.compile(r"claims_ch(\d+)$")
COLUMNS = ["verdict", "the paper claims", "we measured", "margin", "p (Holm)", "seeds to decide"]
"""The claims table's columns, verdict first so that a phone reader sees it."""


@dataclass(frozen=True)
class Claim:
    """One line of a chapter's claims table.

    A claim that compares runs carries its ``test`` (:func:`scalelong_edu.stats.paired_test`,
    :func:`~scalelong_edu.stats.paired_rates` or :func:`~scalelong_edu.stats.trend_test`, e.g.
    through :func:`scalelong_edu.evidence.compare`)
    and its verdict comes from it, after :func:`publish` corrects the chapter's family. A claim
    decided by a declared rule on a measurement (a bound, a range) or not testable here gives its
    ``verdict`` instead (one of :data:`scalelong_edu.stats.VERDICTS`).

    Attributes:
        chapter, paper, measured: the chapter, the paper's claim, what we measured (text).
        margin: the margin declared with the claim, as the reader should read it (e.g. ``"5%"``).
        planned: the pairs (seeds) the claim's experiment was sized for, if its runs are still
            landing. A test on fewer stays *undecided* whatever it shows: its verdict is read only
            at the declared size, once (looking at every partial result and stopping at the first
            significant one would inflate the error rate). The table's last column then says how
            many of the planned pairs have landed.
        family: the Holm family the claim's test is corrected in: ``""``, the chapter's own; a name
            for a test declared apart from it, after the chapter's family was decided (e.g. a
            confirmation on fresh seeds that a pilot row of the family sized), corrected only with the
            claims of that name. The chapter's error rate is then controlled per family.
        confirmation: for a pilot's claim that a declared confirmation re-tests on fresh seeds, the
            confirmation's family: the claims table shows the confirmation's row in its place (one
            claim, one row, decided at the confirmation's size), while the pilot's test stays in
            its own family's correction, so the other claims' adjusted p-values do not change.
    """

    chapter: int
    paper: str
    measured: str
    verdict: str | None = None
    test: PairedTest | RateTest | TrendTest | None = None
    margin: str = ""
    planned: int = 0
    family: str = ""
    confirmation: str = ""

    def __post_init__(self):
        if (self.verdict is None) == (self.test is None):
            raise ValueError(f"claim {self.paper!r}: give a test or a verdict, not both or neither")
        if self.test is None and self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.planned and self.test is not None and self.test.n > self.planned:
            raise ValueError(f"claim {self.paper!r}: its test has {self.test.n} pairs, more than the {self.planned} "
                             "planned")

    @property
    def landing(self) -> bool:
        """Whether the claim's runs are still landing: it has a ``planned`` size, and no test yet
        or a test on fewer pairs."""
        return self.planned > 0 and (self.test is None or self.test.n < self.planned)

    @property
    def decided(self) -> str:
        """The verdict: the test's (after :func:`publish`'s correction), else the one given;
        *undecided* while the runs are :attr:`landing`."""
        if self.landing:
            return "undecided"
        return self.test.verdict if self.test is not None else self.verdict

    @property
    def stated(self) -> str:
        """The verdict as a chapter's prose states it: :attr:`decided`, or "runs landing, verdict held"
        while the runs are :attr:`landing` (the tables and counts keep *undecided*)."""
        return "runs landing, verdict held" if self.landing else self.decided


def _p_text(test: PairedTest | RateTest | TrendTest | None) -> str:
    if test is None:
        return ""
    adjusted = f" ({test.p_holm:.2g})" if test.p_holm is not None else ""
    return f"{test.p:.2g}{adjusted}"


def _seeds_text(claim: Claim) -> str:
    """The last column: how many of the planned pairs have landed, or the pairs that would decide the
    claim; in runs for a trend test, whose unit is the run, not the seed."""
    unit = " runs" if isinstance(claim.test, TrendTest) else ""
    if claim.landing:
        return f"{claim.planned}{unit} planned" + (f", {claim.test.n} landed" if claim.test else "")
    if claim.decided != "undecided" or claim.test is None:
        return ""
    return f"{claim.test.seeds_needed}{unit}"


def shown(claims: list[Claim]) -> list[Claim]:
    """The claims a claims table shows: all but a pilot's claim that a confirmation re-tests
    (:attr:`Claim.confirmation`), whose row the confirmation's takes.

    Raises:
        ValueError: a pilot's claim names a confirmation none of ``claims`` belongs to.
    """
    families = {c.family for c in claims}
    orphans = [c.paper for c in claims if c.confirmation and c.confirmation not in families]
    if orphans:
        raise ValueError(f"claims {orphans} name a confirmation that no claim belongs to (Claim.family): publish the "
                         "confirmation's claims with them, or drop the confirmation name")
    return [c for c in claims if not c.confirmation]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """The claims as the table a chapter ends with (:data:`COLUMNS`), one row for each of
    :func:`shown`."""
    import pandas as pd

    return pd.DataFrame([(c.decided, c.paper, c.measured, c.margin, _p_text(c.test), _seeds_text(c))
                         for c in shown(claims)], columns=COLUMNS)


def decide(claims: list[Claim]) -> list[Claim]:
    """The claims with the tests among them Holm-corrected, each :attr:`Claim.family` apart (the
    others unchanged)."""
    out = list(claims)
    for family in dict.fromkeys(c.family for c in claims):
        tested = [i for i, c in enumerate(claims) if c.test is not None and c.family == family]
        for i, test in zip(tested, holm([claims[i].test for i in tested])):
            out[i] = replace(claims[i], test=test)
    return out


def publish(chapter: int, claims: list[Claim]) -> Styler:
    """Decide chapter ``chapter``'s claims, one Holm family each (:func:`decide`), glue them as
    ``claims_ch<chapter>`` (the full text, untruncated) and return the table to display, without
    its index, the verdicts coloured."""
    import pandas as pd

    from .book import glue

    if any(c.chapter != chapter for c in claims):
        raise ValueError(f"every claim published by chapter {chapter} must carry chapter={chapter}")
    table = claims_table(decide(claims))
    with pd.option_context("display.max_colwidth", None, "display.max_rows", None):
        glue(f"claims_ch{chapter}", table, display=False)
    return table.style.hide(axis="index").map(_verdict_style, subset=["verdict"])


def verdict_counts(verdicts: Iterable[str]) -> str:
    """How many of ``verdicts`` (a few decided claims, e.g. a comparison's rows on one backbone)
    got each of :data:`VERDICTS`, in that order, for prose that sums the rows up: ``["undecided",
    "absent", "absent"]`` gives ``"2 absent, 1 undecided"``.

    Raises:
        ValueError: a verdict is not one of :data:`VERDICTS`, or there are none.
    """
    verdicts = list(verdicts)
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if unknown or not verdicts:
        raise ValueError(f"need one or more of {VERDICTS}, got {unknown or 'none'}: pass Claim.decided after decide()")
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)


VERDICT_COLOURS = {"reproduced": "#1b7837", "contradicted": "#b2182b", "absent": "#2166ac", "undecided": "#6b6b6b",
                   "not tested here": "#6b6b6b"}


def _verdict_style(verdict: str) -> str:
    return f"color: {VERDICT_COLOURS.get(verdict, 'inherit')}; font-weight: bold"


class _TableParser(HTMLParser):
    """The header and body cells of the first HTML table (``DataFrame.to_html``'s layout)."""

    def __init__(self):
        super().__init__()
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self._section, self._cell = "", None

    def handle_starttag(self, tag, attrs):
        if tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "tr" and self._section == "tbody":
            self.rows.append([])
        elif tag in ("th", "td"):
            self._cell = [] if (self._section == "thead" or tag == "td") else None  # skips the index column

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            text = "".join(self._cell).strip()
            (self.header if self._section == "thead" else self.rows[-1]).append(text)
            self._cell = None
        elif tag in ("thead", "tbody"):
            self._section = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _parse(html: str) -> pd.DataFrame:
    import pandas as pd

    parser = _TableParser()
    parser.feed(html)
    columns = [c for c in parser.header if c]  # the index column has an empty heading
    return pd.DataFrame(parser.rows, columns=columns)


def _cells(notebook: str | Path) -> list[dict]:
    """The cells of a notebook file, or a ValueError naming the file when it is not a notebook."""
    path = Path(notebook)
    try:
        content = json.loads(path.read_text())
    except ValueError as error:  # not JSON, or not text
        raise ValueError(f"{path} is not a notebook (not JSON: {error}): restore it (git checkout) and "
                         "re-execute it") from None
    if not (isinstance(content, dict) and isinstance(content.get("cells"), list)):
        raise ValueError(f"{path} is not a notebook (no list of 'cells'): restore it (git checkout) and re-execute it")
    return content["cells"]


def _glued_html(notebook: str | Path) -> dict[str, str]:
    cells = _cells(notebook)
    return {output["metadata"]["scrapbook"]["name"]: "".join(output["data"][GLUE_MIME])
            for cell in cells for output in cell.get("outputs", [])
            if GLUE_MIME in output.get("data", {}) and "scrapbook" in output.get("metadata", {})}


def glued_table(notebook: str | Path, name: str) -> pd.DataFrame:
    """The table an executed notebook glued as ``name`` (``glue(name, frame)``)."""
    glued = _glued_html(notebook)
    if name not in glued:
        raise KeyError(f"{notebook} glues no table named {name!r}; execute it first")
    return _parse(glued[name])


def read_claims(notebook: str | Path) -> pd.DataFrame:
    """The claims table an executed chapter glued with :func:`publish`, with a ``chapter`` column.

    Raises:
        ValueError: the file is not a notebook, or it has no (or more than one) glued claims table,
            or the table has no ``verdict`` column or an unknown verdict.
    """
    return _chapter_claims(notebook)[1]


def _chapter_claims(notebook: str | Path) -> tuple[int, pd.DataFrame]:
    """The chapter number of a notebook's glued claims table, and :func:`read_claims`'s table."""
    found = [(int(match[1]), _parse(html)) for name, html in _glued_html(notebook).items()
             if (match := NAME.match(name))]
    if len(found) != 1:
        raise ValueError(f"{notebook} glues {len(found)} claims tables, not one: execute it, and end it "
                         "with scalelong_edu.ledger.publish(chapter, claims)")
    chapter, table = found[0]
    if "verdict" not in table.columns:
        raise ValueError(f"{notebook}: its claims table has no 'verdict' column: re-execute it")
    if not set(table["verdict"]) <= set(VERDICTS):
        raise ValueError(f"{notebook}: unknown verdicts {set(table['verdict']) - set(VERDICTS)}")
    return chapter, table.assign(chapter=chapter)[["chapter", *table.columns]]


def collect(notebooks: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """Every claims table of ``notebooks`` (one path or several), in order: the ledger.

    Raises:
        ValueError: no notebooks, a notebook :func:`read_claims` refuses, or two notebooks that
            glue the claims of the same chapter.
    """
    import pandas as pd

    paths = [notebooks] if isinstance(notebooks, (str, Path)) else list(notebooks)
    if not paths:
        raise ValueError("no chapter notebooks given: the ledger reads the executed chapters, so run it "
                         "in the book/ folder of a clone of the repository")
    tables, seen = [], {}
    for path in paths:
        chapter, table = _chapter_claims(path)
        if chapter in seen:
            raise ValueError(f"{seen[chapter]} and {path} both glue claims_ch{chapter}: a chapter publishes its claims "
                             "once; pass each notebook once, or fix the chapter number one of them gives publish()")
        seen[chapter] = path
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def tally(ledger: pd.DataFrame) -> pd.DataFrame:
    """How many claims of each chapter got each of the five verdicts, with the claims that rest on
    a test (those with a p-value, Holm-corrected in the chapter's family or their own); one row per
    chapter, plus a total."""
    missing = [c for c in ("chapter", "verdict") if c not in ledger.columns]
    if missing:
        raise ValueError(f"the ledger has no {missing[0]!r} column (it has {list(ledger.columns)}): pass the table "
                         "collect() returns")
    counts = ledger.groupby(["chapter", "verdict"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=list(VERDICTS), fill_value=0)
    counts["family"] = (ledger["p (Holm)"] != "").groupby(ledger.chapter).sum() if "p (Holm)" in ledger else 0
    counts.loc["all"] = counts.sum()
    counts.columns.name = None
    return counts


__all__ = ["COLUMNS", "VERDICTS", "Claim", "claims_table", "collect", "decide", "glued_table", "publish", "read_claims",
           "shown", "tally", "verdict_counts"]
