"""The benchmark scripts that produce results (the others only print figures)."""

import importlib.util
from functools import partial
from pathlib import Path

from scalelong_edu import experiments as ex
from scalelong_edu import probes as pr
from scalelong_edu.experiments import load_result

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_evidence_trains_the_main_comparison_and_sets_its_verdicts_beside_the_cpu_runs(tmp_path, capsys,
                                                                                          monkeypatch,
                                                                                          untimed_estimate):
    # one power iteration instead of ten (the Lipschitz probe's accuracy is tested in test_probes.py), and the
    # ci profile's own dataset, parsed already (mnist5k's first load takes seconds)
    monkeypatch.setattr(ex, "lipschitz", partial(pr.lipschitz, iters=1))
    monkeypatch.delenv("SCALELONG_RESULTS", raising=False)  # the committed cpu runs, set beside
    gpu_evidence = _script("gpu_evidence")
    table = gpu_evidence.main(["--base", "ci", "--dataset", "digits8x8", "--steps", "2", "--workers", "1",
                               "--device", "cpu", "--out", str(tmp_path)])
    [path] = tmp_path.glob("main-uvit-ci-*.json.gz")
    result = load_result(path, "main-uvit")
    assert result.spec["profile"]["steps"] == 2 and result.spec["profile"]["dataset"] == "digits8x8"
    assert len(result.runs) == 8 and all(r["fd"]["fcd"] for r in result.runs)  # ci's 2 seeds x 4 methods
    methods = ["1/sqrt(2)-CS", "CS (kappa=0.5)", "LS"]
    assert list(table.index) == [(e, m) for m in methods for e in ("breakdowns", *gpu_evidence.ENDPOINTS)]
    assert table.verdict.isin(["reproduced", "contradicted", "absent", "undecided", "-"]).all()
    assert "verdict (cpu runs)" in table.columns  # the committed cpu runs, read before --out took over
    assert table["measured (cpu runs)"].str.contains(r"n = \d+|\d+/\d+|broke down").all()
    out = capsys.readouterr().out
    assert "8 runs in" in out and "feature_range" in out


def test_gpu_evidence_sizes_the_gpu_comparison_by_its_options():
    profile = _script("gpu_evidence").evidence_profile("gpu", steps=400, seeds=3)
    plan = ex.work(ex.get_experiment("main-uvit"), profile)
    assert len(plan.runs) == 12 and {r.steps for r in plan.runs} == {400}  # 3 seeds x 4 methods
    assert (profile.uvit, profile.image_size, profile.sample_steps) == ("uvit-m", 32, 50)


def test_t4_estimate_reads_each_chapters_experiments_from_its_notebook():
    chapters = _script("t4_estimate").chapter_experiments
    assert chapters(4) == ("main-uvit", "main-unet", "unet-confirm", "unet-flips-confirm", "uvit-confirm",
                           "unet-fcd-confirm")  # f"main-{b}"
    assert chapters(2) == ("unet-gentle",)  # "block-output" there is a method, in a cell that loads nothing
    assert {"depth-trained", "kappa-trained", "block-output-trained", "block-output"} <= set(chapters(8))
    assert chapters(1) == ("live-ddpm",)
