"""The built book, checked in a real browser.

A module fixture builds the book once, exactly as CI and ``make book`` do
(``jupyter-book build . --all -W --keep-going``; a non-zero exit or any ``WARNING`` fails),
serves ``_build/html`` on 127.0.0.1 and opens every page of ``_toc.yml`` in Debian's headless
Chromium through Playwright, on a desktop (1280 px) and on a phone (390 px). Each page must load,
typeset its math with MathJax, load its images, render its theorem/definition blocks and its saved
widgets, show no traceback or broken-widget text, log no console error, throw no JavaScript error,
request no missing file (no tolerated faults), and link only to files and anchors that exist. At
both widths no display equation, code block, cell output or table may be wider than the article
column (on the phone, code, text output and tables may scroll sideways inside their own box, since
an 88-character line cannot fit 390 px; equations, figures, widgets and charts may not); on the
phone no margin note or sidebar may be squeezed beside the text; figure captions must be as legible
as the text. Equations and figures are numbered per chapter, the bibliography is author-year with
links back to the citations, and the kappa explorer of chapter 2 (a Vega-Lite chart) must recompute
when its controls move. With ``SCALELONG_SCREENSHOTS=1`` in the environment, full-page screenshots
at both widths are saved in ``_build/screenshots/`` for a human to look at (they check nothing, and
take about a third of the browser's time).

The test is hermetic. The pages load MathJax, Vega (and, on pages with widgets, RequireJS and the
Jupyter widget manager) from public CDNs; the browser gets those files from local copies of
the same npm packages instead (``npm pack``, cached in ``.cache/npm/``), and every other
request that leaves 127.0.0.1 is aborted and reported as a failure.

Without ``/usr/bin/chromium``, ``npm`` or the ``playwright`` package the browser tests are
skipped, unless the environment variable ``CI`` is set: then they fail, because CI must run
them (``.ci/run`` installs Chromium).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots" if os.environ.get("SCALELONG_SCREENSHOTS") == "1" else None
NPM_CACHE = ROOT / ".cache" / "npm"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
BAD_TEXT = ("Traceback (most recent call last)", "Failed to display Jupyter Widget", "Error displaying widget")
WIDTHS = (1280, 390)  # a desktop and a phone, in CSS pixels
PHONE = min(WIDTHS)
ASIDE_MIN_SHARE = 0.9  # on a phone a margin note or sidebar takes at least this share of the column
CAPTION_MIN_CONTRAST = 7.0  # WCAG AAA for body text: captions read like the text around them
CAPTION_MIN_PX = 14.0
MAX_PAGE_BYTES = 5_000_000  # a page with everything it loads, uncompressed, as served
FIGURE_MIN_TEXT_PX = 8.0  # figure text on a phone, in CSS px, unless the figure links to its full-size image
FIGURE_DPI = 100.0  # pixels per inch of the figures' PNGs (plotting.BOOK_RC["figure.dpi"], Jupyter's inline backend)
# "[uvit-gentle] loaded from the cache: ..." and "cifar10: not available on this machine": bookkeeping
PROVENANCE_LINE = r"/^\[[\w.-]+\] loaded from the cache: |^[\w-]+: not available on this machine/m"
EXPLORER_PAGE = "book/02_unets_and_long_skips"
EXPLORER_CELL = "from scalelong_edu.explorer import kappa_explorer_chart\n\nkappa_explorer_chart()"
SOURCE_SUFFIXES = (".md", ".ipynb", ".rst")
# "```{prf:theorem}" or ":::{prf:lemma}" in a page's markdown
PRF_DIRECTIVE = re.compile(r"^\s*(?:`{3,}|:{3,})\s*\{prf:(\w+)\}", re.MULTILINE)
# math in markdown: $$, $...$ with something TeX-like inside, {math}, \begin{...}
SOURCE_MATH = re.compile(r"\$\$|\$[^$\n]*[\\^_{}][^$\n]*\$|\{math\}|\\begin\{")
# TeX that MathJax should have consumed, found in the page's visible prose
RAW_TEX = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$[^$\s][^$]{0,200}?\\[A-Za-z]+[^$]{0,200}?\$")
# CDN URLs that are npm packages: (name, version spec, path inside the package)
CDN_NPM = (
    re.compile(r"https://(?:cdn\.jsdelivr\.net/npm|unpkg\.com)/"
               r"(?P<name>(?:@[^/@?#]+/)?[^/@?#]+)(?:@(?P<spec>[^/?#]+))?(?P<path>/[^?#]*)?"),
    re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/(?P<name>[^/]+)/(?P<spec>[^/]+)(?P<path>/[^?#]*)"),
)
# a versioned npm package named in a page's inline script: "https://cdn.jsdelivr.net/npm/vega@6?noext"
INLINE_NPM = re.compile(r"""["'](https://cdn\.jsdelivr\.net/npm/(?:@[^/@"']+/)?[^/@"'?]+@[^"'\s]+)(?<!/)["']""")
CDNJS_TO_NPM = {"require.js": "requirejs"}  # cdnjs library name -> npm package name


def _unavailable(reason: str) -> None:
    """Skip locally; fail under CI, which must run these checks."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


# ------------------------------------------------------------------------------------------
# The pages: every file of _toc.yml, known at collection time


@dataclass(frozen=True)
class Page:
    docname: str  # "book/intro", as in _toc.yml

    @property
    def html(self) -> Path:
        return HTML / f"{self.docname}.html"

    @property
    def source(self) -> Path | None:
        candidates = (ROOT / f"{self.docname}{suffix}" for suffix in SOURCE_SUFFIXES)
        return next((path for path in candidates if path.exists()), None)

    def markdown(self) -> str:
        """The page's markdown: the file, or a notebook's markdown cells."""
        src = self.source
        if src is None:
            return ""
        if src.suffix != ".ipynb":
            return src.read_text(encoding="utf-8")
        cells = json.loads(src.read_text(encoding="utf-8")).get("cells", [])
        return "\n\n".join("".join(c["source"]) for c in cells if c.get("cell_type") == "markdown")


def toc_pages() -> list[Page]:
    """Every document of ``_toc.yml`` (root, parts, chapters, sections, globs), in order."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names: list[str] = []

    def add(name: str) -> None:
        name = re.sub(r"\.(md|ipynb|rst)$", "", name.strip("/"))
        if name not in names:
            names.append(name)

    def walk(node) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if "file" in node:
                add(node["file"])
            if "glob" in node:
                for path in sorted(ROOT.glob(node["glob"])):
                    if path.suffix in SOURCE_SUFFIXES:
                        add(path.relative_to(ROOT).with_suffix("").as_posix())
            for key in ("parts", "chapters", "sections"):
                walk(node.get(key))

    add(toc["root"])
    walk(toc)
    return [Page(n) for n in names]


PAGES = toc_pages()


# ------------------------------------------------------------------------------------------
# CDN files from local npm packages


class NpmMirror:
    """Files of CDN URLs, served from ``npm pack`` tarballs unpacked under ``.cache/npm/``."""

    def __init__(self, cache: Path = NPM_CACHE) -> None:
        self.cache = cache

    @staticmethod
    def parse(url: str) -> tuple[str, str, str] | None:
        """``(npm name, version spec, path)`` for a CDN URL of an npm package, else None."""
        for pattern in CDN_NPM:
            m = pattern.match(url)
            if m:
                name = CDNJS_TO_NPM.get(m["name"], m["name"]) if "cdnjs" in url else m["name"]
                return name, m["spec"] or "latest", unquote(m["path"] or "/")
        return None

    def package(self, name: str, spec: str) -> Path:
        """The unpacked package ``name@spec``, fetched with ``npm pack`` when not cached."""
        target = self.cache / f"{name.replace('/', '+')}@{spec}"
        if (target / "package.json").exists():
            return target
        npm = shutil.which("npm")
        if npm is None:
            raise FileNotFoundError("npm is missing: it is needed once to fetch local copies of CDN files")
        self.cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            proc = subprocess.run([npm, "pack", f"{name}@{spec}", "--loglevel=error"], cwd=tmp,
                                  capture_output=True, text=True, timeout=300)
            tarballs = list(Path(tmp).glob("*.tgz"))
            if proc.returncode != 0 or len(tarballs) != 1:
                raise RuntimeError(f"npm pack {name}@{spec} failed:\n{proc.stdout}\n{proc.stderr}")
            unpacked = Path(tmp) / "unpacked"
            with tarfile.open(tarballs[0]) as tar:
                try:
                    tar.extractall(unpacked, filter="data")
                except TypeError:  # Python without extraction filters
                    tar.extractall(unpacked)
            (top,) = unpacked.iterdir()  # "package/" in nearly every tarball
            top.rename(target)
        return target

    def file(self, url: str) -> Path | None:
        """The local file for a CDN URL, or None when the URL is not an npm CDN URL."""
        parsed = self.parse(url)
        if parsed is None:
            return None
        name, spec, path = parsed
        pkg = self.package(name, spec)
        if path.strip("/") == "":
            meta = json.loads((pkg / "package.json").read_text(encoding="utf-8"))
            fields = ("jsdelivr", "unpkg", "browser", "main")
            entry = next((meta[k] for k in fields if isinstance(meta.get(k), str)), "index.js")
            path = "/" + entry
        candidate = pkg / path.lstrip("/")
        if not candidate.is_file() and candidate.name.endswith(".min.js"):  # CDNs minify on the fly
            candidate = candidate.with_name(candidate.name[: -len(".min.js")] + ".js")
        if candidate.is_file() and candidate.resolve().is_relative_to(pkg.resolve()):
            return candidate
        raise FileNotFoundError(f"{url}: no {path} in npm package {name}@{spec}")


def cdn_scripts(html_dir: Path) -> set[str]:
    """Every external script/stylesheet URL that the built pages name, in tags or in inline scripts.

    Inline scripts count when they name a versioned npm package (Altair's charts load
    ``https://cdn.jsdelivr.net/npm/vega@6?noext`` from JavaScript); unversioned names there are
    fallbacks that the pages never request.
    """
    urls: set[str] = set()
    for page in html_dir.rglob("*.html"):
        text = page.read_text(encoding="utf-8", errors="replace")
        tags = re.findall(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["'](https?://[^"']+)["']""", text)
        urls.update(u for u in tags if re.search(r"\.(js|css)(\?|$)", u))
        urls.update(INLINE_NPM.findall(text))
    return urls


def drop_sri_of_mirrored(html: str, mirror: NpmMirror) -> str:
    """Remove ``integrity=`` from script tags whose CDN file the mirror serves.

    The mirror serves the npm package's own file (e.g. RequireJS's ``require.js`` for cdnjs's
    ``require.min.js``), which is equivalent but not byte-identical to what the CDN serves.
    """
    def fix(m: re.Match) -> str:
        tag = m.group(0)
        src = re.search(r"""\bsrc=["']([^"']+)["']""", tag)
        if src and mirror.parse(src.group(1)):
            tag = re.sub(r"""\s+integrity=["'][^"']*["']""", "", tag)
        return tag

    return re.sub(r"<script\b[^>]*>", fix, html)


# ------------------------------------------------------------------------------------------
# Fixtures: build once, serve, browse every page once


def _jupyter_book() -> list[str]:
    exe = Path(sys.executable).with_name("jupyter-book")
    found = str(exe) if exe.exists() else shutil.which("jupyter-book")
    if not found:
        _unavailable("jupyter-book is not installed: pip install -e '.[book]'")
    return [found]


@pytest.fixture(scope="module")
def built_book() -> Path:
    """Build the whole book once; any warning or a non-zero exit fails every test here."""
    cmd = [*_jupyter_book(), "build", ".", "--all", "-W", "--keep-going"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    warned = [line for line in output.splitlines() if "WARNING" in line]
    if proc.returncode != 0 or warned:
        shown = "\n".join(warned[:40]) or output[-4000:]
        pytest.fail(f"`jupyter-book build . --all -W --keep-going` exited {proc.returncode} "
                    f"with {len(warned)} warning(s):\n{shown}")
    return HTML


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def site(built_book: Path):
    """``_build/html`` served on 127.0.0.1 at a free port; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(built_book)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Visit:
    """What the browser saw on one page at one width."""

    width: int = 0
    status: int | None = None
    mathjax: bool = False
    math_elements: int = 0
    mjx_containers: int = 0
    math_untypeset: list[str] = field(default_factory=list)
    math_errors: list[str] = field(default_factory=list)
    stray_dollars: list[str] = field(default_factory=list)
    raw_tex: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    proof_classes: list[str] = field(default_factory=list)
    widget_views: int = 0
    widgets_rendered: int = 0
    text: str = ""
    links: list[str] = field(default_factory=list)
    overflows: list[str] = field(default_factory=list)  # equations, code and outputs wider than the column
    narrow_asides: list[str] = field(default_factory=list)  # margin notes squeezed beside the text
    poor_captions: list[str] = field(default_factory=list)  # figure captions too faint or too small
    scroll_width: int = 0  # document.documentElement.scrollWidth: the page's width, the viewport's at most
    page_bytes: int = 0  # the page and every file it loaded, uncompressed
    figures: list[dict] = field(default_factory=list)  # every figure image: its alt, sizes and link
    loose_provenance: list[str] = field(default_factory=list)  # cache/provenance printouts outside the note
    bold_glue: list[str] = field(default_factory=list)  # glued numbers set bolder than the text around them
    problems: list[str] = field(default_factory=list)  # console/JS errors, blocked or missing requests, timeouts


# Runs in the page once MathJax and the widgets are done: all the checks need, in one call.
INSPECT_JS = r"""
async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.race([
    Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; }))),
    new Promise(r => setTimeout(r, 10000)),
  ]);
  const skip = new Set(['PRE', 'CODE', 'SCRIPT', 'STYLE', 'TEXTAREA', 'NOSCRIPT', 'MJX-CONTAINER']);
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const prose = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    let el = n.parentElement, code = false;
    for (; el && !code; el = el.parentElement) code = skip.has(el.tagName) || el.classList.contains('highlight');
    if (!code) prose.push(n.textContent);
  }
  const maths = Array.from(document.querySelectorAll('.math'));
  const views = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'));
  return {
    math_elements: maths.length,
    math_untypeset: maths.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.trim().slice(0, 80)),
    mjx_containers: document.querySelectorAll('mjx-container').length,
    // "$" glued to typeset math: a $-delimiter that the markdown parser did not pair
    stray_dollars: Array.from(document.querySelectorAll('mjx-container')).filter(c => {
      const m = c.parentElement.classList.contains('math') ? c.parentElement : c;
      const before = m.previousSibling, after = m.nextSibling;
      return (before && before.nodeType === 3 && before.textContent.endsWith('$'))
          || (after && after.nodeType === 3 && after.textContent.startsWith('$'));
    }).map(c => (c.closest('p, li, td, div') || c).textContent.trim().slice(0, 80)),
    math_errors: Array.from(document.querySelectorAll('mjx-merror'))
      .map(e => (e.getAttribute('data-mjx-error') || e.textContent).slice(0, 120))
      .concat(Array.from(document.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]'))  // unknown macros
        .filter(e => e.textContent.startsWith('\\')).map(e => `undefined control sequence ${e.textContent}`)),
    prose: prose.join(' '),
    text: document.body.innerText,
    broken_images: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src')),
    proof_classes: Array.from(document.querySelectorAll('div.proof')).map(d => d.className),
    widget_views: views.length,
    widgets_rendered: views.filter(v => {
      const area = v.previousElementSibling;
      return area && area.classList.contains('widget-subarea') && area.childElementCount > 0;
    }).length,
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    loose_provenance: Array.from(document.querySelectorAll('.cell_output .output.stream'))
      .filter(o => PROVENANCE_LINE.test(o.textContent) && !o.closest('details.provenance'))
      .map(o => o.textContent.trim().slice(0, 80)),
    bold_glue: Array.from(document.querySelectorAll('span.pasted-text'))
      .filter(g => getComputedStyle(g).fontWeight !== getComputedStyle(g.parentElement).fontWeight)
      .map(g => `${g.textContent} in: ${g.parentElement.textContent.trim().slice(0, 60)}`),
  };
}
""".replace("PROVENANCE_LINE", PROVENANCE_LINE)
WIDGETS_DONE_JS = """() => {
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  return views === 0 || document.querySelectorAll('.widget-subarea > *').length >= views;
}"""


CHARTS_DONE_JS = """() => Array.from(document.querySelectorAll('[id^="altair-viz"]'))
  .every(d => d.querySelector('svg, canvas') || d.querySelector('.error'))"""

# Runs after INSPECT_JS (and after the screenshot): opens every collapsed block (hidden inputs and
# outputs, dropdowns), then measures what does not fit the article column.
LAYOUT_JS = r"""
async (phone) => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const cs = getComputedStyle(article), box = article.getBoundingClientRect();
  const col = {left: box.left + parseFloat(cs.paddingLeft), right: box.right - parseFloat(cs.paddingRight)};
  const colWidth = Math.round(col.right - col.left);
  const snippet = el => el.textContent.replace(/\s+/g, ' ').trim().slice(0, 70);
  const tex = c => {
    try { return MathJax.startup.document.getMathItemsWithin(c)[0].math.replace(/\s+/g, ' ').trim().slice(0, 70); }
    catch (e) { return snippet(c); }
  };
  const visible = el => el.getClientRects().length > 0 && el.getBoundingClientRect().width > 0;
  const overflows = [];
  // On a phone, code, text output and tables may scroll sideways inside their own box (88-character
  // lines cannot fit 390 px); equations, figures, widgets and charts must fit.
  const mayScroll = el => phone && (el.matches('pre') || (!!el.querySelector('table')
                                    && !el.querySelector('.vega-embed, .widget-subarea, img')));
  const check = (el, what, text, inner) => {
    if (!visible(el)) return;
    const r = (inner || el).getBoundingClientRect();
    const hidden = mayScroll(el) ? 0 : el.scrollWidth - el.clientWidth;
    if (hidden > 1 || r.right > col.right + 1 || r.left < col.left - 1) {
      overflows.push(`${what} ${Math.round(Math.max(r.width, el.scrollWidth))} px wide in the ${colWidth} px column`
                     + `${hidden > 1 ? ` (${hidden} px scroll out of view)` : ''}: ${text}`);
    }
  };
  article.querySelectorAll('mjx-container[display="true"]').forEach(c => check(c, 'display equation', tex(c),
                                                                               c.querySelector('mjx-math')));
  const longest = p => Math.max(...p.textContent.split('\n').map(line => line.length));
  article.querySelectorAll('pre').forEach(p => check(p, p.closest('.cell_output') ? 'output' : 'code block',
                                                     `longest line ${longest(p)} characters: ${snippet(p)}`));
  article.querySelectorAll('.cell_output > .output').forEach(o => {
    if (!o.querySelector('pre')) check(o, 'output', snippet(o) || o.className);
  });
  article.querySelectorAll('table').forEach(t => {  // outputs' tables are checked as outputs
    if (!t.closest('pre, .cell_output')) check(t.parentElement, 'table', snippet(t));
  });
  const asides = phone ? Array.from(article.querySelectorAll(
      'aside.margin, aside.sidebar, div.margin, figure.margin, .cell.tag_margin, .cell.tag_popout'))
    .filter(a => visible(a) && a.getBoundingClientRect().width < ASIDE_MIN_SHARE * colWidth)
    .map(a => `${a.tagName.toLowerCase()}.${a.className.split(' ').join('.')} `
              + `${Math.round(a.getBoundingClientRect().width)} px wide in the ${colWidth} px column: `
              + snippet(a)) : [];
  // captions: contrast with their background (WCAG's formula) and text size
  const parse = c => {
    const v = (c.match(/[\d.]+/g) || []).map(Number);
    return {rgb: v.slice(0, 3), a: v.length > 3 ? v[3] : 1};
  };
  const lum = rgb => rgb.map(v => (v /= 255) <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4))
                        .reduce((sum, v, k) => sum + [0.2126, 0.7152, 0.0722][k] * v, 0);
  const background = el => {
    for (; el; el = el.parentElement) {
      const c = parse(getComputedStyle(el).backgroundColor);
      if (c.a > 0) return c.rgb;
    }
    return [255, 255, 255];
  };
  const captions = Array.from(article.querySelectorAll('figcaption, div.figure p.caption')).filter(visible).map(c => {
    const text = c.querySelector('.caption-text') || c, cs = getComputedStyle(text);
    const [hi, lo] = [lum(parse(cs.color).rgb), lum(background(text))].sort((a, b) => b - a);
    return {text: snippet(c), contrast: (hi + 0.05) / (lo + 0.05), px: parseFloat(cs.fontSize),
            weight: parseInt(cs.fontWeight, 10)};
  }).filter(c => c.contrast < CAPTION_MIN_CONTRAST || c.px < CAPTION_MIN_PX || c.weight < 400)
    .map(c => `contrast ${c.contrast.toFixed(1)}:1, ${c.px} px, weight ${c.weight}: ${c.text}`);
  // figures: what the reader sees of each image, and whether a tap opens it at full size
  const figures = Array.from(article.querySelectorAll('.cell_output img, figure img')).filter(visible).map(i => {
    const link = i.closest('a[href]');
    return {src: i.getAttribute('src'), alt: i.getAttribute('alt') || '', natural: i.naturalWidth,
            shown: i.getBoundingClientRect().width, linked: !!link && link.href === i.src};
  });
  return {overflows, narrow_asides: asides, poor_captions: captions, figures,
          scroll_width: document.documentElement.scrollWidth};
}
""".replace("ASIDE_MIN_SHARE", str(ASIDE_MIN_SHARE)).replace("CAPTION_MIN_CONTRAST", str(CAPTION_MIN_CONTRAST)) \
   .replace("CAPTION_MIN_PX", str(CAPTION_MIN_PX))


class BrowserSession:
    """Headless Chromium on the served book: every request outside the site is served from the npm
    mirror or aborted, and each page's console errors, JavaScript errors and failed requests are
    collected as problems."""

    def __init__(self, browser, site: str, mirror: NpmMirror) -> None:
        self.browser, self.site, self.mirror = browser, site, mirror

    def open(self, docname: str, width: int, problems: list[str], served: list[int] | None = None,
             touch: bool = False):
        """A new tab at ``width`` showing ``docname``; what goes wrong is appended to ``problems``.

        ``served`` gets the size of every response body (the page's weight is their sum); ``touch``
        makes the tab a touch screen (``tap()``). Returns ``(tab, response)``; close the tab's context
        when done.
        """
        context = self.browser.new_context(viewport={"width": width, "height": 900}, service_workers="block",
                                           has_touch=touch)
        context.route("**/*", lambda r: self._route(r, problems))
        tab = context.new_page()
        tab.on("pageerror", lambda exc: problems.append(f"JavaScript error: {exc}"))
        tab.on("console", lambda msg: problems.append(f"console error: {msg.text}") if msg.type == "error" else None)
        tab.on("response", lambda r: problems.append(f"HTTP {r.status} for {r.url}")
               if r.url.startswith(self.site) and r.status >= 400 else None)
        tab.on("requestfailed", lambda r: problems.append(f"request failed ({r.failure}): {r.url}")
               if r.url.startswith(self.site) else None)
        if served is not None:
            tab.on("response", lambda r: served.append(_body_size(r)))
        response = tab.goto(self.site + docname + ".html", wait_until="load", timeout=30_000)
        return tab, response

    def _route(self, r, problems: list[str]) -> None:
        url = r.request.url
        try:
            if url.startswith(self.site):
                if urlsplit(url).path.endswith(".html"):
                    response = r.fetch()
                    r.fulfill(response=response, body=drop_sri_of_mirrored(response.text(), self.mirror))
                else:
                    r.continue_()
                return
            local = self.mirror.file(url)
            if local is not None:
                r.fulfill(path=str(local), headers={"Access-Control-Allow-Origin": "*"})
                return
            problems.append(f"blocked a request that leaves the site ({r.request.resource_type}): {url}")
        except Exception as exc:  # a CDN file the mirror cannot provide
            problems.append(f"could not serve {url} offline: {exc}")
        r.abort()


def _body_size(response) -> int:
    """Bytes of a response's body, uncompressed (0 for a redirect or an aborted request)."""
    try:
        return len(response.body())
    except Exception:  # redirects and aborted requests have no body
        return 0


def wait_until_rendered(tab, visit: Visit) -> None:
    """Wait for MathJax's typesetting, the saved widgets and the Vega charts of the page."""
    if tab.query_selector("script[src*='mathjax']"):
        tab.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        tab.evaluate("() => MathJax.startup.promise.then(() => true)")
        visit.mathjax = True
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for done in (WIDGETS_DONE_JS, CHARTS_DONE_JS):
        with contextlib.suppress(PlaywrightTimeout):  # counted by the checks: undrawn widgets and charts
            tab.wait_for_function(done, timeout=20_000)


@pytest.fixture(scope="module")
def browser(site: str):
    """A :class:`BrowserSession` on the served book (CDN files fetched into the mirror first)."""
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does this)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is missing: pip install -e '.[test]'")

    mirror = NpmMirror()
    for url in sorted(cdn_scripts(HTML)):  # fetch what the pages load before the browser starts
        if mirror.parse(url):
            try:
                mirror.file(url)
            except FileNotFoundError as exc:
                if shutil.which("npm") is None:
                    _unavailable(str(exc))
                raise
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield BrowserSession(chromium, site, mirror)
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def visits(browser: BrowserSession) -> dict[tuple[str, int], Visit]:
    """Open every TOC page once at every width; one Visit per (docname, width)."""
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], Visit] = {}
    for width in WIDTHS:
        for p in PAGES:
            visit = results[(p.docname, width)] = Visit(width=width)
            tab, served = None, []
            try:
                tab, response = browser.open(p.docname, width, visit.problems, served)
                visit.status = response.status if response else None
                wait_until_rendered(tab, visit)
                seen = tab.evaluate(INSPECT_JS)
                visit.raw_tex = sorted({m.group(0)[:80] for m in RAW_TEX.finditer(seen.pop("prose"))})
                for key, value in seen.items():
                    setattr(visit, key, value)
                if SHOTS is not None:
                    shot = SHOTS / f"{p.docname.replace('/', '__')}-{width}.png"
                    try:
                        tab.screenshot(path=str(shot), full_page=True)
                    except Exception as exc:  # a screenshot is for humans: never a test failure
                        warnings.warn(f"no screenshot of {p.docname} at {width} px: {exc}")
                for key, value in tab.evaluate(LAYOUT_JS, width == PHONE).items():
                    setattr(visit, key, value)
                visit.page_bytes = sum(served)
            except Exception as exc:  # a timeout or a crash is a finding about this page
                visit.problems.append(f"{type(exc).__name__}: {exc}")
            finally:
                if tab is not None:
                    tab.context.close()
    return results


# ------------------------------------------------------------------------------------------
# Link checking against the files on disk


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value or "")


@functools.lru_cache(maxsize=None)
def ids_in(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def broken_internal_links(links: list[str], base: str) -> list[str]:
    """Links into the site whose file, or whose #anchor in that file, does not exist."""
    broken = []
    for href in sorted(set(links)):
        if not href.startswith(base):
            continue
        parts = urlsplit(href)
        rel = unquote(parts.path)[len(urlsplit(base).path):]
        target = HTML / rel / "index.html" if rel == "" or rel.endswith("/") else HTML / rel
        if not target.is_file():
            broken.append(f"{href} (no file {target.relative_to(HTML)})")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids_in(target):
            broken.append(f"{href} (no id {unquote(parts.fragment)!r} in {target.relative_to(HTML)})")
    return broken


# ------------------------------------------------------------------------------------------
# The tests


def test_toc_pages_have_sources():
    assert PAGES, "_toc.yml lists no pages"
    missing = [p.docname for p in PAGES if p.source is None]
    assert not missing, f"_toc.yml names pages with no source file: {missing}"


def test_book_builds_without_warnings(built_book: Path):
    missing = [str(p.html.relative_to(HTML)) for p in PAGES if not p.html.is_file()]
    assert not missing, f"the build produced no HTML for: {missing}"
    index = (HTML / "index.html").read_text(encoding="utf-8")
    assert f"url={PAGES[0].docname}.html" in index, "index.html should redirect to the TOC's root page"


def test_launch_buttons_open_the_configured_repository(built_book: Path):
    """Every chapter's Colab button, like its install cell, points at _config.yml's repository and branch."""
    import yaml

    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    slug, branch = repo["url"].removeprefix("https://github.com/"), repo.get("branch", "main")
    for page in PAGES:
        if page.source.suffix == ".ipynb":
            html = page.html.read_text(encoding="utf-8")
            colab = f"https://colab.research.google.com/github/{slug}/blob/{branch}/{page.docname}.ipynb"
            assert colab in html, f"{page.docname}: no Colab launch link {colab}"


def test_repository_file_links_follow_the_configured_repository():
    """``{repo}`benchmarks/...``` links (sphinx.ext.extlinks) open files of _config.yml's repository and branch."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = config["repository"]
    base = config["sphinx"]["config"]["extlinks"]["repo"][0]
    want = f"{repo['url']}/blob/{repo.get('branch', 'main')}/%s"
    assert base == want, f"_config.yml: sphinx.config.extlinks.repo is {base!r}; for `repository` it must be {want!r}"


def numbered_chapters() -> list[str]:
    """The documents of the ``numbered: true`` parts of ``_toc.yml``, in order: chapter 1, 2, ..."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [re.sub(r"\.(md|ipynb|rst)$", "", c["file"]) for part in toc.get("parts", []) if part.get("numbered")
            for c in part.get("chapters", []) if "file" in c]


def test_equations_and_figures_are_numbered_per_chapter(built_book: Path):
    """Chapter k numbers its equations (k.1), (k.2), ... and its figures, tables and theorem-like
    blocks k.1, k.2, ... (not one running count through the book)."""
    chapters = numbered_chapters()
    assert chapters, "_toc.yml numbers no part: give the chapters' part `numbered: true`"
    problems = []
    for k, docname in enumerate(chapters, start=1):
        html = (built_book / f"{docname}.html").read_text(encoding="utf-8")
        series = {"equation": re.findall(r'<span class="eqno">\(([^)<]*)\)', html)}
        for kind, number in re.findall(r'<span class="caption-number">(\w+\.?) ([^<\s]+?)\.? *</span>', html):
            series.setdefault(kind, []).append(number)
        for kind, numbers in series.items():
            want = [f"{k}.{j}" for j in range(1, len(numbers) + 1)]
            if numbers != want:
                problems.append(f"{docname} (chapter {k}): {kind} numbers {numbers}, expected {want}")
    assert not problems, "\n".join(problems)


def test_bibliography_is_author_year_and_links_back(built_book: Path):
    """Entries are labelled as the text cites them ("Ho et al., 2020", never "[6]"), every citation
    in the text shows its entry's label (or the label's year), and every entry links back to the
    places that cite it."""
    pages = {p.docname: p.html.read_text(encoding="utf-8") for p in PAGES}
    bib = next((name for name, html in pages.items() if 'class="citation-list"' in html), None)
    assert bib, "no page has a bibliography (a {bibliography} directive with cited works)"
    entries = re.findall(r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label">'
                         r'<span class="fn-bracket">\[</span>([^<]*)<(.*?)</div>', pages[bib], re.DOTALL)
    assert entries, f"{bib}.html lists no entries"
    problems = [f"label {label!r} is not author-year" for _, label, _ in entries
                if not re.fullmatch(r"\D+, (\d{4}[a-z]?|n\.d\.)", label)]
    problems += [f"{label}: no 'Cited in:' links back" for _, label, rest in entries
                 if not re.search(r'<p class="cited-in">Cited in: <a [^>]*href="[^"]*#', rest)]
    labels = {anchor: label for anchor, label, _ in entries}
    target = Path(bib).name + ".html#"
    for name, html in pages.items():
        for anchor, text in re.findall(rf'href="[^"]*{re.escape(target)}([^"]+)"[^>]*>(.*?)</a>', html):
            shown = re.sub(r"<[^>]+>", "", text)
            if anchor in labels and shown not in (labels[anchor], labels[anchor].rpartition(", ")[2]):
                problems.append(f"{name}: a citation shows {shown!r}, its entry is labelled {labels[anchor]!r}")
    assert not problems, "\n".join(problems)


def _notebook_with_widgets(tags: list[str]):
    """A notebook whose one cell displays widget "box" (with child "slider"); "orphan" is saved too."""
    import nbformat

    from scalelong_edu.widgets import WIDGET_STATE, WIDGET_VIEW

    cell = nbformat.v4.new_code_cell("box", metadata={"tags": tags}, outputs=[nbformat.v4.new_output(
        "display_data", data={WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0}})])
    state = {"box": {"state": {"children": ["IPY_MODEL_slider"]}}, "slider": {"state": {}}, "orphan": {"state": {}}}
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_prune_widget_state_keeps_what_a_shown_widget_needs_and_nothing_else():
    from scalelong_edu.widgets import WIDGET_STATE, prune_widget_state

    shown = _notebook_with_widgets([])
    assert prune_widget_state(shown) == 1
    assert set(shown.metadata["widgets"][WIDGET_STATE]["state"]) == {"box", "slider"}
    removed = _notebook_with_widgets(["remove-output"])
    assert prune_widget_state(removed) == 3 and "widgets" not in removed.metadata


@pytest.mark.parametrize("page", [p for p in PAGES if p.source and p.source.suffix == ".ipynb"],
                         ids=lambda p: p.docname)
def test_notebooks_save_only_the_widget_state_they_show(page: Page):
    """Saved widget state that no shown output needs makes myst-nb load RequireJS and the 4 MB widget
    manager for nothing (issue 20: chapters 2 and 6 weighed 9 MB)."""
    import nbformat

    from scalelong_edu.widgets import prune_widget_state

    unused = prune_widget_state(nbformat.read(page.source, as_version=4))
    assert unused == 0, (f"{page.source.name} saves {unused} widget model(s) that no shown output displays: "
                         "run scalelong_edu.widgets.prune_widget_state on it after executing")


HIDDEN_INPUT_TAGS = {"hide-input", "remove-input", "remove-cell"}


@pytest.mark.parametrize("page", [p for p in PAGES if p.source and p.source.suffix == ".ipynb"],
                         ids=lambda p: p.docname)
def test_bookkeeping_code_is_behind_show_code(page: Page):
    """Code that only builds a claims table or loads cached results sits behind "Show code cell source"
    (tag hide-input), as the install cell does: the reader reads the table, not its 40-line builder."""
    import nbformat

    cells = [c for c in nbformat.read(page.source, as_version=4).cells if c.cell_type == "code"]
    bookkeeping = [c for c in cells if "ledger.publish(" in c.source or c is cells[0]
                   or any("loaded from the cache" in o.get("text", "") for o in c.get("outputs", []))]
    shown = [c.source.splitlines()[0][:70] for c in bookkeeping
             if not HIDDEN_INPUT_TAGS & set(c.metadata.get("tags", []))]
    assert not shown, f"{page.source.name}: give these cells the tag hide-input: {shown}"


def test_every_bibliography_entry_can_be_followed():
    """Each entry of book/references.bib carries a DOI or a URL, so a reader can open the work."""
    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    entries = re.findall(r"^@\w+\{([^,]+),(.*?)^\}", bib, re.MULTILINE | re.DOTALL)
    assert entries, "book/references.bib has no entries"
    bare = [key for key, body in entries if not re.search(r"^\s*(doi|url)\s*=", body, re.MULTILINE)]
    assert not bare, f"book/references.bib: entries without a doi or url field: {bare}"


@pytest.mark.parametrize("page", PAGES, ids=[p.docname for p in PAGES])
def test_page_in_browser(page: Page, visits: dict[tuple[str, int], Visit], site: str):
    v = visits[(page.docname, max(WIDTHS))]
    problems = [f"{w} px: {p}" for w in WIDTHS for p in visits[(page.docname, w)].problems]
    if v.status != 200:
        problems.append(f"HTTP status {v.status}, expected 200")

    markdown = page.markdown()
    if SOURCE_MATH.search(markdown) or v.math_elements:
        if not v.mathjax:
            problems.append("the page has math but loads no MathJax")
        if v.mjx_containers == 0:
            problems.append("the page has math but MathJax typeset nothing (no mjx-container)")
        if v.math_untypeset:
            problems.append(f"math left untypeset: {v.math_untypeset[:5]}")
    if v.math_errors:
        problems.append(f"MathJax could not typeset (bad TeX): {v.math_errors[:5]}")
    if v.stray_dollars:
        problems.append(f"a '$' left next to typeset math (unpaired delimiters?): {v.stray_dollars[:5]}")
    if v.raw_tex:
        problems.append(f"raw TeX visible in the text: {v.raw_tex[:5]}")

    if v.broken_images:
        problems.append(f"images that did not load: {v.broken_images}")

    kinds = PRF_DIRECTIVE.findall(markdown)
    if len(v.proof_classes) < len(kinds):
        problems.append(f"{len(kinds)} {{prf:...}} block(s) in the source, {len(v.proof_classes)} div.proof rendered")
    for kind in sorted(set(kinds) - {"proof"}):  # {prf:proof} renders as a plain div.proof
        n, found = kinds.count(kind), sum(kind in c.split() for c in v.proof_classes)
        if found < n:
            problems.append(f"{n} {{prf:{kind}}} block(s) in the source, {found} rendered as div.proof.{kind}")

    if v.widgets_rendered < v.widget_views:
        problems.append(f"{v.widget_views - v.widgets_rendered} of {v.widget_views} widget(s) did not render "
                        "(no saved widget state? execute with store_widget_state=True)")
    if v.page_bytes > MAX_PAGE_BYTES:
        problems.append(f"the page weighs {v.page_bytes / 1e6:.2f} MB with what it loads, more than "
                        f"{MAX_PAGE_BYTES / 1e6:g} MB (widget manager or RequireJS for widgets nobody sees? "
                        "scalelong_edu.widgets.prune_widget_state)")
    problems += [f"printed bookkeeping outside the collapsed provenance note (book/_static/book.js): {p}"
                 for p in v.loose_provenance]
    problems += [f"a glued value is bolder than its text: {g}" for g in v.bold_glue]
    problems += [f"the page shows {bad!r}" for bad in BAD_TEXT if bad in v.text]
    problems += [f"broken link: {b}" for b in broken_internal_links(v.links, site)]

    assert not problems, f"{page.docname}.html:\n  " + "\n  ".join(problems)


def figure_text_px(figure: dict) -> float:
    """CSS px of the smallest text in a figure as shown: plotting.MIN_FONT_SIZE points at FIGURE_DPI,
    scaled by the shown width over the image's own."""
    from scalelong_edu.plotting import MIN_FONT_SIZE

    return MIN_FONT_SIZE / 72 * FIGURE_DPI * figure["shown"] / max(figure["natural"], 1)


def figure_faults(figure: dict) -> list[str]:
    """What keeps a reader from a figure: alt text that is empty or a file name; text under
    FIGURE_MIN_TEXT_PX with no link to the full-size image."""
    faults = []
    alt = figure["alt"].strip()
    if not alt or re.search(r"\.(png|jpe?g|svg|gif)$", alt) or "_images/" in alt:
        faults.append(f"alt text {alt!r} does not say what the figure shows (cell metadata mystnb.image.alt)")
    if figure_text_px(figure) < FIGURE_MIN_TEXT_PX and not figure["linked"]:
        faults.append(f"text about {figure_text_px(figure):.1f} px ({figure['natural']} px shrunk to "
                      f"{figure['shown']:.0f}) and no link to the full-size image (book/_static/book.js)")
    return faults


def test_figure_checks_catch_unreadable_figures():
    """The figure check itself: a 1287 px figure shrunk to 342 px needs a link; a path is no alt text."""
    wide = {"src": "a.png", "alt": "Figure: loss against N", "natural": 1287, "shown": 342.0, "linked": False}
    assert figure_text_px(wide) < FIGURE_MIN_TEXT_PX and figure_faults(wide)
    assert figure_faults({**wide, "linked": True}) == []
    assert figure_faults({**wide, "natural": 500}) == []
    assert figure_faults({**wide, "linked": True, "alt": "../_images/91c4.png"})


@pytest.mark.parametrize("width", WIDTHS, ids=[f"{w}px" for w in WIDTHS])
@pytest.mark.parametrize("page", PAGES, ids=[p.docname for p in PAGES])
def test_page_layout(page: Page, width: int, visits: dict[tuple[str, int], Visit]):
    """The reader conventions of the design, measured at a desktop and a phone width: no display
    equation, code block, output or table wider than the article column; on a phone no margin note
    or sidebar squeezed beside the text; figure captions as legible as the text (contrast, size, weight)."""
    v = visits[(page.docname, width)]
    problems = [f"too wide: {o}" for o in v.overflows]
    if v.scroll_width > width:
        problems.append(f"the page is {v.scroll_width} px wide in a {width} px window (long inline code?)")
    problems += [f"figure {f['src']}: {why}" for f in v.figures for why in figure_faults(f)]
    problems += [f"margin note narrower than {ASIDE_MIN_SHARE:.0%} of the column: {a}" for a in v.narrow_asides]
    problems += [f"caption below {CAPTION_MIN_CONTRAST:g}:1 contrast, {CAPTION_MIN_PX:g} px or weight 400: {c}"
                 for c in v.poor_captions]
    assert not problems, f"{page.docname}.html at {width} px:\n  " + "\n  ".join(problems)


NAVIGATION_PAGE = "book/03_hidden_features"
TOGGLES = {  # the theme's toggle buttons and the drawer (a <dialog>) each should open on a phone
    "site navigation (☰)": (".primary-toggle", "#pst-primary-sidebar-modal"),
    "contents of the page": (".secondary-toggle", "#pst-secondary-sidebar-modal"),
}


@pytest.mark.parametrize("toggle", TOGGLES, ids=["primary", "secondary"])
def test_phone_toggles_open_the_drawer_and_its_links_navigate(browser: BrowserSession, toggle: str):
    """At 390 px a tap on each visible sidebar toggle opens its drawer, and a link in it navigates
    (pydata-sphinx-theme 0.17 wires only the hidden first toggle: book/_static/book.js forwards the taps)."""
    button, drawer = TOGGLES[toggle]
    problems: list[str] = []
    tab, _ = browser.open(NAVIGATION_PAGE, PHONE, problems, touch=True)
    try:
        visible = tab.locator(f"{button}:visible")
        assert visible.count() >= 1, f"{NAVIGATION_PAGE}.html at {PHONE} px shows no {button} button"
        visible.first.tap()
        opened = tab.evaluate(f"() => !!document.querySelector('{drawer}')?.open")
        assert opened, f"tapping {toggle} ({button}) at {PHONE} px did not open the drawer {drawer}"
        link = tab.locator(f"{drawer} a[href]:visible").last
        href = link.evaluate("a => a.href")
        link.tap()
        tab.wait_for_url(href, timeout=10_000)
    finally:
        tab.context.close()
    assert not problems, "\n".join(problems)


# Reads the explorer's state: its controls and the "Σκᵢ² = ..." line of its SVG
EXPLORER_STATE_JS = r"""() => {
  const chart = document.querySelector('.vega-embed');
  if (!chart) return null;
  const value = name => { const c = chart.querySelector(`[name="${name}"]`); return c ? c.value : null; };
  const verdict = Array.from(chart.querySelectorAll('svg text')).map(t => t.textContent)
    .find(t => t.startsWith('Σκᵢ² =')) || null;
  return {method: value('method'), kappa: value('kappa'), N: value('N'), verdict,
          bars: chart.querySelectorAll('path[aria-roledescription="bar"]').length,
          svg: chart.querySelector('svg').outerHTML};
}"""
SET_CONTROL_JS = """([name, value]) => {
  const c = document.querySelector(`.vega-embed [name="${name}"]`);
  c.value = String(value);
  c.dispatchEvent(new Event(c.tagName === 'SELECT' ? 'change' : 'input', {bubbles: true}));
}"""


def expected_sum(method: str, kappa: float, n: int) -> float:
    """``sum_i kappa_i^2`` over the skip paths, as the package computes it."""
    from scalelong_edu.scaling import path_factors
    from scalelong_edu.theory import sum_kappa_squared

    return sum_kappa_squared(path_factors(method, kappa, n)[:n])


def shown_sum(state: dict) -> float | None:
    """The number in the explorer's line "Σκᵢ² = 1.333, inside the band [1.22, 5]", if any."""
    m = re.match(r"Σκᵢ² = ([-+.e\d]+)", state.get("verdict") or "")
    return float(m.group(1)) if m else None


def test_kappa_explorer_in_browser(browser: BrowserSession):
    """Chapter 2's Vega-Lite kappa explorer recomputes in the page when its controls move."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    problems: list[str] = []
    tab, _ = browser.open(EXPLORER_PAGE, PHONE, problems)
    try:
        wait_until_rendered(tab, Visit())
        state = tab.evaluate(EXPLORER_STATE_JS)
        assert state is not None, (f"{EXPLORER_PAGE}.html has no Vega-Lite kappa explorer; chapter 2 needs a cell\n"
                                   f"{EXPLORER_CELL}")
        start = (state["method"], float(state["kappa"]), int(state["N"]))
        assert shown_sum(state) is not None and abs(shown_sum(state) - expected_sum(*start)) <= 1e-3 * max(
            expected_sum(*start), 1.0), f"at {start} the explorer shows {state['verdict']!r}"
        steps = [("N", 3), ("kappa", 0.8), ("method", "sqrt2-cs"), ("method", "block-output"), ("N", 9)]
        for name, value in steps:
            before = state
            tab.evaluate(SET_CONTROL_JS, [name, value])
            controls = {"method": before["method"], "kappa": float(before["kappa"]), "N": int(before["N"])}
            controls[name] = value
            method, kappa, n = controls["method"], float(controls["kappa"]), int(controls["N"])
            want = expected_sum(method, kappa, n)
            shows = (f"s && s.bars === {n + 1} && !!s.verdict "
                     f"&& Math.abs(parseFloat(s.verdict.split('=')[1]) - {want}) <= 1e-3 * {max(want, 1.0)}")
            with contextlib.suppress(PlaywrightTimeout):  # the assertion below says what the chart shows instead
                tab.wait_for_function(f"() => {{ const s = ({EXPLORER_STATE_JS})(); return {shows}; }}", timeout=10_000)
            state = tab.evaluate(EXPLORER_STATE_JS)
            shown = shown_sum(state)
            assert state["bars"] == n + 1 and shown is not None and abs(shown - want) <= 1e-3 * max(want, 1.0), (
                f"after setting {name} = {value} ({method}, κ = {kappa:g}, N = {n}) the explorer shows "
                f"{state['bars']} bars and {state['verdict']!r}; expected {n + 1} bars and Σκᵢ² = {want:.4g}")
            assert state["svg"] != before["svg"], f"setting {name} = {value} did not change the chart"
    finally:
        tab.context.close()
    assert not problems, "\n".join(problems)
