"""Where a CPU training run spends its time, and what makes a sweep of runs faster.

Three measurements, each printed as ratios formed within one run of this script, for the
``cpu`` profile's presets (``uvit-s``, ``unet-s``) at the profile's batch size:

1. **Cores.** Training steps per second of the whole machine when it runs one process with all
   cores as torch threads, against as many one-thread processes side by side, each training its
   own run (the way ``python -m scalelong_edu run`` is launched for a sweep). Small models do
   not keep several threads busy, so independent one-thread runs get more done.
2. **Overheads of a run.** The time of one optimisation step, of the fixed-batch probes
   (every ``eval_every`` steps), of Adam's statistics and of one Frechet-distance evaluation
   (``FD_SAMPLES`` DDIM samples), and their share of a sweep run and of a full run.
3. **The optimizer.** AdamW's per-parameter loop (PyTorch's CPU default, which the Trainer uses)
   against its ``foreach`` and ``fused`` implementations: time per step, and whether the weights
   after 20 steps are bitwise identical to the loop's (a speed-up that changes the results
   would change every cached experiment).

Run: ``python benchmarks/cpu_throughput.py [--steps S] [--processes P]``.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import time

import torch

from scalelong_edu.data import load_dataset
from scalelong_edu.diffusion import ddim_sample, linear_schedule
from scalelong_edu.experiments import FD_SAMPLES, SWEEP, fixed_batch
from scalelong_edu.models import build_model
from scalelong_edu.probes import adam_stats, probe_fixed_batch
from scalelong_edu.profiles import get_profile
from scalelong_edu.train import TrainConfig, Trainer

PROFILE = get_profile("cpu")
PRESETS = (PROFILE.uvit, PROFILE.unet)


def make_trainer(preset: str, threads: int) -> Trainer:
    """A Trainer of ``preset`` with CS on the profile's data, warmed up by two steps."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    images = load_dataset(PROFILE.dataset, "train", image_size=PROFILE.image_size).tensors()[0]
    model = build_model(preset, images.shape[1], PROFILE.image_size, "cs", 0.5)
    config = TrainConfig(steps=10**6, batch_size=PROFILE.batch_size, lr=2e-4, warmup=10)
    trainer = Trainer(model, images, linear_schedule(), config, progress=False)
    for _ in range(2):
        trainer.train_step()
    return trainer


def steps_per_second(preset: str, threads: int, steps: int) -> float:
    trainer = make_trainer(preset, threads)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    return steps / (time.perf_counter() - start)


def _worker(args: tuple[str, int]) -> float:
    return steps_per_second(args[0], 1, args[1])


def cores(steps: int, processes: int) -> None:
    print(f"\n1. Cores: machine-wide training steps/s, {processes} threads in one process vs "
          f"{processes} one-thread processes ({steps} steps each)")
    context = mp.get_context("spawn")
    for preset in PRESETS:
        one = steps_per_second(preset, processes, steps)
        with context.Pool(processes) as pool:
            many = sum(pool.map(_worker, [(preset, steps)] * processes))
        print(f"  {preset:8s} one process {one:6.2f}/s   {processes} processes {many:6.2f}/s   "
              f"ratio {many / one:.2f}")


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def overheads(steps: int) -> None:
    sweep_steps = round(PROFILE.steps * SWEEP["step_fraction"])
    print(f"\n2. Overheads of one run (1 thread): share of the run's time, for a sweep run "
          f"({sweep_steps} steps) and a full run ({PROFILE.steps} steps), probes every {PROFILE.eval_every}")
    schedule = linear_schedule()
    batch = fixed_batch(PROFILE, schedule)
    for preset in PRESETS:
        trainer = make_trainer(preset, 1)
        step = timed(trainer.train_step, steps)
        probe = timed(lambda: probe_fixed_batch(trainer.model, batch, schedule, 0), 3)
        adam = timed(lambda: adam_stats(trainer.optimizer, trainer.model, 0), 3)
        shape = (FD_SAMPLES, *trainer.images.shape[1:])
        fd = timed(lambda: ddim_sample(trainer.ema, schedule, shape, steps=PROFILE.sample_steps), 1)
        print(f"  {preset:8s} step {step * 1e3:5.0f} ms | probes {probe * 1e3:4.0f} ms, adam stats "
              f"{adam * 1e3:3.0f} ms, one FCD's sampling {fd:4.1f} s")
        for name, n in (("sweep run", sweep_steps), ("full run", PROFILE.steps)):
            total = n * step + (n // PROFILE.eval_every) * (probe + adam) + fd
            print(f"    {name:9s}: steps {n * step / total:5.1%}, probes "
                  f"{n // PROFILE.eval_every * probe / total:5.1%}, adam stats "
                  f"{n // PROFILE.eval_every * adam / total:5.1%}, one FCD {fd / total:5.1%}")


def optimizers(steps: int) -> None:
    print("\n3. AdamW implementations (1 thread): ms per optimizer step, ratio to the loop, "
          "weights after 20 steps identical to the loop's?")
    torch.set_num_threads(1)
    variants = {"loop (default)": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
    for preset in PRESETS:
        torch.manual_seed(0)
        model = build_model(preset, 1, PROFILE.image_size, "cs", 0.5)
        times, weights = {}, {}
        for name, kwargs in variants.items():
            copy_ = copy.deepcopy(model)
            opt = torch.optim.AdamW(copy_.parameters(), lr=2e-3, weight_decay=0.03, betas=(0.99, 0.999), **kwargs)
            gen = torch.Generator().manual_seed(1)
            grads = [[torch.randn(p.shape, generator=gen) for p in copy_.parameters()] for _ in range(20)]
            spent = []
            for i in range(20 + steps):
                for p, g in zip(copy_.parameters(), grads[i % 20]):
                    p.grad = g
                start = time.perf_counter()
                opt.step()
                spent.append(time.perf_counter() - start)
                if i == 19:
                    weights[name] = [p.detach().clone() for p in copy_.parameters()]
            times[name] = sorted(spent[20:])[steps // 2]
        base = times["loop (default)"]
        for name in variants:
            same = all(torch.equal(a, b) for a, b in zip(weights[name], weights["loop (default)"]))
            print(f"  {preset:8s} {name:15s} {times[name] * 1e3:5.2f} ms  x{times[name] / base:.2f}  "
                  f"{'identical' if same else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per measurement (default 30)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2,
                        help="cores to compare one process with (default: all)")
    args = parser.parse_args()
    if args.steps < 3 or args.processes < 2:
        parser.error("need --steps >= 3 and --processes >= 2")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, profile cpu ({PROFILE.dataset}, batch "
          f"{PROFILE.batch_size})")
    cores(args.steps, args.processes)
    overheads(args.steps)
    optimizers(args.steps)


if __name__ == "__main__":
    main()
