"""Keep the committed notebooks honest: execute them in place, and detect stale outputs.

The book is built from committed outputs (``execute_notebooks: off``), so those outputs must be
what the current code produces. ``python -m scalelong_edu.notebooks execute`` runs every chapter
with the ``cpu`` profile (storing widget state) and stamps its metadata with a fingerprint:

* the hash of the notebook's code cells, and
* the hash of every ``scalelong_edu`` module the kernel had imported by the end.

``check`` (and the test suite) recomputes both: a changed code cell or a changed module that the
notebook depends on makes it stale. The first code cell, which installs the package on Colab, is
also rewritten from the repository URL and branch in ``_config.yml``, the one place they live.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
META_KEY = "scalelong"
EXECUTION_PROFILE = "cpu"

INSTALL_CELL = """\
# Runs anywhere. Where the helper package is missing (as on Colab), it clones the book:
# the package, and the committed results (data/results) that the text rests on.
try:
    import scalelong_edu
except ImportError:
    import os, sys
    book = "{url}"
    !test -d {name} || git clone -q --depth 1 -b {branch} $book {name}
    %pip install --quiet -e {name}
    sys.path.insert(0, os.path.abspath("{name}"))  # the kernel predates it
from scalelong_edu.book import setup

env = setup()"""

_REPORT_MODULES = """\
import json as _json, sys as _sys
print(_json.dumps(sorted({m.__file__ for n, m in list(_sys.modules.items())
                         if n.split(".")[0] == "scalelong_edu" and getattr(m, "__file__", None)})))"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def install_cell() -> str:
    """The first code cell of every chapter, with the repository from ``_config.yml``."""
    import yaml

    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    url = repo["url"].removesuffix("/")
    return INSTALL_CELL.format(url=url, branch=repo.get("branch", "main"), name=url.rsplit("/", 1)[-1])


def chapters() -> list[Path]:
    """The notebooks listed in ``_toc.yml``, in order."""
    import yaml

    files: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def code_hash(nb) -> str:
    """Hash of the notebook's code cells' sources."""
    return _sha(json.dumps([c.source for c in nb.cells if c.cell_type == "code"]).encode())


def fingerprint(nb, module_files: list[str]) -> dict[str, Any]:
    """What the notebook's outputs depend on: its code and the package modules it imported."""
    modules = {}
    for f in module_files:
        rel = Path(f).resolve().relative_to(ROOT).as_posix()
        modules[rel] = _sha(Path(f).read_bytes())
    return {"profile": EXECUTION_PROFILE, "code": code_hash(nb), "modules": modules}


def staleness(path: Path) -> list[str]:
    """Why the committed outputs of ``path`` may not be what the current code produces ([] = fresh)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    stamp = nb.metadata.get(META_KEY)
    if not stamp:
        return ["it was never executed by `make execute` (no fingerprint in its metadata)"]
    problems = []
    first = next((c for c in nb.cells if c.cell_type == "code"), None)
    if first is None or first.source != install_cell():
        problems.append("its first code cell differs from the install cell built from _config.yml")
    if stamp.get("profile") != EXECUTION_PROFILE:
        problems.append(f"it was executed with profile {stamp.get('profile')!r}, not {EXECUTION_PROFILE!r}")
    if stamp.get("code") != code_hash(nb):
        problems.append("its code cells changed after it was executed")
    for rel, digest in stamp.get("modules", {}).items():
        file = ROOT / rel
        if not file.exists():
            problems.append(f"{rel} no longer exists")
        elif _sha(file.read_bytes()) != digest:
            problems.append(f"{rel} changed after it was executed")
    return problems


def execute(path: Path, timeout: int = 1800) -> float:
    """Run ``path`` top to bottom in place with the ``cpu`` profile; returns the seconds taken."""
    import nbformat
    from nbclient import NotebookClient

    from scalelong_edu.widgets import prune_widget_state

    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.source = install_cell()
    probe = nbformat.v4.new_code_cell(_REPORT_MODULES)
    nb.cells.append(probe)
    os.environ["SCALELONG_PROFILE"] = EXECUTION_PROFILE
    os.environ.setdefault("TQDM_DISABLE", "1")
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nb.cells.pop()
    prune_widget_state(nb)  # only the state of widgets a page shows: the widget manager is 4 MB
    module_files = json.loads(probe.outputs[0]["text"])
    nb.metadata[META_KEY] = {**fingerprint(nb, module_files), "seconds": round(seconds, 1)}
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelong_edu.notebooks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["execute", "check"])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or chapters()
    status = 0
    for path in paths:
        if args.command == "execute":
            print(f"{path.relative_to(ROOT)}: executed in {execute(path):.0f} s", flush=True)
        else:
            problems = staleness(path)
            status |= bool(problems)
            print(f"{path.relative_to(ROOT)}: " + ("; ".join(problems) if problems else "fresh"))
    return status


if __name__ == "__main__":
    sys.exit(main())
