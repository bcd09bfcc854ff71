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
import json
import re
from pathlib import Path

from scalelong_edu.cost import BUDGET_MINUTES, T4_TFLOPS, t4_minutes
from scalelong_edu.experiments import BACKBONES, EXPERIMENTS, get_experiment, work
from scalelong_edu.gpu_scale import SECTIONS
from scalelong_edu.profiles import PROFILES

BOOK = Path(__file__).resolve().parents[1] / "book"
LOADERS = re.compile(r"\b(run_experiment|finished_so_far|landed)\(")


def chapter_experiments(chapter: int) -> tuple[str, ...]:
    """The experiments chapter ``chapter``'s text loads, read from its notebook: every string literal
    that names an experiment in a code cell that calls a loader (``run_experiment``,
    ``finished_so_far``, ``evidence.landed``), an f-string's placeholder filled with each backbone
    (``f"main-{b}"``). Chapter 1 trains its long UNet in a cell instead: one ``live-ddpm`` run."""
    [path] = BOOK.glob(f"{chapter:02d}_*.ipynb")
    names = []
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or not LOADERS.search(source):
            continue
        for literal in re.findall(r'"([^"\n]+)"', source):
            names += [name for name in dict.fromkeys(re.sub(r"\{\w+\}", b, literal) for b in BACKBONES)
                      if name in EXPERIMENTS]
    return tuple(dict.fromkeys(names)) or (("live-ddpm",) if chapter == 1 else ())


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
        names = chapter_experiments(chapter)
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
