"""The built book, checked in a real browser.

A module fixture builds the book once, exactly as CI and ``make book`` do
(``jupyter-book build . --all -W --keep-going``; a non-zero exit or any ``WARNING`` fails),
serves ``_build/html`` on 127.0.0.1 and opens every page of ``_toc.yml`` in Debian's headless
Chromium through Playwright. Each page must load, typeset its math with MathJax, load its
images, render its theorem/definition blocks and its saved widgets, show no traceback or
broken-widget text, throw no JavaScript error, and link only to files and anchors that exist.
A full-page screenshot of each page is saved in ``_build/screenshots/`` for a human to look at.

The test is hermetic. The pages load MathJax (and, on pages with widgets, RequireJS and the
Jupyter widget manager) from public CDNs; the browser gets those files from local copies of
the same npm packages instead (``npm pack``, cached in ``.cache/npm/``), and every other
request that leaves 127.0.0.1 is aborted and reported as a failure.

Without ``/usr/bin/chromium``, ``npm`` or the ``playwright`` package the browser tests are
skipped, unless the environment variable ``CI`` is set: then they fail, because CI must run
them (``.ci/run`` installs Chromium).
"""

from __future__ import annotations

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
SHOTS = ROOT / "_build" / "screenshots"
NPM_CACHE = ROOT / ".cache" / "npm"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
BAD_TEXT = ("Traceback (most recent call last)", "Failed to display Jupyter Widget", "Error displaying widget")
# Known upstream faults that every Jupyter Book 1.x site shows, tolerated so that the checks
# stay strict about everything else:
# * Sphinx 7.4 emits sphinx-thebe's inline config script twice (a script added after the
#   builder starts is registered once as None and once as ""), so the second
#   `const THEBE_JS_URL` throws; the first copy defines everything.
# * ipywidgets 8's widget manager (html-manager 1.0.x, which myst-nb loads) typesets widget
#   labels with the MathJax 2 API (`MathJax.Hub.Queue`); the book's MathJax is version 3, so
#   that call throws after the widget has rendered (only the label's TeX stays raw).
# * Under RequireJS the same manager asks for its icon fonts relative to the page
#   (`<page dir>/@jupyter-widgets/html-manager/dist/*.woff2`), where they never exist;
#   only widget icons are affected.
KNOWN_JS_ERRORS = (
    "Identifier 'THEBE_JS_URL' has already been declared",
    "Cannot read properties of undefined (reading 'Queue')",
)
KNOWN_MISSING = re.compile(r"/@jupyter-widgets/html-manager/dist/[^/]+\.(woff2?|ttf|eot|svg)$")
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
               r"(?P<name>(?:@[^/@]+/)?[^/@]+)(?:@(?P<spec>[^/]+))?(?P<path>/[^?#]*)?"),
    re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/(?P<name>[^/]+)/(?P<spec>[^/]+)(?P<path>/[^?#]*)"),
)
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
    """Every external script/stylesheet URL that the built pages name."""
    urls: set[str] = set()
    for page in html_dir.rglob("*.html"):
        text = page.read_text(encoding="utf-8", errors="replace")
        urls.update(re.findall(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["'](https?://[^"']+)["']""", text))
    return {u for u in urls if re.search(r"\.(js|css)(\?|$)", u)}


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
    """What the browser saw on one page."""

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
    problems: list[str] = field(default_factory=list)  # JS errors, blocked or missing requests, timeouts


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
  };
}
"""
WIDGETS_DONE_JS = """() => {
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  return views === 0 || document.querySelectorAll('.widget-subarea > *').length >= views;
}"""


@pytest.fixture(scope="module")
def visits(site: str) -> dict[str, Visit]:
    """Open every TOC page once in headless Chromium; one Visit per docname."""
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

    SHOTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Visit] = {}
    current: list[Visit] = []

    def problem(text: str) -> None:
        if current:
            current[-1].problems.append(text)

    def route(r) -> None:
        url = r.request.url
        try:
            if url.startswith(site):
                if urlsplit(url).path.endswith(".html"):
                    response = r.fetch()
                    r.fulfill(response=response, body=drop_sri_of_mirrored(response.text(), mirror))
                else:
                    r.continue_()
                return
            local = mirror.file(url)
            if local is not None:
                r.fulfill(path=str(local), headers={"Access-Control-Allow-Origin": "*"})
                return
            problem(f"blocked a request that leaves the site ({r.request.resource_type}): {url}")
        except Exception as exc:  # a CDN file the mirror cannot provide
            problem(f"could not serve {url} offline: {exc}")
        r.abort()

    def on_response(response) -> None:
        if response.url.startswith(site) and response.status >= 400 and not KNOWN_MISSING.search(response.url):
            problem(f"HTTP {response.status} for {response.url}")

    def on_error(exc) -> None:
        if str(exc) not in KNOWN_JS_ERRORS:
            problem(f"JavaScript error: {exc}")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
            context.route("**/*", route)
            page = context.new_page()
            page.on("pageerror", on_error)
            page.on("response", on_response)
            for p in PAGES:
                visit = results[p.docname] = Visit()
                current.append(visit)
                try:
                    response = page.goto(site + p.docname + ".html", wait_until="load", timeout=30_000)
                    visit.status = response.status if response else None
                    if page.query_selector("script[src*='mathjax']"):
                        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                               timeout=30_000)
                        page.evaluate("() => MathJax.startup.promise.then(() => true)")
                        visit.mathjax = True
                    try:
                        page.wait_for_function(WIDGETS_DONE_JS, timeout=20_000)
                    except Exception:
                        pass  # counted below: views without a rendered widget
                    seen = page.evaluate(INSPECT_JS)
                    visit.raw_tex = sorted({m.group(0)[:80] for m in RAW_TEX.finditer(seen.pop("prose"))})
                    for key, value in seen.items():
                        setattr(visit, key, value)
                except Exception as exc:  # a timeout or a crash is a finding about this page
                    visit.problems.append(f"{type(exc).__name__}: {exc}")
                try:
                    page.screenshot(path=str(SHOTS / (p.docname.replace("/", "__") + ".png")), full_page=True)
                except Exception as exc:  # a screenshot is for humans: never a test failure
                    warnings.warn(f"no screenshot of {p.docname}: {exc}")
        finally:
            browser.close()
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


@pytest.mark.parametrize("page", PAGES, ids=[p.docname for p in PAGES])
def test_page_in_browser(page: Page, visits: dict[str, Visit], site: str):
    v = visits[page.docname]
    problems = list(v.problems)
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
    problems += [f"the page shows {bad!r}" for bad in BAD_TEXT if bad in v.text]
    problems += [f"broken link: {b}" for b in broken_internal_links(v.links, site)]

    assert not problems, f"{page.docname}.html:\n  " + "\n  ".join(problems)
