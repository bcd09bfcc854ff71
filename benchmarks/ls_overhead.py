"""Step-time overhead of learnable scaling: ``t(ls) / t(none)`` and ``t(ls-per-skip) / t(none)``.

For the UNet and U-ViT preset of each chosen profile (by default ``cpu`` and ``gpu``: ``unet-s``,
``uvit-s``, ``unet-m``, ``uvit-m``) this times one training step of the model without skip scaling
and with shared and per-skip LS, with the machinery of ``step_time.py``: the three models are
built from one seed, warmed up and timed round-robin, each ratio is formed within a round, and
the median over rounds is printed with its interquartile range.

``--clock cpu`` times by the process's CPU time instead of the wall clock: on a shared CPU the
wall clock also counts the time other processes hold the core, which scatters the ratios by
several percent; the CPU time of a one-thread step does not (CUDA steps need the wall clock).

Run: ``python benchmarks/ls_overhead.py [--profile cpu gpu] [--batch B] [--repeats R]
[--warmup W] [--threads T] [--device cpu|cuda] [--clock wall|cpu]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from scalelong_edu.diffusion import linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.profiles import PROFILES
from step_time import (
    SEED,
    Contestant,
    choose_threads,
    image_shape,
    machine_info,
    make_contestant,
    ratio_cell,
    run_rounds,
    summary,
)

METHODS = ("none", "ls", "ls-per-skip")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", nargs="+", choices=list(PROFILES), default=["cpu", "gpu"],
                        help="profiles whose presets to time (default: cpu gpu)")
    parser.add_argument("--batch", type=int, help="override every profile's batch size (e.g. 8 for gpu on a CPU)")
    parser.add_argument("--repeats", type=int, default=20, help="timing rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model (default 2)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: as step_time.py)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall", help="wall clock or process CPU time")
    args = parser.parse_args()
    for name in ("batch", "repeats", "warmup", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.clock == "cpu" and torch.device(args.device).type != "cpu":
        parser.error("--clock cpu times CPU work only; use the wall clock on a GPU")
    return args


def time_preset(
    preset: str, chans: int, size: int, batch: int, args: argparse.Namespace
) -> tuple[list[Contestant], int]:
    """The three models of ``preset`` (one per method of :data:`METHODS`) after their timing rounds,
    and the steps per timing sample."""
    device = torch.device(args.device)
    contestants = []
    for method in METHODS:
        torch.manual_seed(SEED)
        contestants.append(make_contestant(method, build_model(preset, chans, size, method), device))
    torch.manual_seed(SEED)
    x0 = torch.rand(batch, chans, size, size, device=device) * 2 - 1
    steps = run_rounds(contestants, x0, linear_schedule(), args.repeats, args.warmup, CLOCKS[args.clock])
    return contestants, steps


def main() -> None:
    """Print the machine, then one table row per preset."""
    args = parse_args()
    torch.set_num_threads(choose_threads(args.threads))
    print("# Learnable-scaling step-time overhead\n")
    print(machine_info(torch.device(args.device), torch.get_num_threads()))
    print(f"clock: {args.clock}; {args.repeats} rounds; ratios: median over rounds of per-round ratios "
          "(interquartile range in brackets)\n")
    print("| preset | images | batch | steps/sample | ms/step none | t(ls) / t(none) | t(ls-per-skip) / t(none) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.profile:
        profile = PROFILES[name]
        chans, size = image_shape(profile)
        batch = args.batch or profile.batch_size
        for preset in (profile.unet, profile.uvit):
            (none, ls, per_skip), steps = time_preset(preset, chans, size, batch, args)
            print(f"| {preset} | {chans}x{size}x{size} | {batch} | {steps} | {1000 * summary(none.seconds)[0]:.4g} | "
                  f"{ratio_cell(ls, none)} | {ratio_cell(per_skip, none)} |", flush=True)


if __name__ == "__main__":
    main()
