"""Training-step time of the book's models, per profile and skip-scaling method.

For each profile's UNet and U-ViT preset this times one full training step (the
epsilon-prediction loss, backward, AdamW step, zero_grad) and prints a table:

* ms/step and images/s at the profile's batch size;
* the overhead of every scaling method relative to ``none``, as the median over rounds of the
  ratio ``t(method) / t(none)``;
* with ``--official PATH`` (a checkout of github.com/sail-sg/ScaleLong), the official ``UViT``
  at the same configuration, its parameter count next to ours, and ``t(ours) / t(official)``.

This machine may be busy, so absolute times are noisy. Ratios are therefore measured within
one run: every model of a table is built up front, warmed up, and then timed round-robin, one
sample of each per round (the starting model rotates), and each ratio is taken within a round
before the median over rounds. The batch is synthetic (uniform noise in [-1, 1]): a step's
cost does not depend on the pixel values.

Run: ``python benchmarks/step_time.py [--profile ci|cpu|gpu|all] [--official PATH]
[--repeats R] [--threads T] [--device cpu|cuda] [--batch B] [--warmup W]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from scalelong_edu.data import list_datasets
from scalelong_edu.diffusion import DiscreteSchedule, eps_loss, linear_schedule
from scalelong_edu.models import PRESETS, UViT, build_model, count_parameters
from scalelong_edu.profiles import PROFILES, Profile
from scalelong_edu.scaling import METHODS, Calibration

SEED = 0
KAPPA = 0.5  # the official default; a step's cost does not depend on it
MIN_SAMPLE_SECONDS = 0.1  # one timing sample runs enough steps to last at least this long
OFFICIAL_SCALELONG = {"none": 0, "sqrt2-cs": 1, "cs": 2, "ls": 3, "ls-per-skip": 4}  # its `scalelong` switch
CPU_SKIPPED_PROFILES = ("gpu",)  # sized for a GPU: skipped on a CPU unless asked for by name


@dataclass
class Contestant:
    """One model with its optimizer, and its timing samples (seconds per step, one per round)."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    seconds: list[float] = field(default_factory=list)


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=[*PROFILES, "all"], default="all", help="profile to time (default all)")
    parser.add_argument("--official", type=Path, help="checkout of github.com/sail-sg/ScaleLong (has libs/uvit.py)")
    parser.add_argument("--repeats", type=int, default=20, help="timing rounds per model (default 20)")
    parser.add_argument(
        "--threads", type=int, help="torch CPU threads (default: torch's default, capped at the idle cores)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--batch", type=int, help="override every profile's batch size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model before timing (default 2)")
    args = parser.parse_args()
    for name in ("repeats", "threads", "batch", "warmup"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device {args.device!r}: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch build sees no CUDA GPU; use --device cpu")
    return args


def idle_cores() -> int | None:
    """CPUs minus the 1-minute load average (at least 1), or None where the load is unknown."""
    if not hasattr(os, "getloadavg"):
        return None
    return max(1, (os.cpu_count() or 1) - round(os.getloadavg()[0]))


def choose_threads(requested: int | None) -> int:
    """``requested``, else torch's default capped at the idle cores; warns when above them.

    On a shared machine, more threads than idle cores make every step wait for preempted
    threads, and step times then vary many-fold.
    """
    idle, default = idle_cores(), torch.get_num_threads()
    threads = requested or (min(default, idle) if idle else default)
    if idle is not None and threads > idle:
        print(f"Warning: {threads} threads but about {idle} idle core(s); timings will be erratic. "
              f"Try --threads {idle}.")
    return threads


def machine_info(device: torch.device, threads: int) -> str:
    """Torch version, device, threads and load: what the numbers below depend on."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.exists():
            lines = cpuinfo.read_text().splitlines()
            models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
            name = models[0] if models else name
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"torch {torch.__version__} | python {platform.python_version()} | device {device} ({name}) | "
        f"torch threads {threads} of {os.cpu_count()} CPUs | load average {load}"
    )


def load_official(path: Path) -> type[nn.Module]:
    """The official ``UViT`` class, imported from ``path/libs/uvit.py`` (its print-outs muted)."""
    if not (path / "libs" / "uvit.py").is_file():
        sys.exit(f"--official {path}: no libs/uvit.py there; pass a checkout of github.com/sail-sg/ScaleLong")
    sys.path.insert(0, str(path.resolve()))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            module = importlib.import_module("libs.uvit")
    except ModuleNotFoundError as err:
        if err.name == "einops":
            sys.exit(
                "the official code needs einops, which the project does not depend on; install it outside the "
                "project, e.g. `pip install --target /tmp/einops einops`, and run with PYTHONPATH=/tmp/einops"
            )
        raise
    return module.UViT


def image_shape(profile: Profile) -> tuple[int, int]:
    """(channels, side) of the profile's images."""
    channels = {info.name: info.channels for info in list_datasets()}
    return channels[profile.dataset], profile.image_size


def make_contestant(name: str, model: nn.Module, device: torch.device) -> Contestant:
    """Move ``model`` to ``device`` and pair it with the official training recipe's AdamW."""
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.03, betas=(0.99, 0.999))
    return Contestant(name, model, optimizer)


def build_contestants(
    preset: str, chans: int, size: int, device: torch.device, official: type[nn.Module] | None
) -> list[Contestant]:
    """Our model for every method, then the official U-ViT for every method it has (U-ViT presets only).

    Every model is built from the same seed, so the methods start from the same weights.
    """
    contestants = []
    for method in METHODS:
        torch.manual_seed(SEED)
        contestants.append(make_contestant(method, build_model(preset, chans, size, method, KAPPA), device))
    if official is not None and PRESETS[preset][0] is UViT:
        config = dict(PRESETS[preset][1], img_size=size, in_chans=chans, kappa=KAPPA)
        for method, switch in OFFICIAL_SCALELONG.items():
            torch.manual_seed(SEED)
            with contextlib.redirect_stdout(io.StringIO()):
                model = official(**config, scalelong=switch)
            contestants.append(make_contestant(f"official {method}", model, device))
    return contestants


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_steps(
    c: Contestant, x0: Tensor, schedule: DiscreteSchedule, steps: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds per training step by ``clock`` (wall clock by default), averaged over ``steps`` consecutive steps."""
    synchronize(x0.device)
    start = clock()
    for _ in range(steps):
        loss = eps_loss(c.model, x0, schedule)
        loss.backward()
        c.optimizer.step()
        c.optimizer.zero_grad(set_to_none=True)
    synchronize(x0.device)
    return (clock() - start) / steps


def run_rounds(
    contestants: list[Contestant],
    x0: Tensor,
    schedule: DiscreteSchedule,
    repeats: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Warm every model up, then take ``repeats`` rounds of one sample each; returns steps per sample.

    A sample runs as many steps as make the reference (first) model's warmed-up step last
    :data:`MIN_SAMPLE_SECONDS`. Round ``r`` starts at model ``r mod n``, so no model is always
    timed first (right after another model's memory traffic) or last. ``clock`` times the samples.
    """
    reference_step = [time_steps(contestants[0], x0, schedule, 1, clock) for _ in range(warmup)][-1]
    for c in contestants[1:]:
        time_steps(c, x0, schedule, warmup, clock)
    steps = max(1, math.ceil(MIN_SAMPLE_SECONDS / reference_step))
    n = len(contestants)
    for r in range(repeats):
        for c in contestants[r % n :] + contestants[: r % n]:
            c.seconds.append(time_steps(c, x0, schedule, steps, clock))
    return steps


def summary(values: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float(med), float(q1), float(q3)


def ratio_cell(numerator: Contestant, denominator: Contestant) -> str:
    """Median over rounds of the per-round time ratio, with its interquartile range."""
    med, q1, q3 = summary([a / b for a, b in zip(numerator.seconds, denominator.seconds)])
    return f"{med:.3f} ({q1:.3f}-{q3:.3f})"


def time_cells(c: Contestant, batch: int) -> list[str]:
    """Median ms/step and the images/s it implies."""
    seconds = summary(c.seconds)[0]
    rate = batch / seconds
    return [f"{1000 * seconds:.4g}", f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"]


def backbone_parameters(model: nn.Module) -> int:
    """Parameters outside the LS calibration networks (ours: ``model.scaling``; official: ``model.se``)."""
    extra = getattr(model, "scaling", None) or getattr(model, "se", None)
    return count_parameters(model) - (count_parameters(extra) if extra is not None else 0)


def table(contestants: list[Contestant], batch: int) -> tuple[str, bool]:
    """The markdown table of one preset, and whether every official parameter count matched ours."""
    by_name = {c.name: c for c in contestants}
    has_official = "official none" in by_name
    header = ["method", "params", "ms/step", "images/s", "t / t(none)"]
    if has_official:
        header += ["official params", "params match", "official ms/step", "t(ours) / t(official)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    all_match = True
    for method in METHODS:
        ours = by_name[method]
        params = count_parameters(ours.model)
        row = [method, f"{params:,}", *time_cells(ours, batch), ratio_cell(ours, by_name["none"])]
        theirs = by_name.get(f"official {method}")
        if theirs is not None:
            official_params = count_parameters(theirs.model)
            backbone_match = backbone_parameters(ours.model) == backbone_parameters(theirs.model)
            all_match &= backbone_match
            if official_params == params:
                verdict = "yes"
            elif backbone_match:  # our LS networks keep >= Calibration.MIN_HIDDEN units on narrow skips
                verdict = f"backbone yes; LS hidden >= {Calibration.MIN_HIDDEN}"
            else:
                verdict = "NO"
            row += [f"{official_params:,}", verdict, time_cells(theirs, batch)[0], ratio_cell(ours, theirs)]
        elif has_official:
            row += ["-", "-", "-", "- (no official counterpart)"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), all_match


def bench_preset(
    profile: Profile, preset: str, args: argparse.Namespace, official: type[nn.Module] | None
) -> bool:
    """Time one preset of one profile and print its table; returns whether parameter counts matched."""
    device = torch.device(args.device)
    chans, size = image_shape(profile)
    batch = args.batch or profile.batch_size
    contestants = build_contestants(preset, chans, size, device, official)
    print(f"timing {profile.name}/{preset}: {len(contestants)} models x {args.repeats} rounds ...",
          file=sys.stderr, flush=True)
    torch.manual_seed(SEED)
    x0 = torch.rand(batch, chans, size, size, device=device) * 2 - 1
    started = time.perf_counter()
    steps = run_rounds(contestants, x0, linear_schedule(), args.repeats, args.warmup)
    text, matched = table(contestants, batch)
    print(f"\n## profile `{profile.name}`: {preset}, images {chans}x{size}x{size}, batch {batch}")
    print(f"{args.repeats} rounds x {steps} step(s) per sample, {time.perf_counter() - started:.0f} s\n")
    print(text, flush=True)
    return matched


def selected_profiles(args: argparse.Namespace) -> list[Profile]:
    """The profiles to time; on a CPU, ``all`` leaves out the GPU-sized ones (with a note)."""
    if args.profile != "all":
        return [PROFILES[args.profile]]
    skipped = [name for name in CPU_SKIPPED_PROFILES if torch.device(args.device).type == "cpu"]
    for name in skipped:
        p = PROFILES[name]
        print(f"\nNote: profile `{name}` skipped on a CPU: {p.uvit} at batch {p.batch_size} takes minutes a step here. "
              f"Time it on a GPU, or force it: --profile {name} --batch 4 --repeats 3 --warmup 1.")
    return [p for name, p in PROFILES.items() if name not in skipped]


def main() -> None:
    """Parse the command line, print the machine, then one table per profile and preset."""
    args = parse_args()
    official = load_official(args.official) if args.official else None
    started = time.perf_counter()
    print("# ScaleLong training-step benchmark\n")
    torch.set_num_threads(choose_threads(args.threads))
    print(machine_info(torch.device(args.device), torch.get_num_threads()))
    print("step = eps_loss (linear schedule) + backward + AdamW step + zero_grad, float32, synthetic batch; "
          "ratios: median over rounds of per-round ratios (interquartile range in brackets)")
    if official is not None:
        print(f"official code: {args.official.resolve()} (libs/uvit.py)")
    all_match = True
    for profile in selected_profiles(args):
        for preset in (profile.unet, profile.uvit):
            all_match &= bench_preset(profile, preset, args, official)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if not all_match:
        sys.exit("parameter counts differ from the official model: see 'params match' above")


if __name__ == "__main__":
    main()
