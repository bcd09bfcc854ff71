"""Estimate how long the `gpu` profile takes on a Colab T4, from counted FLOPs.

No T4 is at hand, so the estimate is arithmetic: count the floating-point operations of one
training step (forward, loss, backward; PyTorch's ``FlopCounterMode``, a multiply-add = 2 FLOPs)
of each profile's presets at the profile's batch, and divide by an effective T4 throughput.
The T4 peaks at 65 TFLOP/s in fp16 on tensor cores; small-batch transformer and conv training
under autocast typically reaches a quarter of that, so the default is 16 TFLOP/s
(``--tflops`` to change it). A chapter is taken to be four runs of ``profile.steps`` steps.

Run: ``python benchmarks/t4_estimate.py [--profile gpu] [--tflops 16]``.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode

from scalelong_edu.data import dataset_info
from scalelong_edu.diffusion import eps_loss, linear_schedule
from scalelong_edu.models import build_model, count_parameters
from scalelong_edu.profiles import PROFILES, Profile

RUNS_PER_CHAPTER = 4


def step_flops(preset: str, profile: Profile) -> tuple[int, int]:
    """(FLOPs of one training step at the profile's batch, parameter count)."""
    channels = dataset_info(profile.dataset).channels
    model = build_model(preset, channels, profile.image_size)
    x0 = torch.rand(profile.batch_size, channels, profile.image_size, profile.image_size) * 2 - 1
    with FlopCounterMode(display=False) as counter:
        eps_loss(model, x0, linear_schedule()).backward()
    return counter.get_total_flops(), count_parameters(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=list(PROFILES), default="gpu")
    parser.add_argument("--tflops", type=float, default=16.0, help="effective T4 TFLOP/s (default 16)")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    print(f"profile {profile.name}: {profile.dataset} at {profile.image_size} px, batch {profile.batch_size}, "
          f"{profile.steps} steps; T4 at {args.tflops:g} effective TFLOP/s\n")
    print("| preset | params | TFLOP/step | est. s/step | est. min/run | est. min/chapter (4 runs) |")
    print("|---|---|---|---|---|---|")
    for preset in (profile.unet, profile.uvit):
        flops, params = step_flops(preset, profile)
        seconds = flops / (args.tflops * 1e12)
        run_min = seconds * profile.steps / 60
        print(f"| {preset} | {params:,} | {flops / 1e12:.3f} | {seconds:.3f} | {run_min:.1f} | "
              f"{RUNS_PER_CHAPTER * run_min:.1f} |")


if __name__ == "__main__":
    main()
