"""The reproduction ledger: every chapter's claims table, collected from the executed chapters.

A chapter ends with :func:`publish`: it shows the claims table (paper claim, what we measured,
verdict: one :class:`Claim` a line) and glues the same table under the name
``claims_ch<N>``. The ledger page does not recompute anything: :func:`collect` reads the glued
tables out of the executed notebooks, so it shows exactly what the chapters show, and a test
compares the two.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Sequence


if TYPE_CHECKING:
    import pandas as pd
    from pandas.io.formats.style import Styler

VERDICTS = ("reproduced", "not at this scale", "contradicted")
"""A claim is reproduced (our measurement agrees; for comparisons, the 95% intervals over seeds
are apart in the claimed order), not decided at this scale, or contradicted."""
GLUE_MIME = "application/papermill.record/text/html"
NAME = re.compile(r"claims_ch(\d+)$")


@dataclass(frozen=True)
class Claim:
    """One line of a chapter's claims table: what the paper says, what we measured, the verdict."""

    chapter: int
    paper: str
    measured: str
    verdict: str

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """The claims as the table a chapter ends with (columns: paper claims, we measured, verdict)."""
    import pandas as pd

    return pd.DataFrame([(c.paper, c.measured, c.verdict) for c in claims],
                        columns=["the paper claims", "we measured", "verdict"])


def publish(chapter: int, claims: list[Claim]) -> Styler:
    """Glue chapter ``chapter``'s claims as ``claims_ch<chapter>`` (the full text, untruncated)
    and return the table to display, without its index."""
    import pandas as pd

    from .book import glue

    if any(c.chapter != chapter for c in claims):
        raise ValueError(f"every claim published by chapter {chapter} must carry chapter={chapter}")
    table = claims_table(claims)
    with pd.option_context("display.max_colwidth", None, "display.max_rows", None):
        glue(f"claims_ch{chapter}", table, display=False)
    return table.style.hide(axis="index")


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


def _glued_html(notebook: str | Path) -> dict[str, str]:
    cells = json.loads(Path(notebook).read_text())["cells"]
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
        ValueError: the notebook has no (or more than one) glued claims table.
    """
    found = [(int(match[1]), _parse(html)) for name, html in _glued_html(notebook).items()
             if (match := NAME.match(name))]
    if len(found) != 1:
        raise ValueError(f"{notebook} glues {len(found)} claims tables, not one: execute it, and end it "
                         "with scalelong_edu.ledger.publish(chapter, claims)")
    chapter, table = found[0]
    if not set(table["verdict"]) <= set(VERDICTS):
        raise ValueError(f"{notebook}: unknown verdicts {set(table['verdict']) - set(VERDICTS)}")
    return table.assign(chapter=chapter)[["chapter", *table.columns]]


def collect(notebooks: Sequence[str | Path]) -> pd.DataFrame:
    """Every claims table of ``notebooks``, in order: the ledger."""
    import pandas as pd

    if not notebooks:
        raise ValueError("no chapter notebooks given: the ledger reads the executed chapters, so run it "
                         "in the book/ folder of a clone of the repository")
    return pd.concat([read_claims(path) for path in notebooks], ignore_index=True)


def tally(ledger: pd.DataFrame) -> pd.DataFrame:
    """How many claims of each chapter got each verdict (one row per chapter, plus a total)."""
    counts = ledger.groupby(["chapter", "verdict"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=list(VERDICTS), fill_value=0)
    counts.loc["all"] = counts.sum()
    counts.columns.name = None
    return counts


__all__ = ["VERDICTS", "Claim", "claims_table", "collect", "glued_table", "publish", "read_claims", "tally"]
