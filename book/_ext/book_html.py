"""Sphinx fixes and additions for the book's HTML (loaded through ``sphinx.local_extensions``).

* **One copy of every script.** Sphinx 7.4 registers an inline script that an extension adds after
  the builder has started twice (once with filename ``None``, once ``""``): sphinx-thebe's
  ``const THEBE_JS_URL = ...`` then throws "Identifier 'THEBE_JS_URL' has already been declared"
  on every page. :func:`drop_duplicate_scripts` keeps the first copy.
* **An author-year bibliography.** The chapters cite author-year ("[Ho et al., 2020]"), so the
  bibliography is labelled and sorted the same way: the pybtex style ``authoryear``
  (:class:`AuthorYearStyle`, :class:`AuthorYearLabels`), selected by ``bibtex_default_style``.
  Two works with one label get "2021a", "2021b"; the citation style ``author_year_label``
  (:class:`LabelYearReferenceStyle`, selected by ``bibtex_reference_style``) is sphinxcontrib-bibtex's
  ``author_year`` with the year taken from that label, so the text says "2021a" too.
* **Back-links.** sphinxcontrib-bibtex links a bibliography entry back to its citations only when
  both are on one page; the book keeps its bibliography on a page of its own, so
  :class:`CitedInTransform` adds under every entry "Cited in: <page>, <page> (2, 3)" with a link to
  each place that cites it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from docutils import nodes
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import node
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinxcontrib.bibtex.plugin import register_plugin as register_bibtex_plugin
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle,
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.template import join, join2, post_text, pre_text, reference


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                           doctree: nodes.document | None) -> None:
    """Remove repeated ``<script>`` entries (same file or same inline body) from a page's context."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for script in context.get("script_files", []):
        name = str(getattr(script, "filename", script) or "")
        key = (name, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


class AuthorYearLabels(BaseLabelStyle):
    """Labels as the chapters cite: "Ho, 2020", "Hanin and Rolnick, 2018", "Ho et al., 2020"
    (a, b, ... appended when two works would share a label)."""

    @staticmethod
    def _authors(entry) -> str:
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        last = [" ".join(p.last_names) for p in people]
        if not last:
            return entry.fields.get("key", entry.key)
        if len(last) == 1:
            return last[0]
        if len(last) == 2:
            return f"{last[0]} and {last[1]}"
        return f"{last[0]} et al."

    def format_labels(self, sorted_entries: Iterable) -> Iterator[str]:
        entries = list(sorted_entries)
        labels = [f"{self._authors(e)}, {e.fields.get('year', 'n.d.')}" for e in entries]
        repeats = {label for label in labels if labels.count(label) > 1}
        suffix: dict[str, int] = defaultdict(int)
        for label in labels:
            if label in repeats:
                suffix[label] += 1
                label += "abcdefghijklmnopqrstuvwxyz"[suffix[label] - 1]
            yield label


class AuthorYearStyle(UnsrtStyle):
    """pybtex's ``unsrt`` entries, labelled :class:`AuthorYearLabels`, sorted by author, year, title."""

    default_label_style = AuthorYearLabels
    default_sorting_style = "author_year_title"


@node
def label_year(children, data: dict[str, Any]) -> Text:
    """The year of an entry's :class:`AuthorYearLabels` label, with its suffix: "2021a"."""
    assert not children
    return Text(data["formatted_entry"].label.rpartition(", ")[2])


class LabelYearParenthetical(BasicAuthorYearParentheticalReferenceStyle):
    """"[Song et al., 2021a]": sphinxcontrib-bibtex's parenthetical author-year with :func:`label_year`."""

    def inner(self, role_name: str):
        author = self.person.author_or_editor_or_title(full="s" in role_name)
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text, reference[join(sep=self.author_year_sep)[author, label_year]], post_text]


class LabelYearTextual(BasicAuthorYearTextualReferenceStyle):
    """"Song et al. [2021a]": sphinxcontrib-bibtex's textual author-year with :func:`label_year`."""

    def inner(self, role_name: str):
        author = self.person.author_or_editor_or_title(full="s" in role_name)
        cited = join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[pre_text, reference[label_year], post_text]
        return join(sep=self.text_reference_sep)[author, join[self.bracket.left, cited, self.bracket.right]]


class LabelYearReferenceStyle(AuthorYearReferenceStyle):
    """``author_year`` whose parenthetical and textual citations print the label's year ("2021a")."""

    def __post_init__(self):
        super().__post_init__()
        swap = {BasicAuthorYearParentheticalReferenceStyle: LabelYearParenthetical,
                BasicAuthorYearTextualReferenceStyle: LabelYearTextual}
        self.styles = [swap[type(s)](**vars(s)) if type(s) in swap else s for s in self.styles]
        self.role_style.update((role, style) for style in self.styles for role in style.role_names())


class CitedInTransform(SphinxPostTransform):
    """Under every bibliography entry, links back to each place in the book that cites it."""

    default_priority = 6  # after sphinxcontrib-bibtex's BibliographyTransform (5) made the entries
    formats = ("html",)

    def run(self, **kwargs: Any) -> None:
        domain = self.env.get_domain("cite")
        docname = self.env.docname
        by_id = {c.citation_id: c for c in domain.citations if c.bibliography_key.docname == docname}
        if not by_id:
            return
        for entry in list(self.document.findall(nodes.citation)):
            citation = next((by_id[i] for i in entry["ids"] if i in by_id), None)
            if citation is None:
                continue
            places: dict[str, list[str]] = defaultdict(list)  # citing page -> ids of its citations
            for ref in domain.citation_refs:
                if citation.key in {target.key for target in ref.targets}:
                    places[ref.docname].append(ref.citation_ref_id)
            if places:
                entry += self._cited_in(docname, places)

    def _cited_in(self, here: str, places: dict[str, list[str]]) -> nodes.paragraph:
        para = nodes.paragraph(classes=["cited-in"])
        para += nodes.Text("Cited in: ")
        order = _reading_order(self.env)
        for k, page in enumerate(sorted(places, key=lambda p: order.index(p) if p in order else len(order))):
            if k:
                para += nodes.Text("; ")
            uri = self.app.builder.get_relative_uri(here, page)
            ids = places[page]
            title = self.env.titles[page].astext()
            para += nodes.reference("", title, refuri=f"{uri}#{ids[0]}", internal=True)
            if len(ids) > 1:
                para += nodes.Text(" (")
                for j, ref_id in enumerate(ids[1:], start=2):
                    if j > 2:
                        para += nodes.Text(", ")
                    para += nodes.reference("", str(j), refuri=f"{uri}#{ref_id}", internal=True)
                para += nodes.Text(")")
        return para


def _reading_order(env) -> list[str]:
    """Every document in the order a reader meets it: the root, then its toctrees depth first."""
    order: list[str] = []

    def visit(docname: str) -> None:
        if docname in order:
            return
        order.append(docname)
        for child in env.toctree_includes.get(docname, []):
            visit(child)

    visit(env.config.root_doc)
    return order


def setup(app: Sphinx) -> dict[str, Any]:
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    register_bibtex_plugin("sphinxcontrib.bibtex.style.referencing", "author_year_label", LabelYearReferenceStyle)
    app.connect("html-page-context", drop_duplicate_scripts, priority=999)
    app.add_post_transform(CitedInTransform)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
