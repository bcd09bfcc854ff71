"""Command line: ``python -m scalelong_edu list | run NAME [NAME ...] [--profile P] | profiles``."""

from __future__ import annotations

import argparse
import math
import sys

from .cost import TRAIN_VAR
from .experiments import EXPERIMENTS, cache_status, run_experiment
from .profiles import ENV_VAR, PROFILES, get_profile
from .train import init_distributed

DESCRIPTION = f"""\
Run the book's experiments ahead of time, so chapters load their results instead of training.

Every chapter's heavy runs are named experiments. `run` trains all runs of one experiment at
the sizes of a profile and caches the result under data/results/ (or $SCALELONG_RESULTS),
keyed by a hash of the full spec: a notebook whose experiment and profile match loads it in
a second. The profile is --profile, else ${ENV_VAR}, else `cpu` (`gpu` on a GPU when
{TRAIN_VAR}=all). It prints what it will train and how long that should take before it starts;
unlike a notebook cell, it has no time budget:
  ci   tiny, for the tests (seconds)
  cpu  small real runs on a laptop (minutes)
  gpu  CIFAR-10 sizes for a GPU (tens of minutes)

examples:
  python -m scalelong_edu list
  python -m scalelong_edu run uvit-gentle --profile cpu
  python -m scalelong_edu run depth-uvit --profile cpu --workers 2
  python -m scalelong_edu run main-unet depth-trained kappa-trained --profile cpu --workers 2
  torchrun --standalone --nproc_per_node 2 -m scalelong_edu run uvit-gentle --profile gpu
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalelong_edu", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traceback", action="store_true", help="on an error, show the full traceback")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="list the experiments and whether a cached result exists")
    listing.add_argument("--profile", choices=list(PROFILES), help="profile to check the cache for")
    commands.add_parser("profiles", help="show the sizes of each profile")
    run = commands.add_parser("run", help="train an experiment (or load it from the cache) and print a summary")
    run.add_argument("names", nargs="+", choices=list(EXPERIMENTS), metavar="NAME",
                     help="one or more experiments from `list`, trained one after another (stops at the first error)")
    run.add_argument("--profile", choices=list(PROFILES),
                     help=f"sizes to run at (default: ${ENV_VAR}, else cpu; gpu on a GPU with {TRAIN_VAR}=all)")
    run.add_argument("--force", action="store_true", help="train again even if a cached result exists")
    run.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("--workers", type=int, default=1,
                     help="train this many runs at once on the CPU, one thread each (e.g. 2 on a 2-core machine)")
    args = parser.parse_args(argv)
    try:
        _command(args)
    except KeyboardInterrupt as e:  # run_experiment's Interrupted says what is kept
        print(f"\n{e or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError) as e:
        if args.traceback:
            raise
        print(f"error: {_one_line(e, getattr(args, 'profile', None))}", file=sys.stderr)
        return 1
    return 0


def _one_line(error: Exception, profile: str | None) -> str:
    """The first line of an error's message, with the way out when a dataset needs the internet."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "dataset" in text and "download" in text and (profile or get_profile().name) == "gpu":
        text += " Without internet, use --profile cpu (its mnist5k ships with pip)."
    return text


def _command(args: argparse.Namespace) -> None:
    if args.command == "profiles":
        for p in PROFILES.values():
            print(", ".join(f"{k}={v}" for k, v in p.as_dict().items()))
    elif args.command == "list":
        profile = get_profile(args.profile)
        print(f"profile: {profile.name}")
        for e in EXPERIMENTS.values():
            n = len(e.plan(profile))
            print(f"  {e.name:16s} {n:2d} runs  {e.description}\n{'':20s}{cache_status(e, profile)}")
    else:
        for name in args.names:
            _run(name, args)


def _run(name: str, args: argparse.Namespace) -> None:
    """Train (or load) experiment ``name`` and print what each of its runs ended with."""
    result = run_experiment(name, args.profile, force=args.force, device=args.device, progress=not args.no_progress,
                            workers=args.workers, budget=math.inf)
    if init_distributed()[0] != 0:  # under torchrun, rank 0 alone reports
        return
    print(f"{name} ({result.spec['profile']['name']} profile), {result.describe()}")
    for r in result.runs:
        last = r["history"].get("loss", [])[-100:]
        loss = sum(last) / max(len(last), 1)
        status = f"diverged at step {r['diverged_at']}" if r["diverged_at"] else f"loss (last 100) {loss:.4f}"
        print(f"  {r['label']:22s} seed {r['run']['seed']} {r['parameters']:>10,d} params  "
              f"{r['wall_time_s']:7.1f} s  {status}")
    if result.path:
        print(f"result: {result.path}")


if __name__ == "__main__":
    sys.exit(main())
