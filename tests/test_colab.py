"""What a reader on Colab meets first: the install cell, the widget manager, ipywidgets 7, a wheel.

None of this needs Colab itself: a stand-in ``google.colab`` module, an IPython shell with a
recording ``%pip`` magic, Colab's own ipywidgets release installed beside ours, and a fresh
virtual environment that gets the package only from a built wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import nbformat
import pytest
import yaml

from scalelong_edu import book, notebooks

ROOT = Path(__file__).resolve().parents[1]
COLAB_IPYWIDGETS = "7.7.1"  # what Colab has shipped for years; pip must not replace it
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPOSITORY = f"git+{CONFIG['repository']['url']}@{CONFIG['repository'].get('branch', 'main')}"
CLONE = CONFIG["repository"]["url"].rstrip("/").rsplit("/", 1)[-1]  # the folder the install cell clones into


def stand_in_colab(monkeypatch, **output_functions) -> types.ModuleType:
    """Install a fake ``google.colab`` whose ``output`` module has the given functions."""
    google, colab, output = (types.ModuleType(n) for n in ("google", "google.colab", "google.colab.output"))
    for name, fn in output_functions.items():
        setattr(output, name, fn)
    google.colab, colab.output = colab, output
    for module in (google, colab, output):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return output


def test_setup_on_colab_enables_the_custom_widget_manager(monkeypatch, capsys):
    calls = []
    stand_in_colab(monkeypatch, enable_custom_widget_manager=lambda: calls.append("enabled"))
    monkeypatch.setenv("SCALELONG_DEVICE", "cpu")
    book.setup()
    assert calls == ["enabled"] and book.COLAB_GPU_HINT in capsys.readouterr().out


def test_setup_on_an_older_colab_without_the_function_still_works(monkeypatch):
    stand_in_colab(monkeypatch)
    assert book.enable_colab_widgets() is False
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.setitem(sys.modules, "google.colab", None)  # `from google.colab import ...` fails
    assert book.enable_colab_widgets() is False


def test_the_requirements_leave_colabs_ipywidgets_alone():
    """Colab ships ipywidgets 7; a requirement of >= 8 would upgrade it in the middle of a session."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    line = next(x for x in pyproject.splitlines() if x.strip().startswith('"ipywidgets'))
    spec = line.split('"')[1]
    from packaging.specifiers import SpecifierSet

    assert COLAB_IPYWIDGETS in SpecifierSet(spec.removeprefix("ipywidgets")), spec


def test_the_widgets_work_with_colabs_ipywidgets_release(tmp_path):
    target = tmp_path / "ipywidgets7"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         f"ipywidgets=={COLAB_IPYWIDGETS}", "ipython_genutils"],
        capture_output=True, text=True, timeout=300,
    )
    if install.returncode and not os.environ.get("CI"):
        pytest.skip(f"cannot install ipywidgets {COLAB_IPYWIDGETS} here: {install.stderr[-300:]}")
    assert install.returncode == 0, install.stderr
    script = textwrap.dedent(f"""
        import ipywidgets
        assert ipywidgets.__version__ == "{COLAB_IPYWIDGETS}", ipywidgets.__version__
        from scalelong_edu.widgets import kappa_explorer
        explorer = kappa_explorer("cs", kappa=0.5, n_skips=6)
        explorer.kappa_control.value = 0.8
        explorer.n_control.value = 8
        explorer.method_control.value = "sqrt2-cs"
        assert explorer.redraws == 4, explorer.redraws
        assert "= 4," in explorer.status.value, explorer.status.value  # 8 skips of 1/2 each
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr


RUN_CELL = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
commands = []
shell.register_magic_function(lambda line: commands.append("%pip " + line), "line", "pip")
shell.system = lambda command: commands.append("!" + shell.var_expand(command))
if sys.argv[2] == "missing":
    sys.modules["scalelong_edu"] = None  # as on a fresh Colab runtime: the import fails
shell.run_cell(open(sys.argv[1]).read())
print(json.dumps(commands))
"""


@pytest.mark.parametrize("package", ["present", "missing"])
def test_the_install_cell_clones_the_configured_repository_only_when_needed(tmp_path, package):
    cell = tmp_path / "cell.py"
    cell.write_text(notebooks.install_cell())
    run = subprocess.run([sys.executable, "-c", RUN_CELL, str(cell), package], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "SCALELONG_PROFILE": "ci"})
    commands = json.loads(run.stdout.strip().splitlines()[-1])
    if package == "present":
        assert commands == [] and "profile: ci" in run.stdout
    else:
        url, branch = CONFIG["repository"]["url"], CONFIG["repository"].get("branch", "main")
        assert commands == [f"!test -d {CLONE} || git clone -q --depth 1 -b {branch} {url} {CLONE}",
                            f"%pip install --quiet -e {CLONE}"]


def test_every_chapter_and_the_readme_name_the_configured_repository():
    for path in notebooks.chapters():
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert first.source == notebooks.install_cell(), path.name
        assert CONFIG["repository"]["url"] in first.source
    assert f'pip install "scalelong-edu @ {REPOSITORY}"' in (ROOT / "README.md").read_text()
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


CLONE_CHECK = """
import sys
from pathlib import Path
import nbformat
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
chapters = [[c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"][:3]
            for path in sys.argv[1:]]
assert shell.run_cell(chapters[0][0]).success  # the install cell: clone, install, import

import scalelong_edu
from scalelong_edu import data, experiments

clone = Path.cwd() / "{clone}"
assert Path(scalelong_edu.__file__).is_relative_to(clone), scalelong_edu.__file__
assert (data.data_root() / "results" / "ddpm-unet-cpu.pt").is_file(), "the committed results are not in the clone"


def no_training(run, experiment, *args, **kwargs):
    raise AssertionError(f"{{experiment.name}} is not in the clone's {{experiments.results_dir()}} at the ci profile: "
                         "the first cells would train live; commit its ci result")


experiments.train_run = no_training  # this test checks the install, not how fast this machine trains
for path, cells in zip(sys.argv[1:], chapters):
    for source in cells:
        result = shell.run_cell(source)
        assert result.success, (path, source[:80], result.error_in_exec)
print("chapters ran from", scalelong_edu.__file__)
""".format(clone=CLONE)


def test_the_install_cell_clones_installs_and_runs_the_first_cells_of_every_chapter(tmp_path):
    """What a reader on a fresh Colab runtime gets: in a new virtual environment without the
    package, the first chapter's install cell clones the repository (this checkout's last commit,
    in place of GitHub), installs it with ``%pip`` and imports it, with the committed
    results beside it; then the first cells of every chapter run.

    Only the dependencies come from this environment (torch & co.: nothing is downloaded but pip's
    build backend). The cells load their experiments from the clone's committed results and never
    train, so the check takes the same time however busy the machine is.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    # the dependencies come from this environment; its editable scalelong_edu does not, because
    # .pth files inside a folder that a .pth line adds are not processed
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    (venv_site / "dependencies.pth").write_text(f"{site}\n")
    # the ledger reads the executed chapters beside it, which is no first cell's business here
    chapters = [str(p) for p in notebooks.chapters() if p.stem != "ledger"]
    # the repository the cell clones: this checkout's commit as the configured branch, in place of GitHub
    origin, branch = tmp_path / "origin.git", CONFIG["repository"].get("branch", "main")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(origin)], check=True, timeout=300)
    subprocess.run(["git", "-C", str(origin), "update-ref", f"refs/heads/{branch}", head.stdout.strip()], check=True)
    env = {**os.environ, "SCALELONG_PROFILE": "ci", "PIP_NO_DEPS": "1", "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": f"url.file://{origin}.insteadOf", "GIT_CONFIG_VALUE_0": CONFIG["repository"]["url"]}
    for name in ("PYTHONPATH", "SCALELONG_RESULTS", "SCALELONG_DATA"):
        env.pop(name, None)
    run = subprocess.run([str(venv / "bin" / "python"), "-c", CLONE_CHECK, *chapters], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert str(tmp_path / CLONE) in run.stdout
