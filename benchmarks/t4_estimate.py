"""Estimate what each chapter trains at the `gpu` profile on a Colab T4, from counted FLOPs.

No T4 is at hand, so the estimate is arithmetic (:mod:`scalelong_edu.cost`): the FLOPs of every
run of an experiment (training steps, probes, samples for the Frechet distances and the end grid,
end probes), counted on PyTorch's ``meta`` device, over an effective T4 throughput (default 16
TFLOP/s, a quarter of its fp16 tensor-core peak; ``--tflops`` to change it). For every chapter it
prints the minutes of its "at GPU scale" section (what a GPU trains by default, cold) and of
"everything" (every experiment the chapter's text uses, retrained at the `gpu` profile with
``SCALELONG_TRAIN=all``; runs shared between experiments counted once).

Run: ``python benchmarks/t4_estimate.py [--tflops 16]``.
"""

from __future__ import annotations

import argparse

from scalelong_edu.cost import BUDGET_MINUTES, T4_TFLOPS, t4_minutes
from scalelong_edu.experiments import BACKBONES, REGIMES, get_experiment, work
from scalelong_edu.gpu_scale import SECTIONS
from scalelong_edu.profiles import PROFILES

COMPARISON = tuple(f"{b}-{r}" for b in BACKBONES for r in REGIMES)
CHAPTER_EXPERIMENTS: dict[int, tuple[str, ...]] = {
    1: (),
    2: (),
    3: ("uvit-lr-sweep", "unet-lr-sweep", *COMPARISON, "main-uvit"),
    4: COMPARISON,
    5: COMPARISON,
    6: ("scaling-uvit", "scaling-unet", *COMPARISON, "kappa-uvit-stress"),
    7: ("scaling-uvit", "scaling-unet", "uvit-lr-sweep", "stability-map", "depth-unet"),
    8: ("depth-uvit", "depth-unet", "kappa-grid", "block-output", "stability-map"),
}
"""The experiments each chapter's text loads (chapter 1 trains its long UNet in a cell: one
``long_steps`` run, the size of ``live-ddpm``; chapter 2 trains nothing)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tflops", type=float, default=T4_TFLOPS, help=f"effective T4 TFLOP/s (default {T4_TFLOPS:g})")
    args = parser.parse_args()
    gpu = PROFILES["gpu"]
    print(f"profile gpu: {gpu.dataset} at {gpu.image_size} px, batch {gpu.batch_size}, {gpu.steps} steps a run; "
          f"T4 at {args.tflops:g} effective TFLOP/s; budget of a live section {BUDGET_MINUTES:g} min\n")
    print("| chapter | at GPU scale (live) | T4 min | everything | T4 min |")
    print("|---|---|---|---|---|")
    for chapter, name in SECTIONS.items():
        live = work(get_experiment(name), gpu)
        names = CHAPTER_EXPERIMENTS[chapter] or (("live-ddpm",) if chapter == 1 else ())
        runs = {}
        for other in names:
            experiment = get_experiment(other)
            for run, cost in zip(experiment.plan(gpu), work(experiment, gpu).runs):
                runs.setdefault(experiment.run_key(run, gpu), cost)
        everything = sum(cost.flops for cost in runs.values()) / (args.tflops * 1e12) / 60
        count = f"{len(runs)} run{'s' * (len(runs) != 1)}"
        print(f"| {chapter} | {name}: {live} | {t4_minutes(live, args.tflops):.1f} | {count} "
              f"({', '.join(names) or 'none'}) | {everything:.0f} |")


if __name__ == "__main__":
    main()
