"""Named experiments: the training runs the chapters show, cached with their provenance.

An :class:`Experiment` is a list of :class:`RunSpec` (backbone, skip-scaling method, kappa,
regime or learning rate, ...) measured the same way, each run repeated over the profile's
seeds; the profile (:mod:`scalelong_edu.profiles`) fills in dataset, model size, batch, steps
and the learning rate of each regime. :func:`run_experiment` returns the cached result when
one exists for exactly this spec and otherwise trains every run and measures it the same way:

* every ``eval_every`` steps (and at step 0), the probes of :func:`scalelong_edu.probes.probe_fixed_batch`
  on one fixed held-out batch stratified over ``t`` (:func:`scalelong_edu.probes.probe_batch`, the
  same for every run), and Adam's moments;
* every step, the training batch's loss and gradient norm (the run's ``history``);
* at the end, on the EMA model: robustness to input noise, Lipschitz factors of every block,
  and a grid of samples.

A run that the trainer's NaN guard stops is a result: it is kept, with ``diverged_at`` set.
The result is written atomically to ``results_dir()/<name>-<profile>-<hash>.json.gz``. The hash covers
the full spec, so changing any setting can never pick up a stale result, and a file is checked
on load (its schema, and that its stored spec hashes to its name). Each finished run is kept in
``<name>-<profile>-<hash>.runs/`` until the experiment completes, so an interrupted experiment
continues where it stopped. A run is trained once: one that any result or partial run already
holds with the same settings and measurements (:func:`run_key`, which ignores names and labels) is
reused, so adding seeds to an experiment trains only the new seeds.

From the shell: ``python -m scalelong_edu list`` and ``python -m scalelong_edu run NAME``.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import os
import platform
import shutil
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import __version__
from .cost import (LIPSCHITZ_PASSES, Estimate, ModelCost, RunWork, Work, announce, estimate, model_cost,
                   seconds_per_step)
from .data import data_root, dataset_info, load_dataset
from .metrics import fcd, get_feature_classifier
from .diffusion import Schedule, cosine_schedule, ddim_sample, linear_schedule, q_sample
from .files import atomic_write, check_free_space, check_writable, exclusive
from .models import build_model, count_parameters
from .probes import BatchNorms, ProbeRecorder, fixed_batch_loss, lipschitz, probe_batch, robustness, to_frame
from .profiles import Profile, get_profile
from .train import Callback, NonFiniteLossError, TrainConfig, Trainer, init_distributed, pick_device
from .workers import peak_memory_mb, run_in_processes

CACHE_VERSION = 2
SUFFIX = ".json.gz"
"""Cached results are gzipped JSON: the probe columns repeat a few names thousands of times."""
SCHEDULES: dict[str, Callable] = {"linear": linear_schedule, "cosine": cosine_schedule}


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment.

    Attributes:
        label: the legend entry, e.g. ``"CS (kappa=0.5)"``.
        backbone: ``"uvit"`` or ``"unet"``: the profile's preset of that family.
        method, kappa: the skip scaling (:func:`scalelong_edu.scaling.make_scaling`).
        regime: ``"gentle"`` or ``"stress"``: the profile's learning rate of that regime.
        lr_scale: a factor on the regime's learning rate (a learning-rate sweep).
        lr: a peak learning rate that replaces the regime's, or ``None``.
        grad_clip: global gradient-norm clip, or ``None``.
        model_overrides: preset arguments to replace, e.g. ``(("depth", 20),)``.
        seed: weight initialisation and data order (set by :meth:`Experiment.plan`).
    """

    label: str
    backbone: str = "uvit"
    method: str = "none"
    kappa: float = 0.5
    regime: str = "gentle"
    lr_scale: float = 1.0
    lr: float | None = None
    grad_clip: float | None = None
    model_overrides: tuple[tuple[str, Any], ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class Experiment:
    """A named set of runs measured alike.

    Attributes:
        name, description: what ``python -m scalelong_edu list`` shows.
        runs: the runs, in legend order; each is trained once per seed.
        schedule: ``"linear"`` or ``"cosine"`` (T = 1000).
        robustness_sigmas: sigma_delta values of the end-of-training robustness probe (Thm 3.4).
        adam_stats: record Adam's moments at every evaluation.
        seeds: seeds per run; ``None`` takes the profile's ``seeds`` (either way at most its
            ``seed_cap``), counted from ``first_seed`` (a confirmation's fresh seeds follow its
            pilot's).
        step_fraction: the share of the profile's ``steps`` each run trains (a sweep that only
            has to find a setting can run shorter).
        long: each run trains the profile's ``long_steps`` instead (a model trained to draw
            recognisable images, as chapter 1's).
        fd_points: how many times, evenly spaced over training, to measure the EMA model's
            Frechet classifier distance on ``fd_samples`` fresh samples (0: only the end grid).
        end_probes: measure robustness and Lipschitz factors at the end of each run.
        fd_samples: samples per Frechet-distance evaluation.
        early_probes: ``(every, until)``: the fixed-batch probes also every ``every`` steps up
            to step ``until`` (the early surge of the norms; ``()``: only every ``eval_every``).
        batch_norms: record the norms of every training batch's decoder blocks and output
            (:class:`scalelong_edu.probes.BatchNorms`, summarised per ``eval_every`` steps).
        ema_loss: record the EMA model's fixed-batch loss at every evaluation.
    """

    name: str
    description: str
    runs: tuple[RunSpec, ...]
    schedule: str = "linear"
    robustness_sigmas: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
    adam_stats: bool = True
    seeds: int | None = None
    first_seed: int = 0
    step_fraction: float = 1.0
    long: bool = False
    fd_points: int = 0
    end_probes: bool = True
    fd_samples: int = 128
    early_probes: tuple[int, int] | tuple[()] = ()
    batch_norms: bool = False
    ema_loss: bool = False

    def steps(self, profile: Profile) -> int:
        """Training steps of every run under ``profile``."""
        return profile.long_steps if self.long else max(1, round(profile.steps * self.step_fraction))

    def plan(self, profile: Profile) -> tuple[RunSpec, ...]:
        """Every run to train, seed by seed (all runs of seed 0 first, so an interrupted
        experiment has every method at the same number of seeds), with its learning rate set."""
        seeds = self.seeds if self.seeds is not None else profile.seeds
        seeds = min(seeds, profile.seed_cap or seeds)
        def lr(run: RunSpec) -> float:
            return run.lr if run.lr is not None else run.lr_scale * profile.learning_rate(run.backbone, run.regime)

        seeds = range(self.first_seed, self.first_seed + seeds)
        return tuple(replace(run, seed=seed, lr=lr(run)) for seed in seeds for run in self.runs)

    def spec(self, profile: Profile) -> dict[str, Any]:
        """The full, JSON-able description that keys the cache: the runs as trained (seeds and
        learning rates resolved) and the profile's sizes."""
        return {"cache_version": CACHE_VERSION, "experiment": self._settings(),
                "runs": [asdict(run) for run in self.plan(profile)], "profile": self._sizes(profile)}

    def run_key(self, run: RunSpec, profile: Profile) -> str:
        """What identifies one run of :meth:`plan` whatever experiment trains it (:func:`run_key`).
        Every partial-run file carries it."""
        return run_key(self._settings(), self._sizes(profile), asdict(run))

    def _settings(self) -> dict[str, Any]:
        settings = {k: v for k, v in asdict(self).items()
                    if k not in ("runs", "seeds", "first_seed", "step_fraction", "long")}
        for key, default in LATER_SETTINGS.items():  # keeps the hashes of results cached before them
            if settings[key] == default:
                del settings[key]
        return settings

    def _sizes(self, profile: Profile) -> dict[str, Any]:
        sizes = {k: v for k, v in profile.as_dict().items() if k not in ("lr", "stress_lr", "seeds", "seed_cap",
                                                                      "breakdown_loss")}
        sizes["steps"] = self.steps(profile)
        return sizes


FD_SAMPLES = 128
"""Samples per Frechet-distance evaluation during training unless an experiment sets more: twice
the classifier's 64 feature dimensions, so the sample covariance is not singular."""
LATER_SETTINGS = {"fd_points": 0, "end_probes": True, "fd_samples": FD_SAMPLES, "early_probes": (),
                  "batch_norms": False, "ema_loss": False}
"""Settings added after results were cached: they enter the spec only when not at these defaults."""


BACKBONES = {"uvit": "U-ViT", "unet": "conv UNet"}
"""The two backbones every comparison trains, with their names in the book."""
REGIMES = ("gentle", "stress")

METHODS = (("none", "none", 1.0), ("1/sqrt(2)-CS", "sqrt2-cs", 1.0), ("CS (kappa=0.5)", "cs", 0.5), ("LS", "ls", 1.0))
"""The methods every comparison runs: label, :func:`scalelong_edu.scaling.make_scaling` name, kappa."""


SCALING_METHODS = (*METHODS[:2], *((f"CS (kappa={k:g})", "cs", k) for k in (0.3, 0.5, 0.7, 0.9)),
                   METHODS[3], ("LS per skip", "ls-per-skip", 1.0))
"""The methods of chapters 6-7: the comparison's, with CS on a grid of kappa and LS per skip."""


MAIN = dict(fd_points=6, fd_samples=256, early_probes=(5, 300), batch_norms=True, ema_loss=True)
"""The main comparisons' recordings: the Frechet distance on 256 samples six times (every 200
steps of the ``cpu`` profile), the fixed-batch probes every 5 steps over the first 300 (the early
surge of the norms), every training batch's norms, and the EMA model's fixed-batch loss."""
FCD_ONLY = dict(adam_stats=False, end_probes=False, fd_points=MAIN["fd_points"], fd_samples=MAIN["fd_samples"],
                ema_loss=True)
"""What the FCD confirmations record: the main comparisons' Frechet distances and EMA loss, without
the early probes, batch norms, Adam statistics and end probes their claims do not use."""
MAIN_SEEDS = {"uvit": 16, "unet": 12}
"""Seeds per method of the main comparisons: what a paired test needs for 80% power at the
differences and paired spreads of the 3-seed pilot (``uvit-gentle``, ``unet-gentle``)."""


STRESS_SEARCH = (16, 24, 32, 48, 64)
"""The learning rates, in multiples of the gentle one, that the declared search for the stress
regime tries on the unscaled U-ViT (``stress-search-uvit``; the rule is
:func:`scalelong_edu.evidence.breakdown_scale`). The lowest is where the one-seed sweep first saw a
run break down."""
STRESS = dict(seeds=5, adam_stats=False, end_probes=False, ema_loss=True)
"""The stress runs' recordings: the probes and the EMA model's fixed-batch loss, no Adam statistics
or end probes (a breakdown is read off the loss). The search and the stress comparison share them,
so the comparison reuses the search's unscaled runs at the learning rate it picks."""
STRESS_SCALE = 32
"""The stress regime's learning rate, in multiples of the gentle one: the rate the declared rule
(:func:`scalelong_edu.evidence.breakdown_scale`) picks on the finished ``stress-search-uvit``
(an int, as in :data:`STRESS_SEARCH`, so that the comparison's unscaled runs are the search's; a
test checks that the rule still picks it)."""
BREAKDOWN_SEEDS = 10
"""Seeds per method of the stress comparison (``breakdown-uvit``): breakdowns are a rate, counted
on runs paired by seed."""


DEPTHS = (2, 4, 6, 8)
"""The numbers of long skips N that chapter 8 sweeps."""
SWEEP = dict(step_fraction=1 / 3, adam_stats=False, fd_points=1, end_probes=False)
"""Chapter 8's sweeps: a third of the profile's steps, the Frechet distance at the end, no Adam
statistics or end probes (the largest runs of the book, sized to a few hours of a 2-core CPU)."""


TRAINED = dict(seeds=6, adam_stats=False, fd_points=1, fd_samples=256, end_probes=False, ema_loss=True)
"""Chapter 8's runs on trained models: the profile's full steps, six seeds, the EMA model's
fixed-batch loss and the Frechet distance on 256 samples at the end; no Adam statistics or end
probes. The depth, kappa and block-output experiments share them, so a run one of them trains (e.g.
CS with kappa = 0.5 at N = 8) is reused by the others."""
LONG = dict(seeds=6, long=True, adam_stats=False, fd_points=6, fd_samples=256, end_probes=False, ema_loss=True)
"""The long runs behind the sample-quality claims: the profile's ``long_steps`` (chapter 1's UNet
draws recognisable digits after as many), the Frechet distance six times over training."""


LIVE = dict(seeds=2, step_fraction=0.7, adam_stats=False, fd_points=2, fd_samples=256, early_probes=(5, 300),
            batch_norms=True, ema_loss=True)
"""The recordings and size of the experiments a chapter's "at GPU scale" section trains live
(:mod:`scalelong_edu.gpu_scale`): two seeds, 70% of the profile's steps, Fig. 1's recordings and the
Frechet distance twice, so that each fits in 25 minutes of a Colab T4 by its FLOPs."""


@dataclass(frozen=True)
class Confirmation:
    """A re-test of a pilot's undecided claims on fresh seeds, declared (with its size) before any
    of them was trained. It is tested on the fresh seeds alone, each chapter's claims of it a Holm
    family of their own (:attr:`scalelong_edu.ledger.Claim.family`, named after the experiment),
    and in the claims table it takes the place of the pilot's rows it re-tests
    (:attr:`~scalelong_edu.ledger.Claim.confirmation`). Fresh seeds keep each test's error rate at
    its level whatever the pilot showed; adding seeds to the pilot after seeing it would not.

    Attributes:
        pilot: the experiment whose claims it re-tests (itself a confirmation, if that left a
            claim undecided); its seeds lie below ``first``.
        first, fresh: the first fresh seed (after the pilot's and those of any earlier
            confirmation of the same runs; one that tests other arms may share an earlier one's
            seeds, reusing its unscaled runs), and how many.
        cautious: for a confirmation of breakdown rates (a scaled method against no scaling, exact
            McNemar): a rate of the scaled method's breakdowns, other than its pilot's, at which its
            power or chance of a decision is also stated; ``None`` for one of
            endpoints (t-tests with the margins of the pilot's claims: paired by seed, on a seed's
            mean over settings as ``depth-speed-confirm``'s, or over one arm's runs, as
            ``ls-confirm``'s fitted decay).
    """

    pilot: str
    first: int
    fresh: int
    cautious: float | None = None


CONFIRMATIONS = {"stability-confirm": Confirmation("stability-deep", BREAKDOWN_SEEDS, 30, 0.95),
                 "breakdown-confirm": Confirmation("breakdown-uvit", BREAKDOWN_SEEDS, 24, 0.6),
                 "breakdown-scaled-confirm": Confirmation("breakdown-uvit", BREAKDOWN_SEEDS, 24, 0.1),
                 "breakdown-sqrt2-confirm": Confirmation("breakdown-scaled-confirm", BREAKDOWN_SEEDS + 24, 60, 0.15),
                 "unet-confirm": Confirmation("main-unet", MAIN_SEEDS["unet"], 24),
                 "uvit-confirm": Confirmation("main-uvit", MAIN_SEEDS["uvit"], 24),
                 "ls-confirm": Confirmation("scaling-uvit", 3, 8),
                 "depth-confirm": Confirmation("depth-trained", TRAINED["seeds"], 20),
                 "unet-fcd-confirm": Confirmation("main-unet", MAIN_SEEDS["unet"] + 24, 24),
                 "uvit-fcd-confirm": Confirmation("main-uvit", MAIN_SEEDS["uvit"] + 24, 24),
                 "block-output-confirm": Confirmation("block-output-trained", TRAINED["seeds"], 20),
                 "depth-speed-confirm": Confirmation("depth-uvit", 3, 12),
                 "depth-unet-speed-confirm": Confirmation("depth-unet", 3, 12),
                 "depth-sqrt2-speed-confirm": Confirmation("depth-uvit", 3, 12),
                 "depth-cs-speed-confirm": Confirmation("depth-speed-confirm", 15, 20),
                 "depth-cs-speed-confirm-2": Confirmation("depth-cs-speed-confirm", 35, 40),
                 "uvit-ls-osc-confirm": Confirmation("uvit-confirm", MAIN_SEEDS["uvit"] + 48, 48),
                 "depth-osc-confirm": Confirmation("depth-confirm", TRAINED["seeds"] + 20, 28),
                 "unet-flips-confirm": Confirmation("unet-confirm", MAIN_SEEDS["unet"] + 48, 60)}
"""The declared confirmations (power: of each test at the pilot's paired mean and SD, at level
0.05 / the claims of its family, a lower bound for Holm's):

* ``stability-confirm``: pilot ``stability-deep`` (none broke down in 6 of 10 seeds, CS in 10 of
  10; undecided in chapter 8's family): 99% power on 30 pairs, 88% if CS breaks down in 95% of
  runs, 68% at 90%.
* ``breakdown-confirm``: pilot ``breakdown-uvit`` (none 2 of 10, CS 7 of 10; undecided in chapter
  3's family): 91% power on 24 pairs, 72% if CS breaks down in 60% of runs.
* ``unet-confirm``: pilot ``main-unet``, none vs CS (kappa = 0.5), 24 fresh seeds, measured as
  the pilot's endpoints are (the fixed-batch probes every ``eval_every`` steps, Adam's statistics)
  without its Frechet distances, early probes and batch norms, which these endpoints do not use.
  Chapter 3's family: paper Fig. 1's end level of ``||h_i||^2`` (pilot 0.80x, paired SD 0.29 on
  the log scale: 91% power) and Thm 3.1's late range (0.70x, SD 0.50: 85%). Chapter 4's: Adam's
  update size (0.974x, SD 0.047) and sign flips of m (odds 1.012x, SD 0.062), which lean to
  *absent*: at those SDs 24 pairs give 95% intervals of +-2.0% and +-2.6% about the estimate,
  inside the 5% margin if the pilot's estimates hold.
* ``uvit-confirm``: pilot ``main-uvit``, its four methods, 24 fresh seeds, measured as
  ``unet-confirm`` is. Chapter 3's family: paper Fig. 1's end level of ``||h_i||^2`` under
  1/sqrt(2)-CS (pilot 0.62x, SD 0.86 on the log scale: 62% power) and under CS (0.62x, SD 1.11:
  40%). Chapter 4's: Thm 3.3's gradient oscillation under CS (1.30x, SD 0.37, against the paper's
  direction: 90%). Chapter 7's: LS's late range of ``||h_i||^2`` (0.60x, SD 0.79: 77%) and its
  feature oscillation (1.19x, SD 0.44, against the paper: 34%).
* ``ls-confirm``: pilot ``scaling-uvit``'s LS per skip on the U-ViT (three seeds), 8 fresh seeds
  of that arm alone, measured as the pilot without its Frechet distances. Chapter 7's family of
  one: the decay per skip of the learned scales, each run's fitted kappa tested against 1 (pilot
  0.943x, SD 0.013 on the log scale: 4.5 SDs, power about 100%; 95% if the true decay is a third
  of the pilot's).
* ``depth-confirm``: pilots ``depth-trained`` and ``kappa-trained`` at N = 8, none vs
  1/sqrt(2)-CS vs CS (kappa = 0.5) vs CS (kappa = 0.3), 20 fresh seeds, measured as the pilots
  (without their final Frechet distance). Chapter 8's family of four: the reviewer's Q3, CS's EMA
  loss over 1/sqrt(2)-CS's (pilot 0.53x, SD 0.66: 92% power), Thm 3.1's late range of
  ``||h_i||^2``, CS over none (0.45x, SD 1.09: 71%), Sec. 3.1's feature oscillation, CS over none
  (0.68x, SD 0.62: 52%), and Sec. 4.1's band, the EMA loss of kappa = 0.5 (the pilot's best inside
  [0.5, 0.95]) over kappa = 0.3 (its best outside; pilot 0.945x, SD 0.056: 95%). (The last two
  rows and the kappa = 0.3 arm were added before any of its runs was trained: with them the
  expected number of decided rows rises from 1.8 to 3.1.)
* ``unet-fcd-confirm``: pilot ``main-unet``, its four methods, 24 fresh seeds after
  ``unet-confirm``'s (36-59), measured with the pilot's Frechet distances (256 samples every 200
  steps) and EMA loss, without its early probes, batch norms and Adam statistics (375 s a run
  here, against the pilot's 1,069); each speed target by the pilot's rule
  (:data:`scalelong_edu.evidence.SPEED_AT`) on its own unscaled runs. Powers as above, and the
  chance of a decision of either kind, *absent* included (:func:`scalelong_edu.stats.decision_chance`,
  at level 0.05 / family size). Chapter 6's family of three: 1/sqrt(2)-CS reaches the FCD target
  sooner (pilot speed-up 1.05x, SD 0.049 on the log scale: 97% power); CS reaches it sooner
  (1.02x, SD 0.090: 9%, a decision 35%) and CS's final FCD is lower (1.02x worse, SD 0.088: 10%,
  a decision 37%), both leaning to *absent* (which a speed-up run that never reaches its target
  rules out; no pilot run was one). Chapter 7's family of two: LS reaches the FCD target
  sooner (1.06x, SD 0.101: 63%) and LS's features oscillate less (0.83x, SD 0.43: 41%). Chapter
  4's family of one: CS's gradients oscillate less (1.07x, against the paper, SD 0.21: 33%).
  Decided rows expected: 3.1 at the pilot's effects, 2.3 at half of them (depth-confirm's lesson:
  pilots overstate).
* ``breakdown-scaled-confirm``: pilot ``breakdown-uvit``, 1/sqrt(2)-CS and LS against none on
  ``breakdown-confirm``'s 24 fresh seeds (10-33). None's runs there are that confirmation's, reused
  and already seen: it broke down in 1 of 24, so *reproduced* (fewer breakdowns) cannot be
  reached, and what is tested is whether the scaled arms break down as rarely (*absent*: both
  upper bounds below 25%) or significantly more often (*contradicted*). Chapter 3's family of two.
  The chance of a decision given none's 24 runs (:func:`scalelong_edu.stats.rates_decision_chance`,
  level 0.05 / 2): 92% if a scaled method breaks down in 2% of runs, 66% at 5%, 29% at 10%, 9% at
  20%; averaged over the rates its pilot allows (uniform prior: 0 of 10 for 1/sqrt(2)-CS, 1 of 10
  for LS) 56% and 33%, so about 0.9 decided rows expected.
* ``breakdown-sqrt2-confirm``: pilot ``breakdown-scaled-confirm``, whose 1/sqrt(2)-CS row it
  re-tests, undecided there (none broke down in 1 of 24 runs, 1/sqrt(2)-CS in 2 of 24, p = 1):
  none vs 1/sqrt(2)-CS on 60 fresh seeds after ``breakdown-confirm``'s (34-93), both arms trained
  there, measured as its pilot. Declared after its pilot's result was seen, so a family of its own
  (chapter 3's). The chance of a decision with both arms fresh
  (:func:`scalelong_edu.stats.fresh_rates_decision_chance`): 97% at the pilot's rates (94%
  *absent*: both exact upper bounds below 25%), 79% if 1/sqrt(2)-CS breaks down in 15% of runs
  (44% *absent*, the rest a significant difference), 76% if both arms do in 10%; 73% averaged over
  the rates all 34 earlier seeds allow (uniform priors: none 3 of 34, 1/sqrt(2)-CS 2 of 34; 300
  draws). About 11 core-hours here (120 runs of ~320 s).
* ``block-output-confirm``: pilots ``block-output-trained`` and ``kappa-trained`` at N = 8, block-
  output scaling at eta = 0.5 against CS (kappa = 0.5) on ``depth-confirm``'s 20 fresh seeds (6-25),
  measured as that confirmation (whose CS runs are reused, and whose feature oscillation of CS
  over none, 1.48x, was seen). Only eta = 0.5 is confirmed: it is the book's kappa, and the only
  CS arm trained on fresh seeds. Chapter 8's family of two (reviewer W2): CS's feature oscillation
  is lower (pilot at eta = 0.5: 0.57x, SD 0.42 on the log scale, 6 pairs: about 100% power, 69% at
  half the effect) and its EMA loss is lower (0.93x, SD 0.28: a decision 13%).
* ``uvit-fcd-confirm``: pilot ``main-uvit``, none vs 1/sqrt(2)-CS vs CS (kappa = 0.5), 24 fresh
  seeds after ``uvit-confirm``'s (40-63), measured as ``unet-fcd-confirm`` (:data:`FCD_ONLY`), each
  speed target by the pilot's rule on its own unscaled runs. Chapter 6's family of two: both
  methods reach the FCD target sooner. 1/sqrt(2)-CS: pilot speed-up 0.98x, SD 0.060 on the log
  scale, power 29%, a decision 82%, mostly *absent*, which a pair with a run that never reaches the
  target rules out (1 of the pilot's 16 pairs had one). CS: 0.99x, SD 0.104, power 3%, a decision
  24%. About one decided row expected; resampling the pilot's pairs (2,000 draws of 24, the
  pilot's target) gives 35% and 45%. LS is left out: 1.10x, SD 0.37, a decision 15%.
* ``depth-speed-confirm``: pilot ``depth-uvit`` (three seeds), none vs CS (kappa = 0.5) vs LS at
  each of N = 2, 4, 6, 8; 12 fresh seeds (3-14), measured as the pilot without its Frechet
  distance. Chapter 8's family of two, the U-ViT's early speed (lower final loss after a third of
  the steps), tested by seed: each seed's log ratio averaged over the four depths
  (:func:`scalelong_edu.evidence.seed_means`), as a seed's runs share its batches, t and noise. LS:
  pilot 0.90x, SD 0.131 on the log scale over its three seeds, 54% power at level 0.025, 15% at
  half the effect; CS: 0.91x, SD 0.122, 57% and 15%. About 1.1 decided rows expected at the
  pilot's effects, 0.3 at half of them. (First declared, with the same runs, as 48 pairs (N, seed)
  a method, each depth one pair as in the pilot's test: 70% and 56%. Changed to the seed before any
  fresh result was looked at, with 17 of its 144 runs landed, because those pairs are not
  independent.) 1/sqrt(2)-CS was left out at the first declaration (0.96x, a decision 20% by
  (N, seed) pairs); by seed, at the family's level 0.025, its chance is 46% (7% *absent*, the
  rest a significant difference).
* ``depth-unet-speed-confirm``: pilot ``depth-unet`` (three seeds), none vs 1/sqrt(2)-CS vs LS at
  N = 2, 4, 6, 8, 12 fresh seeds (3-14), measured and tested as ``depth-speed-confirm``. Chapter
  8's family of two, the conv UNet's early speed, whose pilot rows were *reproduced* until they
  were tested by seed: 1/sqrt(2)-CS 0.963x, SD 0.0074 on the log scale; LS 0.939x, SD 0.018. Power
  about 100% at level 0.025 for both, and at half the effects; at half the effects and twice the
  SDs (three seeds estimate an SD poorly) a decision 100% and 87%. CS is not re-tested: its pilot
  row is already *absent*.
* ``depth-sqrt2-speed-confirm``: pilot ``depth-uvit``, 1/sqrt(2)-CS against none at N = 2, 4, 6,
  8 on ``depth-speed-confirm``'s 12 fresh seeds (3-14), whose unscaled runs it reuses. Declared
  after that confirmation's result was seen (CS 1.05x and LS 1.12x no scaling's loss on these
  seeds), so it is a family of its own (chapter 8's): the pilot's 0.96x, SD 0.061, gives 52%
  power and a decision 58% (7% *absent*, the rest a significant difference); at half the effect
  44% (27% *absent*).
* ``depth-cs-speed-confirm``: pilot ``depth-speed-confirm``, whose CS (kappa = 0.5) row it
  re-tests, undecided there (1.05x no scaling's loss, p = 0.050, SD 0.077 on the log scale by
  seed): none vs CS at N = 2, 4, 6, 8 on 20 fresh seeds (15-34), measured and tested as its pilot.
  Declared after its pilot's result was seen, so a family of its own (chapter 8's): at the
  pilot's effect 77% power and a decision 79%, at half of it 52%.
* ``depth-cs-speed-confirm-2``: pilot ``depth-cs-speed-confirm``, whose CS row it re-tests,
  undecided there and leaning the other way from its own pilot (0.97x no scaling's loss, p = 0.16,
  SD 0.107 on the log scale by seed, after 1.05x on ``depth-speed-confirm``'s seeds): none vs CS
  (kappa = 0.5) at N = 2, 4, 6, 8 on 40 fresh seeds (35-74), measured and tested as its pilot, a
  family of its own (chapter 8's). At its pilot's effect 53% power and a decision 65% (12%
  *absent*, the rest a significant difference); 58% at half the effect (41% *absent*), 66% at
  none (61%). Every set of seeds stays in the chapter beside it. About 6 core-hours here (320
  runs of ~70 s).
* ``uvit-ls-osc-confirm``: pilot ``uvit-confirm``, whose chapter-7 row "LS makes the features
  oscillate less" it re-tests, undecided there and leaning against the paper (LS/none 1.13x,
  p = 0.053, SD 0.294 on the log scale): none vs LS in the gentle regime on 48 fresh seeds after
  ``uvit-fcd-confirm``'s (64-111), measured as its pilot. Declared after its pilot's result was
  seen, so a family of its own (chapter 7's): at the pilot's effect 81% power and a decision 81%,
  at half of it 30%. About 5 core-hours here (96 runs of ~195 s).
* ``depth-osc-confirm``: pilot ``depth-confirm``, whose chapter-8 row "CS lowers the feature
  oscillation" at N = 8 it re-tests, undecided there after Holm and leaning against the paper
  (CS/none 1.48x, p = 0.023, SD 0.711 on the log scale): none vs CS (kappa = 0.5) with N = 8, full
  steps, on 28 fresh seeds after the pilot's (26-53), measured as its pilot. Declared after its
  pilot's result was seen, so a family of its own (chapter 8's): at the pilot's effect 80% power
  and a decision 80%, at half of it 30%. About 6.3 core-hours here (56 runs of ~405 s).
* ``unet-flips-confirm``: pilot ``unet-confirm``, whose chapter-4 row "CS reduces parameter
  oscillation: m's sign flips" on the conv UNet it re-tests, undecided there (odds 1.03x, p = 0.21,
  SD 0.107 on the logit scale by seed): none vs CS (kappa = 0.5), gentle regime, on 60 fresh seeds
  after ``unet-fcd-confirm``'s (60-119), measured as its pilot. Declared after its pilot's result
  was seen, so a family of its own (chapter 4's): at the pilot's effect 51% power and a decision
  82% (31% *absent*, the rest a significant difference); 86% at half the effect (69% *absent*),
  92% at none (87%). About 9.8 core-hours here (120 runs of ~295 s)."""


def depth_overrides(backbone: str, n: int) -> tuple[tuple[str, Any], ...]:
    """The preset arguments that give the profile's ``backbone`` ``n`` long skips: a U-ViT of
    depth ``2n``; a conv UNet of ``n / 2`` resolution levels at the preset's width. The ``cpu`` and
    ``gpu`` conv UNets have two blocks per level, so ``N = n``; the ``ci`` one has one, so there
    ``N = n / 2`` (:func:`scalelong_edu.sweeps.n_skips` reads the true ``N`` back)."""
    if backbone == "uvit":
        return (("depth", 2 * n),)
    if n % 2:
        raise ValueError(f"a conv UNet has two long skips per level: n must be even, got {n}")
    return (("channel_mults", (1,) * (n // 2)),)


def _methods(backbone: str, regime: str = "gentle",
             methods: tuple[tuple[str, str, float], ...] = METHODS) -> tuple[RunSpec, ...]:
    """The ``methods`` (label, scaling, kappa; all four by default) on the profile's ``backbone`` in ``regime``."""
    return tuple(RunSpec(label, backbone, method, kappa, regime=regime) for label, method, kappa in methods)


def _map_cells(depths: tuple[int, ...], scales: tuple[int, ...]) -> tuple[RunSpec, ...]:
    """The U-ViT's four methods at every depth ``N`` and learning-rate multiple of a stability map."""
    return tuple(RunSpec(f"{label}, N={n}, lr x{k}", "uvit", method, kappa, lr_scale=k,
                         model_overrides=depth_overrides("uvit", n))
                 for k in scales for n in depths for label, method, kappa in METHODS)


def _at_depths(backbone: str, methods: tuple[tuple[str, str, float], ...],
               depths: tuple[int, ...] = DEPTHS) -> tuple[RunSpec, ...]:
    """The ``methods`` (label, scaling, kappa) on the profile's ``backbone`` with each number of long skips
    in ``depths`` (chapter 8's sweep by default), labelled ``"<label>, N=<n>"``."""
    return tuple(RunSpec(f"{label}, N={n}", backbone, method, kappa, model_overrides=depth_overrides(backbone, n))
                 for n in depths for label, method, kappa in methods)


def _lr_sweep(backbone: str, scales: tuple[float, ...] = (1, 4, 8, 16)) -> tuple[RunSpec, ...]:
    return tuple(RunSpec(f"{label}, lr x{k:g}", backbone, method, lr_scale=k)
                 for k in scales for label, method in (("none", "none"), ("CS (kappa=0.5)", "cs")))


def _confirmation(name: str, what: str, runs: tuple[RunSpec, ...], **settings: Any) -> Experiment:
    """The experiment of the declared confirmation ``name`` (:data:`CONFIRMATIONS`): ``runs``
    measured with ``settings``. A breakdown confirmation is measured as its pilot and lists the
    pilot's seeds too (their runs are reused, not trained again); one of endpoints lists its fresh
    seeds only."""
    declared = CONFIRMATIONS[name]
    first, fresh = declared.first, declared.fresh
    if declared.cautious is not None:
        return Experiment(name, f"{what}, {first + fresh} seeds (the first {first} are {declared.pilot}'s pilot; the "
                          f"declared confirmation of its breakdown rates is tested on the {fresh} fresh ones)", runs,
                          **{**settings, "seeds": first + fresh})
    return Experiment(name, f"{what}, seeds {first}-{first + fresh - 1}: the declared confirmation of "
                      f"{declared.pilot}'s claims, tested on these fresh seeds alone", runs,
                      **{**settings, "seeds": fresh, "first_seed": first})



def _stress_confirmation(name: str, label: str, method: str, kappa: float) -> Experiment:
    """The declared confirmation ``name`` of one scaled method (label, scaling, kappa) against no
    scaling at the stress regime's learning rate, both arms on its fresh seeds."""
    return _confirmation(name, f"U-ViT, at {STRESS_SCALE}x the gentle learning rate: none vs {label}",
                         (RunSpec("none", "uvit", lr_scale=STRESS_SCALE),
                          RunSpec(label, "uvit", method, kappa, lr_scale=STRESS_SCALE)), **STRESS)


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        *(Experiment(f"{b}-{regime}", f"{name}, {regime} regime: none vs 1/sqrt(2)-CS vs CS vs LS",
                     _methods(b, regime))
          for b, name in BACKBONES.items() for regime in REGIMES),
        *(Experiment(f"main-{b}", f"{name}, gentle regime, {MAIN_SEEDS[b]} seeds: none vs 1/sqrt(2)-CS vs CS vs "
                     "LS, with Fig. 1's recordings (dense early probes, every training batch's norms) and the "
                     "Frechet distance over training (the comparison with the power to decide)",
                     _methods(b, "gentle"), seeds=MAIN_SEEDS[b], **MAIN)
          for b, name in BACKBONES.items()),
        *(Experiment(f"{b}-lr-sweep", f"{name}: none vs CS at 1, 4, 8, 16x the gentle learning rate, one seed, "
                     "a third of the steps (chooses the stress regime)", _lr_sweep(b), seeds=1, step_fraction=1 / 3)
          for b, name in BACKBONES.items()),
        Experiment("stress-search-uvit", f"U-ViT, no scaling, at {', '.join(map(str, STRESS_SEARCH))}x the gentle "
                   "learning rate, five seeds: the declared search for the stress regime (where 20-80% of unscaled "
                   "runs break down)",
                   tuple(RunSpec(f"none, lr x{k:g}", "uvit", lr_scale=k) for k in STRESS_SEARCH), **STRESS),
        Experiment("breakdown-uvit", f"U-ViT at {STRESS_SCALE}x the gentle learning rate (the stress rate that "
                   "stress-search-uvit's rule picks), ten seeds: how often none, 1/sqrt(2)-CS, CS and LS break down",
                   (RunSpec("none", "uvit", lr_scale=STRESS_SCALE),  # as the search declared it: its runs
                    *(RunSpec(label, "uvit", method, kappa, lr_scale=STRESS_SCALE)
                      for label, method, kappa in METHODS[1:])),
                   **{**STRESS, "seeds": BREAKDOWN_SEEDS}),
        *(Experiment(f"scaling-{b}", f"{name}, gentle regime: none, 1/sqrt(2)-CS, CS at kappa 0.3 .. 0.9, LS "
                     "shared and per skip, with the Frechet distance over training (chapters 6-7)",
                     tuple(RunSpec(label, b, method, kappa) for label, method, kappa in SCALING_METHODS),
                     adam_stats=False, fd_points=6, end_probes=False)
          for b, name in BACKBONES.items()),
        Experiment("kappa-uvit-stress", "U-ViT, stress regime: CS at kappa 0.3, 0.7, 0.9 (with uvit-stress, "
                   "the kappa grid where training is pushed hard)",
                   tuple(RunSpec(f"CS (kappa={k:g})", "uvit", "cs", k, regime="stress") for k in (0.3, 0.7, 0.9)),
                   adam_stats=False, end_probes=False),
        *(Experiment(f"depth-{b}", f"{name}, gentle regime, N = 2, 4, 6, 8 long skips: none vs 1/sqrt(2)-CS vs "
                     "CS vs LS, a third of the steps (chapter 8, reviewer Q3)",
                     _at_depths(b, METHODS), **SWEEP)
          for b, name in BACKBONES.items()),
        Experiment("kappa-grid", "U-ViT with N = 4 and 8: CS at kappa 0.3, 0.4, 0.6, 0.7, 0.8, 0.9 (with depth-uvit's "
                   "none = kappa 1 and CS 0.5, a grid of kappa at two depths; reviewer W4)",
                   _at_depths("uvit", tuple((f"CS (kappa={k:g})", "cs", k) for k in (0.3, 0.4, 0.6, 0.7, 0.8, 0.9)),
                              (4, 8)), **SWEEP),
        Experiment("block-output", "U-ViT with N = 8: Hanin-Rolnick scaling of the block outputs at eta 0.3, 0.6, 0.9 "
                   "(against kappa-grid's CS at the same values; reviewer W2)",
                   _at_depths("uvit", tuple((f"block-output (eta={k:g})", "block-output", k) for k in (0.3, 0.6, 0.9)),
                              (8,)), **SWEEP),
        Experiment("live-ddpm", "conv UNet, no scaling, one seed, the profile's long_steps: chapter 1's DDPM at GPU "
                   "scale", (RunSpec("none", "unet"),), seeds=1, long=True, adam_stats=False, end_probes=False,
                   fd_points=1, fd_samples=256),
        *(Experiment(f"live-{b}", f"{name} at GPU scale: none vs {label}, two seeds (a chapter's live section)",
                     (RunSpec("none", b), RunSpec(label, b, method, kappa)), **LIVE)
          for b, name, (label, method, kappa) in (("unet", "conv UNet", METHODS[1]), ("uvit", "U-ViT", METHODS[2]))),
        Experiment("live-ls", "U-ViT at GPU scale: none vs LS, two seeds (chapter 7's live section; none is "
                   "live-uvit's)", (RunSpec("none"), RunSpec("LS", "uvit", "ls")), **LIVE),
        Experiment("live-depth", "U-ViT with N = 8 long skips at GPU scale: none vs CS (kappa=0.5), two seeds, "
                   "half the steps (chapter 8's live section)",
                   _at_depths("uvit", (METHODS[0], METHODS[2]), (8,)), **{**LIVE, "step_fraction": 0.5}),
        Experiment("depth-trained", "U-ViT with N = 2 and 8 long skips, full steps, six seeds: none vs 1/sqrt(2)-CS vs "
                   "CS (chapter 8: method x depth on trained models, reviewer Q3)",
                   _at_depths("uvit", METHODS[:3], (2, 8)), **TRAINED),
        Experiment("kappa-trained", "U-ViT with N = 8, full steps, six seeds: CS at kappa 0.3, 0.5, 0.7, 0.9 and 1 "
                   "(= none; 0.5 and 1 are depth-trained's runs): where the optimum lies (reviewer W4)",
                   _at_depths("uvit", tuple((f"CS (kappa={k:g})", "cs" if k < 1 else "none", k if k < 1 else 1.0)
                                            for k in (0.3, 0.5, 0.7, 0.9, 1.0)), (8,)), **TRAINED),
        Experiment("block-output-trained", "U-ViT with N = 8, full steps, six seeds: block-output scaling at eta 0.5 "
                   "and 0.7 (against kappa-trained's CS at the same values; reviewer W2)",
                   _at_depths("uvit", tuple((f"block-output (eta={k:g})", "block-output", k) for k in (0.5, 0.7)),
                              (8,)), **TRAINED),
        Experiment("long-uvit", "U-ViT, the profile's long_steps, six seeds: none vs CS (kappa=0.5), with the Frechet "
                   "distance over training (the sample-quality claims)",
                   _methods("uvit", methods=(METHODS[0], METHODS[2])), **LONG),
        Experiment("stability-map", "U-ViT, N = 2, 4, 8, at 8x and 16x the gentle learning rate: none vs "
                   "1/sqrt(2)-CS vs CS vs LS, two seeds (with depth-uvit at 1x, a map of where training holds)",
                   _map_cells((2, 4, 8), (8, 16)), **{**SWEEP, "fd_points": 0}, seeds=2),
        Experiment("stability-deep", f"U-ViT, N = 8, at 16x the gentle learning rate, {BREAKDOWN_SEEDS} seeds: none vs "
                   "1/sqrt(2)-CS vs CS vs LS (the one cell of stability-map where unscaled runs broke down, with "
                   "the seeds a breakdown rate needs; its first two seeds are the map's runs)",
                   _map_cells((8,), (16,)), **{**SWEEP, "fd_points": 0}, seeds=BREAKDOWN_SEEDS),
        _confirmation("stability-confirm", "U-ViT, N = 8, at 16x the gentle learning rate: none vs CS (kappa=0.5)",
                      tuple(r for r in _map_cells((8,), (16,)) if r.method in ("none", "cs")),
                      **{**SWEEP, "fd_points": 0}),
        _stress_confirmation("breakdown-confirm", *METHODS[2]),
        _confirmation("breakdown-scaled-confirm",
                      f"U-ViT, at {STRESS_SCALE}x the gentle learning rate: none vs 1/sqrt(2)-CS vs LS (none's runs "
                      "are breakdown-confirm's)",
                      (RunSpec("none", "uvit", lr_scale=STRESS_SCALE),
                       *(RunSpec(label, "uvit", method, kappa, lr_scale=STRESS_SCALE)
                         for label, method, kappa in (METHODS[1], METHODS[3]))),
                      **STRESS),
        _stress_confirmation("breakdown-sqrt2-confirm", *METHODS[1]),
        _confirmation("block-output-confirm", "U-ViT with N = 8, full steps: CS (kappa=0.5) vs block-output "
                      "(eta=0.5) (CS's runs are depth-confirm's)",
                      _at_depths("uvit", (METHODS[2], ("block-output (eta=0.5)", "block-output", 0.5)), (8,)),
                      **{**TRAINED, "fd_points": 0}),
        *(_confirmation(name, "conv UNet, gentle regime: none vs CS (kappa=0.5)",
                        _methods("unet", methods=(METHODS[0], METHODS[2])), end_probes=False)
          for name in ("unet-confirm", "unet-flips-confirm")),
        _confirmation("uvit-confirm", "U-ViT, gentle regime: none vs 1/sqrt(2)-CS vs CS vs LS",
                      _methods("uvit", "gentle"), end_probes=False),
        _confirmation("uvit-ls-osc-confirm", "U-ViT, gentle regime: none vs LS (its feature oscillation)",
                      _methods("uvit", methods=(METHODS[0], METHODS[3])), end_probes=False),
        _confirmation("ls-confirm", "U-ViT, gentle regime: LS per skip alone (its learned scales' decay)",
                      (RunSpec("LS per skip", "uvit", "ls-per-skip"),), adam_stats=False, fd_points=0,
                      end_probes=False),
        _confirmation("depth-confirm", "U-ViT with N = 8, full steps: none vs 1/sqrt(2)-CS vs CS (kappa=0.5) vs CS "
                      "(kappa=0.3)",
                      _at_depths("uvit", (*METHODS[:3], ("CS (kappa=0.3)", "cs", 0.3)), (8,)),
                      **{**TRAINED, "fd_points": 0}),
        _confirmation("depth-osc-confirm", "U-ViT with N = 8, full steps: none vs CS (kappa=0.5) (its feature "
                      "oscillation)", _at_depths("uvit", (METHODS[0], METHODS[2]), (8,)),
                      **{**TRAINED, "fd_points": 0}),
        _confirmation("depth-speed-confirm", "U-ViT, N = 2, 4, 6, 8 long skips, a third of the steps: none vs "
                      "CS (kappa=0.5) vs LS (early speed, reviewer Q3's sweep)",
                      _at_depths("uvit", (METHODS[0], METHODS[2], METHODS[3])), **{**SWEEP, "fd_points": 0}),
        _confirmation("depth-unet-speed-confirm", "conv UNet, N = 2, 4, 6, 8 long skips, a third of the steps: "
                      "none vs 1/sqrt(2)-CS vs LS (early speed, reviewer Q3's sweep)",
                      _at_depths("unet", (METHODS[0], METHODS[1], METHODS[3])), **{**SWEEP, "fd_points": 0}),
        _confirmation("depth-sqrt2-speed-confirm", "U-ViT, N = 2, 4, 6, 8 long skips, a third of the steps: "
                      "none (depth-speed-confirm's runs) vs 1/sqrt(2)-CS (early speed, reviewer Q3's sweep)",
                      _at_depths("uvit", METHODS[:2]), **{**SWEEP, "fd_points": 0}),
        *(_confirmation(name, "U-ViT, N = 2, 4, 6, 8 long skips, a third of the steps: none vs CS (kappa=0.5) "
                        "(early speed, reviewer Q3's sweep)",
                        _at_depths("uvit", (METHODS[0], METHODS[2])), **{**SWEEP, "fd_points": 0})
          for name in ("depth-cs-speed-confirm", "depth-cs-speed-confirm-2")),
        _confirmation("unet-fcd-confirm", "conv UNet, gentle regime: none vs 1/sqrt(2)-CS vs CS vs LS, with the "
                      "Frechet distance over training", _methods("unet", "gentle"), **FCD_ONLY),
        _confirmation("uvit-fcd-confirm", "U-ViT, gentle regime: none vs 1/sqrt(2)-CS vs CS, with the Frechet "
                      "distance over training", _methods("uvit", methods=METHODS[:3]), **FCD_ONLY),
    )
}


def comparison(profile: str | Profile | None = None, progress: bool = True) -> dict[tuple[str, str], ExperimentResult]:
    """The method comparison chapters 3 to 5 share: the result of ``<backbone>-<regime>`` for
    every backbone and regime, keyed ``(backbone, regime)`` (cached, else trained now)."""
    return {(b, regime): run_experiment(f"{b}-{regime}", profile, progress=progress)
            for b in BACKBONES for regime in REGIMES}


def results_dir() -> Path:
    """``$SCALELONG_RESULTS``, else ``data_root()/results``."""
    return Path(os.environ.get("SCALELONG_RESULTS") or data_root() / "results")


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; `python -m scalelong_edu list` shows: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def spec_hash(spec: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of the canonical JSON of ``spec``."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def run_key(settings: dict[str, Any], sizes: dict[str, Any], run: dict[str, Any]) -> str:
    """The hash that identifies one run across experiments, from the parts of a spec
    (:meth:`Experiment.spec`): the measurements (the experiment's settings but its name and
    description), the profile's sizes and the run's settings but its legend label. Two runs with
    one key train and measure exactly alike, so one can stand for the other."""
    measured = {k: v for k, v in settings.items() if k not in ("name", "description")}
    trained = {k: v for k, v in run.items() if k != "label"}
    return spec_hash({"cache_version": CACHE_VERSION, "experiment": measured, "profile": sizes, "run": trained})


def cache_path(experiment: Experiment, profile: Profile) -> Path:
    return results_dir() / f"{experiment.name}-{profile.name}-{spec_hash(experiment.spec(profile))}{SUFFIX}"


@dataclass
class ExperimentResult:
    """A finished experiment: its spec, provenance and one record per run."""

    spec: dict[str, Any]
    provenance: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None
    _probe_frame: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def labels(self) -> list[str]:
        """The run labels in legend order (each label is trained once per seed)."""
        return list(dict.fromkeys(r["label"] for r in self.runs))

    def history(self):
        """Per-step training curves of every run: ``label, seed, step, loss, grad_norm, lr``
        (measured on each training batch)."""
        import pandas as pd

        frames = [pd.DataFrame(r["history"]).assign(label=r["label"], seed=r["run"]["seed"]) for r in self.runs]
        frame = pd.concat(frames, ignore_index=True)
        return frame[["label", "seed", *(c for c in frame.columns if c not in ("label", "seed"))]]

    def probes(self):
        """All probe rows (:data:`scalelong_edu.probes.COLUMNS`) with ``label`` and ``seed`` columns
        (built once per result; each call returns a copy of its own)."""
        import pandas as pd

        built_for = [id(r) for r in self.runs]  # rebuilt if the runs were replaced since
        if self._probe_frame is None or self._probe_frame[0] != built_for:
            frames = [to_frame(_rows(r["probes"])).assign(label=r["label"], seed=r["run"]["seed"]) for r in self.runs]
            self._probe_frame = (built_for, pd.concat(frames, ignore_index=True))
        return self._probe_frame[1].copy()

    def samples(self, label: str, seed: int = 0) -> torch.Tensor:
        """The EMA samples of run ``label`` with ``seed`` as float images in [-1, 1], (n, C, H, W)."""
        run = next((r for r in self.runs if r["label"] == label and r["run"]["seed"] == seed), None)
        if run is None:
            raise KeyError(f"no run labelled {label!r} with seed {seed}; labels: {self.labels}")
        if run["diverged_at"] is not None:
            raise ValueError(f"run {label!r} (seed {seed}) diverged at step {run['diverged_at']}: it has no samples")
        return torch.tensor(run["samples"], dtype=torch.float32) / 127.5 - 1

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "provenance": self.provenance, "runs": self.runs}

    def describe(self) -> str:
        """Where the result came from: e.g. ``computed 2026-11-29 10:00:00 on cpu in 489 s``."""
        p = self.provenance
        partial = f"partial ({p['partial']} finished), " if "partial" in p else ""
        return f"{partial}computed {p.get('started', '?')} on {p.get('device', '?')} in {p.get('wall_time_s', 0):.0f} s"


class _ProbeEvery(Callback):
    """After the update, every ``every`` steps: the fixed-batch probes, Adam's moments (``adam``)
    and the EMA model's fixed-batch loss (``ema``); with ``early = (k, until)``, the fixed-batch
    probes also every ``k`` steps up to step ``until``."""

    def __init__(self, recorder: ProbeRecorder, every: int, batch: tuple, schedule, adam: bool,
                 early: tuple[int, int] | tuple[()] = (), ema: bool = False):
        self.recorder, self.regular, self.batch, self.schedule = recorder, every, batch, schedule
        self.adam, self.early, self.ema = adam, tuple(early), ema
        self.every = 1 if self.early else every  # the trainer calls us every step; we pick the due ones

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        regular = step % self.regular == 0
        if not (regular or (self.early and step <= self.early[1] and step % self.early[0] == 0)):
            return
        self.recorder.fixed_batch(step, self.batch, self.schedule)
        if regular and self.adam:
            self.recorder.after_step(step)
        if regular and self.ema:
            self.recorder.rows.append(fixed_batch_loss(trainer.ema, self.batch, self.schedule, step))


class _FrechetAt(Callback):
    """The EMA model's Frechet classifier distance (:func:`scalelong_edu.metrics.fcd`) at given steps,
    on :data:`FD_SAMPLES` DDIM samples drawn from the same noise at every evaluation."""

    def __init__(self, steps: set[int], profile: Profile, schedule: Schedule, reference: torch.Tensor, seed: int,
                 samples: int = FD_SAMPLES):
        self.steps, self.profile, self.schedule, self.reference, self.seed = steps, profile, schedule, reference, seed
        self.samples = samples
        self.classifier = get_feature_classifier(profile.dataset, profile.image_size, progress=False)
        self.rows: dict[str, list] = {"step": [], "fcd": []}

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        if step not in self.steps:
            return
        gen = torch.Generator(trainer.device).manual_seed(self.seed)
        samples = ddim_sample(trainer.ema, self.schedule, (self.samples, *self.reference.shape[1:]),
                              steps=self.profile.sample_steps, device=trainer.device, generator=gen)
        self.rows["step"].append(step)
        self.rows["fcd"].append(float(f"{fcd(samples.cpu(), self.reference, self.classifier):.6g}"))


def fixed_batch(profile: Profile, schedule: Schedule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(x0, t, eps)`` every run of every experiment is probed on: the first ``batch_size``
    held-out images, ``t`` stratified over the schedule (:func:`scalelong_edu.probes.probe_batch`)."""
    test = load_dataset(profile.dataset, "test", image_size=profile.image_size).tensors()[0]
    return probe_batch(test, profile.batch_size, schedule)


def _preset(run: RunSpec, profile: Profile) -> str:
    return profile.uvit if run.backbone == "uvit" else profile.unet


def build_run_model(run: RunSpec, profile: Profile) -> torch.nn.Module:
    """The freshly initialised model of ``run`` at ``profile`` (seed torch first for its weights)."""
    return build_model(_preset(run, profile), dataset_info(profile.dataset).channels, profile.image_size, run.method,
                       run.kappa, **dict(run.model_overrides))


def train_config(run: RunSpec, experiment: Experiment, profile: Profile) -> TrainConfig:
    """The optimisation settings of ``run`` (a run of :meth:`Experiment.plan`) at ``profile``."""
    return TrainConfig(steps=experiment.steps(profile), batch_size=profile.batch_size, lr=run.lr,
                       warmup=profile.warmup, ema_decay=profile.ema_decay, grad_clip=run.grad_clip, seed=run.seed)


def work(experiment: Experiment, profile: Profile, runs: Sequence[RunSpec] | None = None) -> Work:
    """What training ``runs`` (default: the whole plan) of ``experiment`` computes at ``profile``,
    evaluations included (:mod:`scalelong_edu.cost`): the numbers an estimate of its time rests on."""
    runs = experiment.plan(profile) if runs is None else runs
    steps = experiment.steps(profile)
    every, until = experiment.early_probes or (profile.eval_every, 0)
    probes = steps // profile.eval_every + 1 + until // every
    forwards = profile.sample_steps * (experiment.fd_points * experiment.fd_samples + profile.n_samples)
    forwards += probes * profile.batch_size * experiment.ema_loss
    if experiment.end_probes:
        forwards += (len(experiment.robustness_sigmas) + LIPSCHITZ_PASSES) * profile.batch_size
    return Work(tuple(RunWork(_model_cost(r, profile), steps, probes, forwards) for r in runs),
                profile.dataset, profile.image_size, profile.batch_size)


def _model_cost(run: RunSpec, profile: Profile) -> ModelCost:
    return _counted(_preset(run, profile), run.method, run.kappa, run.model_overrides,
                    dataset_info(profile.dataset).channels, profile.image_size, profile.batch_size)


@functools.cache
def _counted(preset: str, method: str, kappa: float, overrides: tuple, channels: int, image_size: int,
             batch_size: int) -> ModelCost:
    """:func:`scalelong_edu.cost.model_cost` of one model, counted once per process."""
    with torch.device("meta"):
        model = build_model(preset, channels, image_size, method, kappa, **dict(overrides))
    return model_cost(model, preset, channels, image_size, batch_size)


def estimate_here(experiment: Experiment, profile: Profile, runs: Sequence[RunSpec], device: torch.device) -> Estimate:
    """How long training ``runs`` of ``experiment`` should take on ``device``: :func:`work`, with a
    few training steps timed there (:func:`scalelong_edu.cost.seconds_per_step`) for each model of
    distinct FLOPs (the scaled and unscaled variants of a backbone cost the same)."""
    models = [_model_cost(run, profile) for run in runs]
    timed: dict[ModelCost, float] = {}
    for run, model in zip(runs, models):
        if model not in timed:
            timed[model] = seconds_per_step(build_run_model(run, profile), train_config(run, experiment, profile),
                                            dataset_info(profile.dataset).channels, profile.image_size, device)
    return estimate(work(experiment, profile, runs), [timed[model] for model in models], device)


def train_run(
    run: RunSpec, experiment: Experiment, profile: Profile, device: torch.device | None = None, progress: bool = True
) -> dict[str, Any]:
    """Train one run (a run of :meth:`Experiment.plan`: seed and learning rate set) and measure
    it; returns its JSON-able record."""
    if run.lr is None:
        raise ValueError("run.lr is None: pass a run of experiment.plan(profile), which sets it")
    train = load_dataset(profile.dataset, "train", image_size=profile.image_size)
    images = train.tensors()[0]
    torch.manual_seed(run.seed)
    model = build_run_model(run, profile)
    schedule = SCHEDULES[experiment.schedule]()
    config = train_config(run, experiment, profile)
    trainer = Trainer(model, images, schedule, config, device=device, progress=progress,
                      spec={"run": asdict(run), "experiment": experiment.name, "profile": profile.name})
    batch = tuple(x.to(trainer.device) for x in fixed_batch(profile, schedule))
    recorder = ProbeRecorder(trainer.model, trainer.optimizer)
    recorder.fixed_batch(0, batch, schedule)
    if experiment.ema_loss:
        recorder.rows.append(fixed_batch_loss(trainer.ema, batch, schedule, 0))
    trainer.callbacks.append(_ProbeEvery(recorder, profile.eval_every, batch, schedule, experiment.adam_stats,
                                         experiment.early_probes, experiment.ema_loss))
    if experiment.batch_norms:
        batch_norms = BatchNorms(trainer.model, profile.eval_every)
        trainer.callbacks.append(batch_norms)
    if experiment.fd_points:
        steps = {round(config.steps * k / experiment.fd_points) for k in range(1, experiment.fd_points + 1)}
        reference = load_dataset(profile.dataset, "test", image_size=profile.image_size).tensors()[0]
        frechet = _FrechetAt(steps, profile, schedule, reference, run.seed, experiment.fd_samples)
        trainer.callbacks.append(frechet)

    start, diverged_at = time.perf_counter(), None
    try:
        trainer.fit()
    except NonFiniteLossError:
        diverged_at = trainer.step + 1
    wall = time.perf_counter() - start

    record: dict[str, Any] = {"label": run.label, "run": asdict(run), "parameters": count_parameters(model),
                              "diverged_at": diverged_at, "wall_time_s": wall, "history": _columns(trainer.history)}
    if experiment.fd_points:
        record["fd"] = frechet.rows
    if diverged_at is None and experiment.end_probes:
        x0, t, _ = batch
        recorder.rows += robustness(trainer.ema, x0, t, schedule, experiment.robustness_sigmas, step=trainer.step)
        x_t = q_sample(x0, t, schedule, batch[2])
        recorder.rows += lipschitz(trainer.ema, x_t, schedule.model_time(t), step=trainer.step)
    if diverged_at is None:
        gen = torch.Generator(trainer.device).manual_seed(run.seed)
        samples = ddim_sample(trainer.ema, schedule, (profile.n_samples, *images.shape[1:]),
                              steps=profile.sample_steps, device=trainer.device, generator=gen)
        record["samples"] = ((samples.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().tolist()
    if experiment.batch_norms:
        recorder.rows += batch_norms.summary()  # also the steps before a divergence
    record["probes"] = _columns(recorder.rows)
    return record


def _columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Rows as one list per column, floats to 6 significant digits: the cached JSON stays compact."""
    def compact(value: Any) -> Any:
        return float(f"{value:.6g}") if isinstance(value, float) else value

    return {key: [compact(row[key]) for row in rows] for key in (rows[0] if rows else {})}


def _rows(columns: dict[str, list]) -> list[dict[str, Any]]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _stem(path: Path) -> str:
    return path.name.removesuffix(SUFFIX)


def runs_dir(path: Path) -> Path:
    """The folder that keeps the finished runs of an unfinished experiment cached at ``path``."""
    return path.parent / f"{_stem(path)}.runs"


def partial_path(path: Path, i: int) -> Path:
    """The file that keeps run ``i`` of the plan of the experiment cached at ``path``."""
    return runs_dir(path) / f"{i}.json"


class DamagedResultError(ValueError):
    """A cached result file that cannot be trusted; the message says how to recompute it."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during an experiment; the message says how many runs are kept and how to continue."""


RECORD_FIELDS = {"label": str, "run": dict, "parameters": int, "wall_time_s": (int, float), "history": dict,
                 "probes": dict}


def _check_record(record: Any, run: dict[str, Any], steps: int, n_samples: int) -> dict[str, Any]:
    """Raise a ValueError unless ``record`` is what :func:`train_run` writes for ``run`` (its JSON
    form) under a spec of ``steps`` steps and ``n_samples`` samples: the fields and their types,
    the run's own settings, a history of every step (fewer only if it diverged), the probes from
    step 0 on, and every sample."""
    if not isinstance(record, dict):
        raise ValueError(f"a run is a {type(record).__name__}, not an object")
    for key, kind in RECORD_FIELDS.items():
        if not isinstance(record.get(key), kind):
            raise ValueError(f"run field {key!r} is missing or not {getattr(kind, '__name__', kind)}")
    diverged = record.get("diverged_at")
    if not (diverged is None or isinstance(diverged, int)):
        raise ValueError("run field 'diverged_at' must be null or a step")
    if record["run"] != run:
        fields = sorted(k for k in {**run, **record["run"]} if record["run"].get(k) != run.get(k))
        shown = ", ".join(f"{k} {record['run'].get(k)!r} (not {run.get(k)!r})" for k in fields)
        raise ValueError(f"it holds another run than the spec's: {shown}")
    trained = len(record["history"].get("loss", []))
    if trained > steps or (diverged is None and trained != steps):
        raise ValueError(f"its history has {trained} steps; the spec trains {steps}")
    if record["probes"].get("step", [None])[0] != 0:
        raise ValueError("it has no probes from step 0")
    if diverged is None and len(record.get("samples") or []) != n_samples:
        raise ValueError(f"it has {len(record.get('samples') or [])} samples; the spec draws {n_samples}")
    return record


def keep_run(file: Path, key: str, run: RunSpec, record: dict[str, Any]) -> None:
    """Write one finished run to its partial-run file, with the key of the run it stands for
    (:meth:`Experiment.run_key`) and this process's peak memory."""
    saved = {"key": key, "run": asdict(run), "record": record, "peak_memory_mb": round(peak_memory_mb())}
    atomic_write(file, lambda tmp: tmp.write_text(json.dumps(saved)))


def read_run(file: Path, experiment: Experiment, profile: Profile, run: RunSpec) -> dict[str, Any]:
    """A partial-run file's contents, checked against the run it must stand for: its key (files
    written before keys existed are checked by content alone) and :func:`_check_record`."""
    if file.is_dir():
        raise ValueError("it is a folder, not a partial-run file: remove it")
    saved = json.loads(file.read_text())
    if not isinstance(saved, dict):
        raise ValueError(f"it holds a {type(saved).__name__}, not an object")
    if saved.get("key", experiment.run_key(run, profile)) != experiment.run_key(run, profile):
        raise ValueError("it belongs to another run (another experiment, profile or setting: its key differs)")
    expected = json.loads(json.dumps(asdict(run)))
    if saved.get("run") != expected:
        raise ValueError("it belongs to another run")
    _check_record(saved.get("record"), expected, experiment.steps(profile), profile.n_samples)
    return saved


def finished_runs(experiment: Experiment, profile: Profile, path: Path | None = None
                  ) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The runs of ``experiment.plan(profile)`` already trained towards the result at ``path``
    (default its cache path), by index, and why any partial file was unusable (a damaged file is
    skipped: its run is trained again)."""
    path = path or cache_path(experiment, profile)
    done, damaged = {}, []
    for i, run in enumerate(experiment.plan(profile)):
        file = partial_path(path, i)
        if not file.exists():
            continue
        try:
            done[i] = read_run(file, experiment, profile, run)["record"]
        except (ValueError, KeyError, TypeError, OSError) as e:
            damaged.append(f"ignoring the damaged partial result {file} ({e}); training it again")
    return done, damaged


def expected_bytes(experiment: Experiment, profile: Profile) -> int:
    """About how large one partial-run file is: the per-step history (~40 bytes a step), the
    samples as JSON integers and ~100 probe rows of ~50 bytes per evaluation (a generous estimate:
    the main U-ViT run at the ``cpu`` profile estimates 0.65 MB and takes 0.58 MB)."""
    steps = experiment.steps(profile)
    evaluations = steps // profile.eval_every + 1
    if experiment.early_probes:
        every, until = experiment.early_probes
        evaluations += min(until, steps) // every
    pixels = profile.n_samples * dataset_info(profile.dataset).channels * profile.image_size ** 2
    return 40 * steps + 4 * pixels + 5000 * evaluations


def _check_outputs(path: Path, experiment: Experiment, profile: Profile, todo: list[int]) -> None:
    """Fail now, not after hours of training, if the result or a partial-run file could not be
    written or the disk cannot hold them (the partials left to write and a result of half their
    size)."""
    if todo:
        needed = expected_bytes(experiment, profile) * (len(todo) + len(experiment.plan(profile)) // 2)
        check_free_space(path, needed, f"the {len(todo)} runs of {experiment.name} left to train",
                         "set SCALELONG_RESULTS to a folder on another disk")
    check_writable(path, "the experiment result")
    if todo:
        check_writable(partial_path(path, todo[0]), "the partial-run files")
    folders = [partial_path(path, i) for i in todo if partial_path(path, i).is_dir()]
    if folders:
        raise IsADirectoryError(f"{folders[0]} is a folder where a partial-run file belongs: remove it and rerun")


def _train_and_keep(run: RunSpec, experiment: Experiment, profile: Profile, file: Path, key: str,
                    device: str) -> None:
    """A worker process of ``run_experiment(..., workers=n)``: one run on ``device`` with one CPU
    thread, kept in its partial-run file before the process exits."""
    torch.set_num_threads(1)
    keep_run(file, key, run, train_run(run, experiment, profile, torch.device(device), progress=False))


def run_experiment(
    name: str, profile: str | Profile | None = None, force: bool = False, device: str | None = None,
    progress: bool = True, workers: int = 1, budget: float | None = None,
) -> ExperimentResult:
    """The experiment's result: from the cache when its spec matches, else trained now and cached.

    Before training it prints what it will train and how long that should take here
    (:func:`estimate_here`), and raises :class:`~scalelong_edu.cost.BudgetExceeded` instead when
    that is over ``budget`` minutes: by default :func:`~scalelong_edu.cost.default_budget` (25
    minutes, none with ``SCALELONG_TRAIN=all``); ``math.inf`` for no limit (the command line).

    Every finished run is kept (``runs_dir``) until all are done, so a rerun after an
    interruption (Ctrl-C raises :class:`Interrupted`, a KeyboardInterrupt that says what is kept)
    trains only the missing ones; ``force=True`` trains everything again. ``workers > 1`` trains
    that many runs at once, each in its own process on one CPU thread (on the CPU: one core each;
    on a GPU: sharing it, which keeps a large GPU busy with small models)
    (:mod:`scalelong_edu.workers`: a worker that dies costs its run only; the others go on, and
    the call then raises, with every finished run kept). Two processes that need the same
    uncached result do not both train it: the second waits for the first
    (:func:`~scalelong_edu.files.exclusive`), then loads what it cached.
    """
    experiment = get_experiment(name)
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    path = cache_path(experiment, profile)
    rank, world = init_distributed()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int (e.g. 2 on a 2-core CPU), got {workers!r}")

    def say(text: str) -> None:
        if progress and rank == 0:
            print(f"[{experiment.name}] {text}", flush=True)

    def cached() -> ExperimentResult | None:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder where the result of {name} belongs: move or remove it")
        if force or not path.exists():
            return None
        result = load_result(path, experiment.name)
        say(f"loaded from the cache: {path.name}\n  {result.describe()}")
        return result

    if (result := cached()) is not None:
        return result
    dev = pick_device(device)
    if workers > 1 and (world > 1 or dev.type not in ("cpu", "cuda")):
        raise ValueError(f"workers > 1 trains separate runs in separate processes on the CPU or one CUDA GPU, not "
                         f"under torchrun or on {dev.type!r}: use one of them (or split each batch with torchrun)")
    lock = exclusive(path, "the experiment result", say) if rank == 0 else contextlib.nullcontext()  # rank 0 writes
    with lock:
        result = cached()  # trained meanwhile by the process that held the lock
        return result if result is not None else _train(experiment, profile, path, force, dev, progress, workers,
                                                        budget, say, rank)


def _train(experiment: Experiment, profile: Profile, path: Path, force: bool, dev: torch.device, progress: bool,
           workers: int, budget: float | None, say: Callable[[str], None], rank: int) -> ExperimentResult:
    """The training half of :func:`run_experiment`: the runs not yet kept, trained and cached at ``path``."""
    plan = experiment.plan(profile)
    done, damaged = ({}, []) if force else finished_runs(experiment, profile, path)
    for message in damaged:
        say(message)
    todo = [i for i in range(len(plan)) if i not in done]
    if rank == 0:
        _check_outputs(path, experiment, profile, todo)
    elsewhere = kept_elsewhere(path) if todo else {}
    for i in list(todo):
        source = elsewhere.get(experiment.run_key(plan[i], profile))
        if source is not None:
            done[i] = _reuse(source, plan[i], experiment, profile)
            if rank == 0:
                keep_run(partial_path(path, i), experiment.run_key(plan[i], profile), plan[i], done[i])
            todo.remove(i)
            say(f"run {i + 1}/{len(plan)} ({plan[i].label}, seed {plan[i].seed}) is already trained: reused from "
                f"{source[0].name}")
    if todo:
        load_dataset(profile.dataset, "train", image_size=profile.image_size)  # one that cannot load fails first
        announce(estimate_here(experiment, profile, [plan[i] for i in todo], dev), budget,
                 f"python -m scalelong_edu run {experiment.name} --profile {profile.name}", say)
    result = ExperimentResult(
        spec=experiment.spec(profile),
        provenance={"package_version": __version__, "torch": torch.__version__, "python": platform.python_version(),
                    "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
                    "platform": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
    )
    if done:
        say(f"{len(done)} of {len(plan)} runs already done in {runs_dir(path)}; continuing")
    start, before = time.perf_counter(), sum(r["wall_time_s"] for r in done.values())
    try:
        if workers > 1 and todo:
            _train_in_workers(experiment, profile, path, todo, workers, dev, done, say)
        for i in todo:
            if i not in done:
                run = plan[i]
                say(f"run {i + 1}/{len(plan)}: {run.label}, seed {run.seed}, lr {run.lr:g}")
                done[i] = train_run(run, experiment, profile, dev, progress)
                if rank == 0:
                    keep_run(partial_path(path, i), experiment.run_key(run, profile), run, done[i])
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {len(done)} of {len(plan)} runs kept in {runs_dir(path)}; "
                          "rerun to continue") from None
    result.runs = [done[i] for i in range(len(plan))]
    result.provenance["wall_time_s"] = time.perf_counter() - start + before
    result.provenance["workers"] = workers
    if rank == 0:  # under torchrun only rank 0 writes
        text = json.dumps(result.to_json(), separators=(",", ":")).encode()
        atomic_write(path, lambda tmp: tmp.write_bytes(gzip.compress(text, mtime=0)))
        shutil.rmtree(runs_dir(path), ignore_errors=True)
        result.path = path
    return result


def kept_elsewhere(exclude: Path) -> dict[str, tuple[Path, int | None]]:
    """Every run already trained in ``results_dir()`` outside the result ``exclude`` and its
    partial runs, by :func:`run_key`: ``(result file, index)`` for the runs of complete results,
    ``(partial-run file, None)`` for partial runs that carry their key. Unreadable files are
    skipped (they are reported where they are loaded)."""
    found: dict[str, tuple[Path, int | None]] = {}
    for path in sorted(results_dir().glob(f"*{SUFFIX}")):
        if path == exclude:
            continue
        try:
            spec = json.loads(gzip.decompress(path.read_bytes()))["spec"]
            for i, run in enumerate(spec["runs"]):
                found.setdefault(run_key(spec["experiment"], spec["profile"], run), (path, i))
        except (ValueError, KeyError, TypeError, OSError, EOFError, zlib.error):
            continue
    for file in sorted(results_dir().glob("*.runs/*.json")):
        if file.parent == runs_dir(exclude):
            continue
        try:
            found.setdefault(json.loads(file.read_text())["key"], (file, None))
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return found


def _reuse(source: tuple[Path, int | None], run: RunSpec, experiment: Experiment, profile: Profile
           ) -> dict[str, Any]:
    """The record of ``run`` kept elsewhere under the same key, relabelled as this run and checked."""
    path, i = source
    record = load_result(path).runs[i] if i is not None else json.loads(path.read_text())["record"]
    record = {**record, "label": run.label, "run": json.loads(json.dumps(asdict(run)))}
    return _check_record(record, record["run"], experiment.steps(profile), profile.n_samples)


def finished_so_far(name: str, profile: str | Profile | None = None) -> ExperimentResult:
    """An experiment's runs without training any: its cached result when it is complete, else the
    runs finished so far (in plan order; ``provenance["partial"]`` says how many of the plan, and
    :meth:`ExperimentResult.describe` says so). For a long experiment whose runs land over days.

    Raises:
        FileNotFoundError: neither a result nor a finished run exists yet (with the command to start).
    """
    experiment = get_experiment(name)
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    path = cache_path(experiment, profile)
    if path.is_file():
        return load_result(path, name)
    done, _ = finished_runs(experiment, profile, path)
    if not done:
        raise FileNotFoundError(f"no run of {name} has finished at the {profile.name} profile: start them with "
                                f"`python -m scalelong_edu run {name} --profile {profile.name}`")
    n = len(experiment.plan(profile))
    provenance = {"partial": f"{len(done)} of {n} runs", "wall_time_s": sum(r["wall_time_s"] for r in done.values()),
                  "started": time.strftime("%Y-%m-%d", time.localtime(runs_dir(path).stat().st_mtime)),
                  "device": "cpu" if profile.name != "gpu" else "cuda"}
    return ExperimentResult(experiment.spec(profile), provenance, [done[i] for i in sorted(done)])


def _train_in_workers(experiment: Experiment, profile: Profile, path: Path, todo: list[int], workers: int,
                      dev: torch.device, done: dict[int, dict[str, Any]], say: Callable[[str], None]) -> None:
    """Train the runs ``todo`` of ``experiment`` in worker processes, adding each finished one to
    ``done``; raise once all are through if a worker died (its run is then trained by a rerun)."""
    plan, cores = experiment.plan(profile), os.cpu_count() or 1
    workers = min(workers, len(todo))
    if workers > cores:
        say(f"warning: {workers} workers on {cores} cores: they share the cores, and each holds its own copy "
            "of the data and the model (its peak memory is shown as its run finishes)")
    where = "on the GPU, " if dev.type == "cuda" else "on "
    say(f"training {len(todo)} runs, {workers} at a time {where}one CPU thread each")

    def finished(i: int) -> None:
        saved = read_run(partial_path(path, i), experiment, profile, plan[i])
        done[i] = saved["record"]
        say(f"run {i + 1}/{len(plan)} done: {plan[i].label}, seed {plan[i].seed} "
            f"({saved['peak_memory_mb']} MB peak memory)")

    def lost(i: int, reason: str) -> None:
        say(f"run {i + 1}/{len(plan)} ({plan[i].label}, seed {plan[i].seed}) is lost: its worker {reason}")

    jobs = [(i, (plan[i], experiment, profile, partial_path(path, i), experiment.run_key(plan[i], profile),
                 str(dev))) for i in todo]
    failed = run_in_processes(_train_and_keep, jobs, workers, finished, lost)
    if failed:
        runs = ", ".join(str(i + 1) for i in failed)
        raise RuntimeError(f"{len(failed)} run(s) lost to a dead worker (run {runs}); {len(done)} of {len(plan)} "
                           f"runs kept in {runs_dir(path)}: rerun to train the rest (with fewer --workers if "
                           "memory ran out)")


def load_result(path: str | Path, name: str | None = None) -> ExperimentResult:
    """Read a cached result, checking its schema, that its stored spec hashes to its file name and
    that its runs are exactly the spec's runs (:func:`_check_record`).

    A damaged file raises :class:`DamagedResultError`, whose message says how to recompute it
    (``name``, default from the file name, is the experiment to name there).
    """
    path = Path(path)
    name = name or _stem(path).rsplit("-", 2)[0]
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise ValueError("no 'spec' object")
        if not isinstance(data.get("provenance"), dict) or not isinstance(data.get("runs"), list):
            raise ValueError("no 'provenance' object or 'runs' list")
        if _stem(path).rsplit("-", 1)[-1] != spec_hash(data["spec"]):
            raise ValueError("its stored spec does not hash to its file name (edited?)")
        spec = data["spec"]
        if len(data["runs"]) != len(spec["runs"]):
            raise ValueError(f"it holds {len(data['runs'])} runs; its spec has {len(spec['runs'])}")
        for i, (record, run) in enumerate(zip(data["runs"], spec["runs"])):
            try:
                _check_record(record, run, spec["profile"]["steps"], spec["profile"]["n_samples"])
            except ValueError as e:
                raise ValueError(f"run {i + 1}: {e}") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError, EOFError, zlib.error) as e:
        raise DamagedResultError(  # gzip raises the last three
            f"cached result {path} is damaged: {e}; recompute it with "
            f"`python -m scalelong_edu run {name} --force` (or run_experiment({name!r}, force=True))"
        ) from e
    return ExperimentResult(data["spec"], data["provenance"], data["runs"], path)


def cache_status(experiment: Experiment, profile: Profile) -> str:
    """One phrase for ``python -m scalelong_edu list``: cached, damaged, partly done or nothing."""
    path = cache_path(experiment, profile)
    if path.is_file():
        try:
            return f"cached, {load_result(path, experiment.name).describe()}"
        except DamagedResultError as e:
            return f"DAMAGED ({e})"
    if path.exists():
        return f"BLOCKED ({path} is a folder where the result belongs: move or remove it)"
    done = len(finished_runs(experiment, profile, path)[0]) if runs_dir(path).is_dir() else 0
    return f"{done} of {len(experiment.plan(profile))} runs done" if done else "not cached"
