"""The committed notebooks: executed by the current code, error-free, free of local paths."""

import json
import re

import nbformat
import pytest

from scalelong_edu import notebooks

CHAPTERS = notebooks.chapters()


def test_the_toc_lists_the_chapters():
    assert [p.name for p in CHAPTERS][:2] == ["01_ddpm_objective.ipynb", "02_unets_and_long_skips.ipynb"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_outputs_are_fresh(path):
    problems = notebooks.staleness(path)
    assert not problems, f"{path.name} is stale: {'; '.join(problems)}. Run `make execute` and commit the result."


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_outputs_have_no_errors_or_local_paths(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code if c.source.strip()), "every code cell has its committed output"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not re.search(r"/(work|tmp|root|home)/[\w.-]+/", json.dumps(nb)), "outputs leak a local path"


def test_staleness_detects_changed_code_and_modules(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(notebooks.install_cell()), nbformat.v4.new_code_cell("x = 1")]
    nb.metadata[notebooks.META_KEY] = notebooks.fingerprint(nb, [notebooks.ROOT / "scalelong_edu/scaling.py"])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert notebooks.staleness(path) == []

    nb.cells[1].source = "x = 2"
    nbformat.write(nb, path)
    assert notebooks.staleness(path) == ["its code cells changed after it was executed"]

    nb.cells[1].source = "x = 1"
    nb.metadata[notebooks.META_KEY]["modules"]["scalelong_edu/scaling.py"] = "0" * 16
    nb.cells[0].source = nb.cells[0].source.replace("-b main", "-b old-branch")
    nbformat.write(nb, path)
    assert notebooks.staleness(path) == [
        "its first code cell differs from the install cell built from _config.yml",
        "its code cells changed after it was executed",
        "scalelong_edu/scaling.py changed after it was executed",
    ]
    del nb.metadata[notebooks.META_KEY]
    nbformat.write(nb, path)
    assert "never executed" in notebooks.staleness(path)[0]
