"""From cached runs to evidence: one table of per-run endpoints, and paired tests on it.

An :class:`~scalelong_edu.experiments.ExperimentResult` holds every run of every seed. Every
chapter goes from runs to verdicts the same way, the book's evidence protocol:

1. reduce each run to its endpoints (:func:`run_table`: one row per run, its setting as columns):
   its final loss, paper Fig. 1's statistics of its feature and gradient norms (level, growth,
   peak, range, oscillation; :func:`trajectory`), its gradient spikes, its final FCD, whether it
   broke down;
2. test a claim on runs paired by seed (:func:`compare`; breakdowns as paired rates,
   :func:`compare_breakdowns`) against a margin declared with the claim, with the procedure of
   :mod:`scalelong_edu.stats`; the run is the unit, so skips or evaluation points are never
   pooled as if independent;
3. collect a chapter's tests into its claims table, Holm-corrected as one family
   (:func:`scalelong_edu.ledger.publish`).

:func:`by_method` summarises a method over seeds (mean and 95% interval) for figures and text.
The bounds of Theorems 3.1 and 3.3 are compared with the probes through the "constant" each
measurement implies (:func:`feature_constants`, :func:`gradient_constants`): a bound of the form
``C ||x_t||^2 S_i`` is tight only if that constant stays put.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from .diffusion import DiscreteSchedule, q_sample
from .profiles import PROFILES
from .stats import (VERDICTS, MeanSE, PairedTest, RateTest, TrendTest, detrended, exact_interval,
                    fresh_rates_decision_chance, mean_se, oscillation, paired_rates, paired_test, rates_power,
                    trend_test)
from .theory import expected_xt_sq_ratio, robustness_factor

if TYPE_CHECKING:
    import pandas as pd

    from .experiments import ExperimentResult
    from .ledger import Claim

LATE = 0.5
"""Oscillation is measured over the last half of training, once the early growth of the norms
(a trend, not an oscillation) is over."""

SPIKE = 3.0
"""A training-batch gradient norm above ``SPIKE`` times the run's late median counts as a spike."""



def features(result: ExperimentResult, block: str = "b") -> pd.DataFrame:
    """The fixed-batch feature norms of ``block`` (``"b"``: decoder outputs, ``"a"``: encoder),
    with the effective ``kappa_i`` (root mean square over the batch, for LS; results recorded
    before the RMS was probed have the mean, the same for constant methods) and the tail sum
    ``S_i = sum_{j >= i} kappa_j^2`` of the same step.

    Columns: ``label, seed, step, skip, norm, sq_norm, kappa, S``.
    """
    probes = result.probes()
    rows = probes[(probes.probe == "features") & (probes.block == block)]
    wide = rows.pivot_table(index=["label", "seed", "step", "skip"], columns="quantity", values="value").reset_index()
    quantity = "kappa_rms" if (probes.quantity == "kappa_rms").any() else "kappa"  # results from before kappa_rms
    kappas = probes[(probes.probe == "features") & (probes.quantity == quantity)]
    tails = kappas[["label", "seed", "step", "skip", "value"]].rename(columns={"value": "kappa"})
    tails = tails.sort_values("skip", ascending=False)  # S_i = sum_{j >= i} kappa_j^2: sum from the inside out
    tails["S"] = (tails.kappa**2).groupby([tails.label, tails.seed, tails.step]).cumsum()
    frame = wide.merge(tails, on=["label", "seed", "step", "skip"])
    frame.columns.name = None
    return frame.sort_values(["label", "seed", "skip", "step"], ignore_index=True)


def _late(frame: pd.DataFrame, last_step: int) -> pd.DataFrame:
    return frame[frame.step > (1 - LATE) * last_step]


BREAKDOWN_LOSS = 0.5
"""A final training loss at or above this counts as a breakdown (unless the result's profile sets
its own ``breakdown_loss``). Predicting zero noise scores ``E||eps||^2 / m = 1``; a model above 0.5
explains less than half of the noise it must predict, while every gentle run of the book ends
below 0.36."""
BREAKDOWN_MARGIN = 0.25
"""The margin declared with every breakdown claim: a difference in breakdown rate under 25
percentage points would not matter, and a rate is *absent* when both arms' exact upper bounds lie
below it (:class:`scalelong_edu.stats.RateTest`)."""
FIG1 = ("level", "growth", "peak", "range", "range_late", "detrended")
"""The per-run statistics of a norm's trajectory (:func:`trajectory`), paper Fig. 1's quantities."""


def fig1_paths(result: ExperimentResult) -> pd.DataFrame:
    """Paper Fig. 1's two curves per run, on the fixed batch at every evaluation: the geometric
    mean over the skips of the decoder features' norms ``||h_i||`` (``series="feature"``) and of
    the decoder blocks' gradient norms (``"grad"``). A diverged run's path stops where it did.
    Columns: ``label, seed, step, series, value``."""
    import numpy as np
    import pandas as pd

    probes = result.probes()
    pick = {"feature": (probes.probe == "features") & (probes.block == "b") & (probes.quantity == "norm"),
            "grad": (probes.probe == "grads") & (probes.block == "b")}
    frames = []
    for series, mask in pick.items():
        logs = np.log(probes[mask].value.clip(lower=1e-30)).groupby(
            [probes.label[mask], probes.seed[mask], probes.step[mask]], sort=False).mean()
        frames.append(np.exp(logs).rename("value").reset_index().assign(series=series))
    return pd.concat(frames, ignore_index=True)[["label", "seed", "step", "series", "value"]]


def curves_by_backbone(curves: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Each backbone's ``curves`` (frames with ``label, seed, step, value``, e.g. from
    :func:`fig1_paths` or :func:`speed_curves`) on the seeds that every label of it has finished,
    stacked with ``series`` set to the backbone's key: one panel per backbone for
    :func:`scalelong_edu.figures.plot_seeds_and_median`."""
    import pandas as pd

    frames = []
    for backbone, frame in curves.items():
        complete = frame.groupby("seed").label.nunique() == frame.label.nunique()
        frames.append(frame[frame.seed.map(complete)].assign(series=backbone))
    return pd.concat(frames, ignore_index=True)


def trajectory(steps: Sequence[int], values: Sequence[float], regular: int, late: float = LATE) -> dict[str, float]:
    """What paper Fig. 1 shows of one norm over training, as numbers.

    ``values`` are measured at ``steps`` (sorted, starting at 0; dense early probes allowed);
    ``regular`` is the evaluation spacing of the run, which the oscillation statistics use so
    that every run is measured on the same grid. Returns ``level`` (the last value), ``growth``
    (last / first), ``peak`` (the largest value), ``range`` (max - min over the run),
    ``range_late`` (max - min over the last ``late`` of training), ``log_step``
    (:func:`scalelong_edu.stats.oscillation` over the late part) and ``detrended``
    (:func:`scalelong_edu.stats.detrended` over the late part; both ``NaN`` below 3 late points).
    """
    import numpy as np

    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    last = steps.max()
    late_all = values[steps > (1 - late) * last]
    late_part = values[(steps > (1 - late) * last) & (steps % regular == 0)]
    out = {"level": values[-1], "growth": values[-1] / values[0], "peak": values.max(),
           "range": values.max() - values.min(), "range_late": np.ptp(late_all) if len(late_all) else math.nan}
    if len(late_part) >= 3:
        out |= {"log_step": oscillation(late_part, min(5, len(late_part))).log_step,
                "detrended": detrended(late_part)}
    else:  # runs too short to have a late part (the ci profile)
        out |= {"log_step": math.nan, "detrended": math.nan}
    return {k: float(v) for k, v in out.items()}


def trajectories(result: ExperimentResult) -> pd.DataFrame:
    """:func:`trajectory` of every fixed-batch series of every run that did not diverge: the
    decoder outputs' squared norms ``||h_i||^2`` (``series="feature"``), the decoder blocks'
    gradient norms (``"grad"``) and, where recorded, the network output's ``||f(x_t)||^2``
    (``"output"``, ``skip`` 0). Columns: ``label, seed, series, skip`` and those of :func:`trajectory`.
    """
    import pandas as pd

    probes = result.probes()
    probes = probes[probes.probe.isin(["features", "grads", "fixed"])]
    pick = {"feature": (probes.probe == "features") & (probes.block == "b") & (probes.quantity == "sq_norm"),
            "grad": (probes.probe == "grads") & (probes.block == "b"),
            "output": (probes.probe == "fixed") & (probes.quantity == "output_sq_norm")}
    diverged = {(r["label"], r["run"]["seed"]) for r in result.runs if r["diverged_at"] is not None}
    regular = result.spec["profile"]["eval_every"]
    rows = []
    for series, mask in pick.items():
        frame = probes[mask].assign(skip=lambda f: f.skip.fillna(0))
        for (label, seed, skip), g in frame.groupby(["label", "seed", "skip"], sort=False):
            if (label, seed) not in diverged:
                g = g.sort_values("step")
                rows.append({"label": label, "seed": seed, "series": series, "skip": int(skip),
                             **trajectory(g.step.to_numpy(), g.value.to_numpy(), regular)})
    return pd.DataFrame(rows)


def _geometric_mean_over_skips(paths: pd.DataFrame, series: str) -> pd.DataFrame:
    import numpy as np

    mine = paths[paths.series == series]
    logs = np.log(mine[["label", "seed", *FIG1]].set_index(["label", "seed"]).clip(lower=1e-30))
    means = np.exp(logs.groupby(level=[0, 1], sort=False).mean())
    return means.rename(columns={c: f"{series}_{c}" for c in FIG1}).reset_index()


def method_of(label: str) -> str:
    """The method of a run's legend label: the label up to its setting, e.g. ``"LS"`` of
    ``"LS, N=4"`` (the sweeps' convention, :mod:`scalelong_edu.sweeps`)."""
    return label.split(", N=")[0]


def run_table(*results: ExperimentResult, window: int = 5) -> pd.DataFrame:
    """One row per run of ``results`` (experiments, e.g. a comparison or chapter 8's sweeps): the
    run's setting and every endpoint the book tests, so that a study is a ``groupby`` and a claim a
    :func:`compare` of two methods.

    Setting columns: ``experiment, label``, ``method`` (the label before ``", N="``),
    ``backbone, scaling, kappa, N, lr_scale, lr, sum_kappa2`` (:func:`scalelong_edu.sweeps.sum_kappa2`),
    ``seed, diverged_at`` (step or ``None``), ``broke_down`` (diverged, or a final ``loss`` of at
    least the profile's ``breakdown_loss``, :data:`BREAKDOWN_LOSS` by default), ``wall_time_s``.

    Endpoints:
        loss: mean training-batch loss over the last 10% of steps;
        fixed_loss: the fixed-batch loss at the last evaluation (``ema_loss``: the EMA model's,
            where recorded);
        fcd: the last Frechet distance measured in training (``NaN`` without one);
        feature_osc: mean over skips of the oscillation (``log_step``) of the decoder feature
            norms ``||h_i||`` on the fixed batch, over the last :data:`LATE` of training;
        grad_osc: the same for the gradient norms of the decoder blocks ``b_i``;
        spikes: the share of late training steps whose (training-batch) gradient norm exceeds
            :data:`SPIKE` times the run's late median;
        feature_<s>, grad_<s> for ``s`` in :data:`FIG1`: paper Fig. 1's statistics
            (:func:`trajectory`) of ``||h_i||^2`` and of the decoder gradient norms, as the
            geometric mean over the skips of the run (one number per run; ``feature_range`` is in
            units of ``||h||^2``: divide by the fixed batch's ``||x_t||^2`` for the theorem's);
        output_<s>: the same for the network output ``||f(x_t)||^2`` (runs that recorded it);
        batch_osc: the late mean of the training batches' own step-to-step change of the decoder
            norms (:class:`scalelong_edu.probes.BatchNorms`; runs that recorded it).
    Diverged runs get ``NaN`` in every endpoint: they are counted (``broke_down``), not summarised.
    """
    import pandas as pd

    frames = [_run_table(result, window) for result in results]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _run_table(result: ExperimentResult, window: int) -> pd.DataFrame:
    import pandas as pd

    from .sweeps import n_skips, sum_kappa2

    steps = result.spec["profile"]["steps"]
    probes = result.probes()
    feats = _late(features(result), steps)
    grads = _late(probes[(probes.probe == "grads") & (probes.block == "b")], steps)
    hist = result.history()
    fixed_losses = probes[(probes.probe == "fixed") & (probes.quantity == "loss")]
    ema_losses = probes[probes.probe == "fixed_ema"]
    batch = _late(probes[(probes.probe == "batch") & (probes.block == "b") & (probes.quantity == "log_step")], steps)
    rows = []
    for record in result.runs:
        run, label = record["run"], record["label"]
        seed = run["seed"]
        preset = result.spec["profile"][run["backbone"]]
        n = n_skips(run, preset)
        fd = record.get("fd", {}).get("fcd", [])
        row = {"experiment": result.spec["experiment"]["name"], "label": label, "method": method_of(label),
               "backbone": run["backbone"], "scaling": run["method"], "kappa": run["kappa"], "N": n,
               "lr_scale": run["lr_scale"], "lr": run["lr"], "sum_kappa2": sum_kappa2(run["method"], run["kappa"], n),
               "seed": seed, "diverged_at": record["diverged_at"], "wall_time_s": record["wall_time_s"]}
        if record["diverged_at"] is None:
            mine = (feats.label == label) & (feats.seed == seed)
            row["feature_osc"] = _mean_osc(feats[mine], "norm", window)
            mine = (grads.label == label) & (grads.seed == seed)
            row["grad_osc"] = _mean_osc(grads[mine], "value", window)
            h = hist[(hist.label == label) & (hist.seed == seed)]
            row["loss"] = h.loss.tail(max(1, len(h) // 10)).mean()
            late = _late(h, steps).grad_norm
            row["spikes"] = float((late > SPIKE * late.median()).mean())
            fixed = fixed_losses[(fixed_losses.label == label) & (fixed_losses.seed == seed)]
            row["fixed_loss"] = fixed.sort_values("step").value.iloc[-1]
            ema = ema_losses[(ema_losses.label == label) & (ema_losses.seed == seed)]
            if len(ema):
                row["ema_loss"] = ema.sort_values("step").value.iloc[-1]
            mine = batch[(batch.label == label) & (batch.seed == seed)]
            if len(mine):
                row["batch_osc"] = float(mine.value.mean())
            if fd:
                row["fcd"] = fd[-1]
        rows.append(row)
    table = pd.DataFrame(rows)
    paths = trajectories(result)
    for series in ("feature", "grad", "output"):
        if len(paths) and (paths.series == series).any():
            table = table.merge(_geometric_mean_over_skips(paths, series), on=["label", "seed"], how="left")
    profile = PROFILES.get(result.spec["profile"].get("name"))
    limit = profile.breakdown_loss if profile else BREAKDOWN_LOSS
    table["broke_down"] = table.diverged_at.notna() | (table.get("loss", math.nan) >= limit)
    return table


def complete_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`run_table` whose seed every method of the table has finished: what a
    paired test can use while an experiment's runs are still landing (a partial result's last seed
    may have only some methods)."""
    if table.empty:
        return table
    methods = table.groupby("seed").method.nunique()
    return table[table.seed.map(methods) == table.method.nunique()]


def seed_means(table: pd.DataFrame, column: str, over: str, levels: Sequence[object]) -> pd.DataFrame:
    """One row per (method, seed) of ``table`` (one experiment's runs at several settings ``over``,
    e.g. the depths ``N`` of a sweep): the geometric mean of ``column`` over the ``levels`` of that
    setting, for the (method, seed) that has finished all of them, ``broke_down`` if any of its runs
    did. A seed's runs share its batches, ``t`` and noise across settings, so they are not
    independent pairs; on these rows :func:`compare` pairs by seed and tests each seed's log ratio
    averaged over the settings, with the seed as the unit."""
    import numpy as np

    if table.empty:
        return table
    mine = table[table[over].isin(levels)]
    runs = mine.assign(log=np.log(mine[column])).groupby(["method", "seed"])
    means = runs.agg(log=("log", "mean"), broke_down=("broke_down", "any"), settings=(over, "nunique")).reset_index()
    means = means[means.settings == len(levels)]
    return means.assign(**{column: np.exp(means.log)}).drop(columns=["log", "settings"])


def seeds_landed(table: pd.DataFrame) -> int:
    """How many seeds every method of ``table`` has finished (:func:`complete_seeds`; 0 of an
    empty table, e.g. :func:`landed` before any run has)."""
    return 0 if table.empty else int(complete_seeds(table).seed.nunique())


def join_baseline(table: pd.DataFrame, column: str, baseline: object = "none", arm: str = "method",
                  by: Sequence[str] = ()) -> pd.DataFrame:
    """The rows of ``table`` that have a baseline run (the row with ``table[arm] == baseline``, the
    same seed and the same values of ``by``), each with that run's ``column`` as ``base``; the
    baseline's own rows are kept. The pairing behind :func:`seed_ratios` and
    :func:`scalelong_edu.sweeps.paired_differences`.

    Raises:
        ValueError: no baseline runs, or several with the same seed and ``by`` values.
    """
    keys = ["seed", *by]
    base = table[table[arm] == baseline]
    if base.empty:
        raise ValueError(f"no runs of the baseline {baseline!r}; {arm}: {list(dict.fromkeys(table[arm]))}")
    if base.duplicated(keys).any():
        raise ValueError(f"{baseline!r} has several runs with the same {', '.join(keys)}: pair by more keys (by)")
    return table.join(base.set_index(keys)[column].rename("base"), on=keys, how="inner")


def seed_ratios(table: pd.DataFrame, column: str, baseline: object = "none", arm: str = "method",
                by: Sequence[str] = ()) -> pd.DataFrame:
    """Each run's ``column`` over that of its baseline run (:func:`join_baseline`): the per-seed
    ratios whose logs :func:`compare` and :func:`interaction_claim` test, for figures that draw
    every pair. One row per run of :func:`run_table` that has a baseline run (the baseline's own
    rows included, at ratio 1), with columns ``arm``, ``seed``, ``*by`` and ``value``; e.g.
    ``arm="kappa", baseline=1.0`` gives a kappa grid relative to no scaling. Runs that broke down
    have no ratio and are left out (count them with :func:`breakdown_rates`).

    Raises:
        ValueError: as :func:`join_baseline`.
    """
    import pandas as pd

    keys = ["seed", *by]
    if table.empty:
        return pd.DataFrame(columns=[arm, *keys, "value"])
    rows = join_baseline(table[~table.broke_down], column, baseline, arm, by)
    return rows.assign(value=rows[column] / rows.base)[[arm, *keys, "value"]].reset_index(drop=True)


def compare(table: pd.DataFrame, column: str, treatment: str, baseline: str = "none", *, margin: float = 0.05,
            direction: str = "less", log: bool = True, share: bool = False, pair_by: Sequence[str] = ("seed",),
            **where: object) -> PairedTest:
    """Claim "``treatment`` moves ``column`` in ``direction`` relative to ``baseline``", tested on
    the runs of :func:`run_table` paired by seed (:func:`scalelong_edu.stats.paired_test`).

    ``where`` selects a setting (e.g. ``backbone="uvit", N=8``); within it, each method must have
    exactly one run per ``pair_by`` key, and both methods the same keys. ``pair_by=("N", "seed")``
    pools several depths, each (depth, seed) one pair; as a seed's runs share its batches, ``t`` and
    noise, those pairs are not independent, and a test with the seed as the unit takes
    :func:`seed_means` instead. ``log=True`` (norms,
    losses, oscillations, distances: positive quantities whose effects are multiplicative) tests
    ``log(treatment / baseline)`` with margin ``log(1 + margin)``: ``margin=0.05`` declares that an
    effect smaller than 5% of the baseline does not matter. ``log=False`` tests the difference
    with ``margin`` in the column's units. ``share=True`` (a share strictly between 0 and 1)
    tests the difference of logits, a log odds ratio, with margin ``log(1 + margin)`` on the odds.

    Raises:
        ValueError: no such runs, a duplicated (setting, method, seed), unpaired seeds, or a
            diverged or broken-down run in either arm (test those with :func:`compare_breakdowns`).
    """
    import numpy as np

    rows = select(table, **where)
    keys = list(pair_by)
    arms = {}
    for method in (baseline, treatment):
        mine = rows[rows.method == method]
        if mine.empty:
            raise ValueError(f"no runs of {method!r} with {where or 'any setting'}; methods: "
                             f"{list(dict.fromkeys(rows.method))}")
        if mine.duplicated(keys).any():
            raise ValueError(f"{method!r} has several runs with the same seed at {where or 'this setting'}: a pair "
                             "must be one run each; select one setting (e.g. N=..., lr_scale=...), one experiment, "
                             "or pair by more keys (pair_by)")
        arms[method] = mine.set_index(keys)
    if set(arms[baseline].index) != set(arms[treatment].index):
        raise ValueError(f"{treatment!r} and {baseline!r} do not have the same seeds ({sorted(arms[treatment].index)} "
                         f"vs {sorted(arms[baseline].index)}): runs are paired by seed")
    seeds = sorted(arms[baseline].index)
    broken = [s for s in seeds if arms[baseline].broke_down[s] or arms[treatment].broke_down[s]]
    if broken:
        raise ValueError(f"seeds {broken} broke down or diverged under {baseline!r} or {treatment!r}: they are "
                         "outcomes; test them with compare_breakdowns, and compare the rest only if the claim is "
                         "about them")
    base, treat = (arms[m].loc[seeds, column].to_numpy(dtype=float) for m in (baseline, treatment))
    if share:
        from scipy.special import logit

        return paired_test(logit(base), logit(treat), math.log1p(margin), direction)
    if log:
        return paired_test(np.log(base), np.log(treat), math.log1p(margin), direction)
    return paired_test(base, treat, margin, direction)


def ratio_text(test: PairedTest, what: str = "") -> str:
    """A log-scale :func:`compare` as a reader reads it: ``"<what> 0.87× [0.80, 0.95], n = 3"``, the
    treatment's value over the baseline's, seed by seed (geometric mean and 95% interval)."""
    lo, hi = (math.exp(v) for v in test.ci)
    return f"{what + ' ' if what else ''}{math.exp(test.estimate):.2f}× [{lo:.2f}, {hi:.2f}], n = {test.n}"


def rate_text(test: RateTest, names: tuple[str, str] = ("none", "scaled")) -> str:
    """A :func:`compare_breakdowns` as text: ``"none 8/16 [0.25, 0.75], scaled 0/16 [0, 0.21]"``
    (events of runs per arm, with exact 95% intervals)."""
    return ", ".join(f"{name} {k}/{test.n} [{lo:.2f}, {hi:.2f}]"
                     for name, k, (lo, hi) in zip(names, test.events, test.ci))


def breakdown_rates(table: pd.DataFrame) -> pd.DataFrame:
    """Per method of :func:`run_table` (in its order): runs that broke down (``broke``), ``runs``,
    the rate and its exact 95% interval (``lo``, ``hi``; :func:`scalelong_edu.stats.exact_interval`)."""
    counts = table.groupby("method", sort=False).broke_down.agg(broke="sum", runs="size")
    bounds = [exact_interval(int(k), int(n)) for k, n in counts.itertuples(index=False)]
    return counts.assign(rate=counts.broke / counts.runs, lo=[b[0] for b in bounds], hi=[b[1] for b in bounds])


def compare_breakdowns(table: pd.DataFrame, treatment: str, baseline: str = "none", *,
                       margin: float = BREAKDOWN_MARGIN, direction: str = "less", **where: object) -> RateTest:
    """Claim "``treatment`` breaks down less often than ``baseline``" (``broke_down`` of
    :func:`run_table`), on runs paired by seed and setting: an exact McNemar test
    (:func:`scalelong_edu.stats.paired_rates`). ``where`` may span several settings (e.g. every
    depth at a learning rate): each (setting, seed) is one pair."""
    rows = select(table, **where)
    keys = [c for c in ("experiment", "backbone", "N", "lr_scale", "seed") if c in rows.columns]
    arms = [rows[rows.method == m].set_index(keys).broke_down for m in (baseline, treatment)]
    for method, arm in zip((baseline, treatment), arms):
        if arm.empty:
            raise ValueError(f"no runs of {method!r} with {where}")
        if arm.index.duplicated().any():
            raise ValueError(f"{method!r} has duplicated runs for one setting and seed")
    if set(arms[0].index) != set(arms[1].index):
        raise ValueError(f"{treatment!r} and {baseline!r} were not run at the same settings and seeds")
    order = sorted(arms[0].index)
    return paired_rates(arms[0].loc[order].to_numpy(bool), arms[1].loc[order].to_numpy(bool), margin, direction)


def landed(name: str, profile: str | None = None, seeds_from: int = 0,
           measure: Callable[[ExperimentResult], pd.DataFrame] | None = None) -> pd.DataFrame:
    """``measure`` (:func:`run_table` by default; e.g. :func:`adam_table`) of the runs of
    experiment ``name`` finished so far (:func:`scalelong_edu.experiments.finished_so_far`) with a
    seed of at least ``seeds_from`` (a confirmation's fresh seeds), empty while none has: for the
    claims of an experiment whose runs have not started landing. Trains nothing."""
    import pandas as pd

    from .experiments import finished_so_far

    try:
        table = (measure or run_table)(finished_so_far(name, profile))
    except FileNotFoundError:
        return pd.DataFrame()
    return table[table.seed >= seeds_from].reset_index(drop=True)


def _paired_seeds(table: pd.DataFrame, treatment: str, baseline: str, where: dict, arm: str = "method"
                  ) -> pd.DataFrame:
    """The rows of the two arms (column ``arm``) at ``where`` whose seed both arms have finished
    (none of an empty table, e.g. :func:`landed` before any run has)."""
    rows = select(table, **where)
    if rows.empty:
        return rows.assign(seed=[])
    rows = rows[rows[arm].isin([baseline, treatment])]
    return rows[rows.seed.map(rows.groupby("seed")[arm].nunique()) == 2]


def landing_claim(chapter: int, paper: str, landed: int, planned: int, unit: str = "seeds") -> Claim:
    """The claims-table line of a claim with too few finished pairs to test yet: undecided, saying
    how many of the ``planned`` ``unit`` have landed."""
    from .ledger import Claim

    return Claim(chapter, paper, f"runs landing: {landed} of {planned} {unit}", "undecided", planned=planned)


def paired_claim(chapter: int, paper: str, table: pd.DataFrame, column: str, treatment: str, planned: int, *,
                 baseline: str = "none", margin: float = 0.05, direction: str = "less", log: bool = True,
                 share: bool = False, what: str = "", family: str = "", **where: object) -> Claim:
    """The claims-table line of "``treatment`` moves ``column`` in ``direction``" (:func:`compare`,
    ``margin``, ``log`` and ``share`` as there; the measured text is :func:`ratio_text`, which for a
    share reads as an odds ratio, and the margin reads e.g. "5% (odds)"), on the seeds both arms
    have finished out of the ``planned`` ones: *undecided* until all have landed
    (:class:`scalelong_edu.ledger.Claim`), and without a test while fewer than two have; in the
    Holm ``family`` given (:attr:`scalelong_edu.ledger.Claim.family`: a declared confirmation is
    its own)."""
    from .ledger import Claim

    rows = _paired_seeds(table, treatment, baseline, where)
    n = rows.seed.nunique()
    if n < 2:
        return replace(landing_claim(chapter, paper, n, planned), family=family)
    test = compare(rows, column, treatment, baseline, margin=margin, direction=direction, log=log, share=share,
                   **where)
    shown = f"{margin:.0%} (odds)" if share else f"{margin:.0%}" if log else f"{margin:g}"
    return Claim(chapter, paper, ratio_text(test, what), test=test, margin=shown, planned=planned, family=family)


def interaction_claim(chapter: int, paper: str, table: pd.DataFrame, column: str, treatment: str, baseline: str,
                      planned: int, *, by: str = "N", levels: tuple[object, object] = (2, 8), margin: float = 0.05,
                      direction: str = "less", what: str = "") -> Claim:
    """The claims-table line of a method x setting interaction: "``treatment``'s ratio over
    ``baseline`` on ``column`` is lower (``direction="less"``) at ``by = levels[1]`` than at
    ``levels[0]``", e.g. CS gains on 1/sqrt(2)-CS as the depth ``N`` grows (reviewer Q3). Per seed,
    the log ratio treatment / baseline at each level; the two levels' log ratios are compared paired
    by seed (:func:`scalelong_edu.stats.paired_test`, margin ``log(1 + margin)``), on the seeds whose
    four runs have finished out of the ``planned`` ones, *undecided* until all have landed."""
    import numpy as np

    from .ledger import Claim

    if table.empty:
        return landing_claim(chapter, paper, 0, planned)
    ratios = []
    for level in levels:
        rows = _paired_seeds(table, treatment, baseline, {by: level})
        if rows.broke_down.any():
            raise ValueError(f"a run at {by} = {level} broke down: an outcome; test it with compare_breakdowns")
        logs = {m: np.log(rows[rows.method == m].set_index("seed")[column]) for m in (treatment, baseline)}
        ratios.append(logs[treatment] - logs[baseline])
    seeds = sorted(set(ratios[0].index) & set(ratios[1].index))
    if len(seeds) < 2:
        return landing_claim(chapter, paper, len(seeds), planned)
    test = paired_test(ratios[0].loc[seeds].to_numpy(), ratios[1].loc[seeds].to_numpy(), math.log1p(margin),
                       direction)
    text = ratio_text(test, f"{what} at {by} = {levels[1]} over {by} = {levels[0]}".strip())
    return Claim(chapter, paper, text, test=test, margin=f"{margin:.0%}", planned=planned)


def breakdown_claim(chapter: int, paper: str, table: pd.DataFrame, treatment: str, planned: int, *,
                    baseline: str = "none", margin: float = BREAKDOWN_MARGIN, family: str = "",
                    **where: object) -> Claim:
    """The claims-table line of "``treatment`` breaks down less often than ``baseline``"
    (:func:`compare_breakdowns`, exact McNemar) on the seeds both arms have finished out of the
    ``planned`` ones, *undecided* until all have landed; in the Holm ``family`` given
    (:attr:`scalelong_edu.ledger.Claim.family`: a declared confirmation is its own)."""
    from .ledger import Claim
    from .plotting import pretty

    rows = _paired_seeds(table, treatment, baseline, where)
    if rows.empty:
        return replace(landing_claim(chapter, paper, 0, planned), family=family)
    test = compare_breakdowns(rows, treatment, baseline, margin=margin, **where)
    return Claim(chapter, paper, f"broke down: {rate_text(test, (pretty(baseline), pretty(treatment)))}; McNemar",
                 test=test, margin=f"{margin:.0%} of runs", planned=planned, family=family)


def confirmed(paper: str, name: str) -> str:
    """``paper``, a claim's text that ends in its setting's parenthesis, as the declared confirmation
    ``name`` (:data:`scalelong_edu.experiments.CONFIRMATIONS`) re-tests it on fresh seeds: the note
    ", declared confirmation on N fresh seeds, its own family" goes inside that parenthesis."""
    from .experiments import CONFIRMATIONS

    if not paper.endswith(")"):
        raise ValueError(f"a confirmed claim's text ends in its setting's parenthesis, as in 'CS trains faster "
                         f"(U-ViT)': got {paper!r}")
    note = f", declared confirmation on {CONFIRMATIONS[name].fresh} fresh seeds, its own family)"
    return paper.removesuffix(")") + note


def early_speed_claims(name: str, papers: Mapping[str, str], chapter: int = 8) -> dict[str, Claim]:
    """The claims of a declared confirmation of chapter 8's early speed (``depth-speed-confirm`` and
    its kin, :data:`scalelong_edu.experiments.CONFIRMATIONS`), one per method of ``papers``: a
    lower loss than no scaling's after the sweep's steps, paired by seed on each seed's mean log loss
    over the depths :data:`~scalelong_edu.experiments.DEPTHS` (:func:`seed_means`: a seed's runs
    share its batches, t and noise), on the fresh seeds finished so far (:func:`paired_claim`), in a
    Holm family of their own. ``papers`` maps each of the confirmation's methods (all of them: the
    family's correction depends on its size) to the pilot's claim, which :func:`confirmed` notes.
    A chapter that quotes another's confirmation decides the whole family again
    (:func:`scalelong_edu.ledger.decide`)."""
    from .experiments import CONFIRMATIONS, DEPTHS, get_experiment
    from .plotting import pretty

    arms = {method_of(run.label) for run in get_experiment(name).runs} - {"none"}
    if set(papers) != arms:
        raise ValueError(f"{name} tests {sorted(arms)} against none as one Holm family: give a claim for each of "
                         f"them, got {sorted(papers)}")
    seeds = CONFIRMATIONS[name].fresh
    means = seed_means(landed(name), "loss", "N", DEPTHS)
    return {label: paired_claim(chapter, confirmed(paper, name), means, "loss", label, seeds,
                                what=f"{pretty(label)}/none", family=name)
            for label, paper in papers.items()}


@dataclass(frozen=True)
class ConfirmationRuns:
    """The fresh seeds of a declared confirmation (:data:`scalelong_edu.experiments.CONFIRMATIONS`)
    finished so far, and the power it was declared with (:func:`confirmation`).

    Attributes:
        name, treatment, baseline: the experiment and the two arms' method labels.
        seeds: the declared fresh seeds; ``fresh``: :func:`run_table` of those both arms have
            finished so far (:func:`complete_seeds`; the pilot's columns and no rows before any has).
        pilot_rates: the pilot's breakdown rate per arm (:func:`breakdown_rates`; empty if it has no runs).
        cautious: the declaration's other rate of the treatment's breakdowns.
    Properties: ``power``, the exact McNemar test's power on ``len(seeds)`` pairs at the pilot's
    rates (:func:`scalelong_edu.stats.rates_power`); ``cautious_power`` if the treatment breaks down
    at the ``cautious`` rate; NaN where the pilot has no runs of an arm.
    """

    name: str
    treatment: str
    baseline: str
    seeds: range
    fresh: pd.DataFrame
    pilot_rates: pd.Series
    cautious: float

    @property
    def power(self) -> float:
        return self._sized(rates_power)

    @property
    def cautious_power(self) -> float:
        return self._sized(rates_power, self.cautious)

    def decision_chance(self, treated: float | None = None) -> float:
        """The chance that its test decides the claim when both arms are trained on the fresh seeds
        (:func:`scalelong_edu.stats.fresh_rates_decision_chance`), the baseline breaking down at the
        pilot's rate and the treatment at ``treated`` (by default the pilot's rate); NaN where the
        pilot has no runs of an arm."""
        return self._sized(functools.partial(fresh_rates_decision_chance, margin=BREAKDOWN_MARGIN), treated)

    def _sized(self, chance: Callable[[int, float, float], float], treated: float | None = None) -> float:
        """``chance(pairs, baseline rate, treatment rate)`` on the fresh seeds at the pilot's rates,
        the treatment's replaced by ``treated`` if given; NaN where the pilot has no runs of an arm."""
        treated = self.pilot_rates.get(self.treatment, math.nan) if treated is None else treated
        if math.isnan(treated) or self.baseline not in self.pilot_rates:
            return math.nan
        return chance(len(self.seeds), self.pilot_rates[self.baseline], treated)

    def rates(self) -> pd.DataFrame:
        """:func:`breakdown_rates` of the fresh seeds finished so far (no rows before any has)."""
        return breakdown_rates(self.fresh)

    def claim(self, chapter: int, paper: str) -> Claim:
        """The confirmation's claims-table line for the pilot's claim ``paper`` (:func:`confirmed`):
        :func:`breakdown_claim` on the fresh seeds, in the Holm family named after the experiment,
        undecided until all of them have landed."""
        return breakdown_claim(chapter, confirmed(paper, self.name), self.fresh, self.treatment, len(self.seeds),
                               baseline=self.baseline, family=self.name)

    def glue_values(self, decided: Claim) -> dict[str, object]:
        """What a chapter's prose quotes, by name: the fresh seeds (``seeds``, ``first``, ``last``,
        and ``landed``, those both arms have finished), the declared power in percent (``power``;
        ``cautious_power`` at ``cautious_rate``), each arm's breakdowns (``baseline``,
        ``treatment``: "k of n", or "no run yet"), and the ``decided`` claim's raw ``p`` and
        ``verdict`` (:attr:`~scalelong_edu.ledger.Claim.stated`)."""
        landed = self.fresh.seed.nunique()
        rates = self.rates()
        counts = {arm: f"{rates.broke[label]:.0f} of {rates.runs[label]:.0f}" if landed else "no run yet"
                  for arm, label in (("baseline", self.baseline), ("treatment", self.treatment))}
        return {"seeds": len(self.seeds), "first": self.seeds[0], "last": self.seeds[-1], "landed": landed,
                "power": 100 * self.power, "cautious_power": 100 * self.cautious_power,
                "cautious_rate": 100 * self.cautious, **counts,
                "p": decided.test.p if decided.test else math.nan, "verdict": decided.stated}


def confirmations(name: str, pilot: pd.DataFrame, treatments: Iterable[str], baseline: str = "none",
                  profile: str | None = None) -> dict[str, ConfirmationRuns]:
    """The declared confirmation ``name`` of the breakdown rates in ``pilot`` (:func:`run_table` of
    its pilot experiment), each of ``treatments`` against ``baseline``, keyed by treatment: its fresh
    seeds landed so far (read once for all arms), and the power its declaration gives at the pilot's
    rates (:func:`scalelong_edu.stats.rates_power`; NaN where the pilot has no runs of an arm)."""
    from .experiments import CONFIRMATIONS

    declared = CONFIRMATIONS[name]
    seeds = range(declared.first, declared.first + declared.fresh)
    rates = breakdown_rates(pilot).rate
    fresh = complete_seeds(landed(name, profile, seeds_from=seeds[0]))
    if fresh.empty:  # nothing has landed: no rows, but the pilot's columns, so it plots and counts as empty
        fresh = pilot.iloc[:0]
    return {t: ConfirmationRuns(name, t, baseline, seeds, fresh, rates, declared.cautious) for t in treatments}


def confirmation(name: str, pilot: pd.DataFrame, treatment: str, baseline: str = "none",
                 profile: str | None = None) -> ConfirmationRuns:
    """:func:`confirmations` of one arm, ``treatment``."""
    return confirmations(name, pilot, [treatment], baseline, profile)[treatment]


def confirmation_power(name: str, pilot: pd.DataFrame, column: str, treatment: str, baseline: str = "none", *,
                       tests: int, log: bool = True, share: bool = False, **where: object) -> float:
    """The power the declared confirmation ``name`` of paired endpoints
    (:data:`scalelong_edu.experiments.CONFIRMATIONS`) has for one of its ``tests`` claims: a paired
    t-test on its fresh seeds at level 0.05 / ``tests`` (a lower bound on Holm's), if the true mean
    and SD of the paired differences are the pilot's (:func:`compare` on ``pilot``, ``log``,
    ``share`` and ``where`` as there)."""
    from .experiments import CONFIRMATIONS
    from .stats import ALPHA, paired_power

    test = compare(pilot, column, treatment, baseline, log=log, share=share, **where)
    return paired_power(abs(test.estimate) / test.sd, CONFIRMATIONS[name].fresh, ALPHA / tests)


def select(table: pd.DataFrame, **where: object) -> pd.DataFrame:
    """The rows of ``table`` whose columns equal the given values, e.g. ``select(t, N=8, method="LS")``
    (none of an empty table, e.g. :func:`landed` before any run has finished)."""
    import numpy as np

    if table.empty:
        return table

    mask = np.ones(len(table), dtype=bool)
    for column, value in where.items():
        if column not in table.columns:
            raise KeyError(f"no column {column!r}; the run table has {list(table.columns)}")
        mask &= (table[column] == value).to_numpy()
    return table[mask]


def stress_scale(sweep: ExperimentResult, tolerance: float = 1.5) -> float:
    """The stress regime's learning-rate factor read off a learning-rate sweep: the largest
    ``lr_scale`` at which every run of the sweep finished with a training loss (:func:`run_table`)
    within ``tolerance`` times the sweep's best. The baseline is pushed as hard as possible while
    every method still trains, so that the comparison is between trained models."""
    table = run_table(sweep)
    best = table.loss.min()
    ok = table.groupby("lr_scale").loss.apply(lambda loss: bool(loss.notna().all()
                                                                and (loss <= tolerance * best).all()))
    if not ok.any():
        raise ValueError(f"no learning rate of the sweep trains every run within {tolerance}x the best loss")
    return float(ok[ok].index.max())


def breakdown_scale(search: ExperimentResult, low: float = 0.2, high: float = 0.8) -> float:
    """The stress regime's learning-rate factor by the declared rule of ``stress-search-uvit``: the
    smallest ``lr_scale`` of the search at which the share of runs that broke down
    (``broke_down`` of :func:`run_table`) lies in ``[low, high]``. There the unscaled baseline
    fails often enough for a method to be seen preventing it and trains often enough for one to be
    seen causing it. Raises ``ValueError``, with the share at every scale, when no scale qualifies."""
    shares = run_table(search).groupby("lr_scale").broke_down.mean()
    inside = shares[(shares >= low) & (shares <= high)]
    if inside.empty:
        seen = ", ".join(f"x{k:g}: {v:.0%}" for k, v in shares.items())
        raise ValueError(f"no learning rate of the search breaks down {low:.0%}-{high:.0%} of its runs ({seen}); "
                         "widen or refine the search's grid")
    return float(inside.index.min())


def confident_samples(result: ExperimentResult, classifier: torch.nn.Module, threshold: float = 0.9) -> list[float]:
    """Per run, in the order of ``result.runs`` (and of :func:`run_table`), the share of its samples
    that ``classifier`` (:func:`scalelong_edu.metrics.get_feature_classifier`) assigns to a class
    with probability above ``threshold``: a check that the model learned to draw digits. ``NaN``
    for a diverged run."""
    from .metrics import classifier_confidence

    return [float("nan") if r["diverged_at"] is not None else
            (classifier_confidence(result.samples(r["label"], r["run"]["seed"]), classifier) > threshold)
            .float().mean().item() for r in result.runs]


def _mean_osc(frame: pd.DataFrame, column: str, window: int) -> float:
    groups = [g.sort_values("step")[column] for _, g in frame.groupby("skip")]
    if not groups or len(groups[0]) < 2:  # a run too short to have two late probes (ci sweeps)
        return float("nan")
    per_skip = [oscillation(g, min(window, len(g))).log_step for g in groups]  # tiny ci runs: < window
    return sum(per_skip) / len(per_skip)


@dataclass(frozen=True)
class MethodSummary:
    """One method's value over seeds: its mean and interval (``None`` when fewer than two runs
    finished) and how many of its runs diverged (:func:`by_method` counts a run whose value is
    infinite with them)."""

    label: str
    summary: MeanSE | None
    diverged: int
    runs: int

    def __format__(self, spec: str) -> str:
        if self.summary is None:
            text = "no interval (fewer than 2 runs finished)"
        else:
            lo, hi = self.summary.interval()
            text = f"{self.summary.mean:{spec or '.3g'}} [{lo:{spec or '.3g'}}, {hi:{spec or '.3g'}}]"
        return text + (f", {self.diverged} of {self.runs} diverged" if self.diverged else "")


def by_method(table: pd.DataFrame, column: str) -> dict[str, MethodSummary]:
    """``column`` of :func:`run_table` summarised per method (label order kept).

    Only finite values are averaged. A run whose value is infinite blew up without tripping the
    trainer's NaN guard: it counts as diverged, like the runs with a ``diverged_at`` step.
    """
    if column not in table.columns:
        raise KeyError(f"no column {column!r}; run_table has {list(table.columns)}")
    out = {}
    for label, rows in table.groupby("label", sort=False):
        values = [v for v in rows[column] if v is not None and math.isfinite(v)]
        diverged = sum(bool(stopped) or (v is not None and math.isinf(v))
                       for stopped, v in zip(rows.diverged_at.notna(), rows[column]))
        out[label] = MethodSummary(label, mean_se(values) if len(values) >= 2 else None, diverged, len(rows))
    return out


def feature_constants(result: ExperimentResult, x_t_sq: float) -> pd.DataFrame:
    """The constant Theorem 3.1's bound would need at every probe: ``c = ||h_i||^2 / (||x_t||^2 S_i)``.

    ``x_t_sq`` is the fixed batch's mean ``||x_t||^2``; ``S_i`` the tail sum of the effective
    ``kappa`` measured at the same step. A bound ``c_lo ||x_t||^2 S_i <= ||h_i||^2 <= c_hi ||x_t||^2 S_i``
    holds with ``c_lo = min c`` and ``c_hi = max c``: the spread of ``c`` is how loose it must be.
    Columns: those of :func:`features` and ``c``.
    """
    frame = features(result)
    return frame.assign(c=frame.sq_norm / (x_t_sq * frame.S))


def output_constants(result: ExperimentResult, x_t_sq: float) -> pd.DataFrame:
    """The constant of the matching argument (paper Sec. 4.1) at every probe of a result that
    recorded the network output: ``c_out = ||f(x_t)||^2 / (||x_t||^2 sum_i kappa_i^2)``, with the
    fixed batch's mean ``||f(x_t)||^2`` and the effective ``kappa_i`` of the same step (``S_1``).
    Columns: ``label, seed, step, out_sq, S, c_out``.

    Raises:
        ValueError: the result has no output probes (it was cached before they were recorded).
    """
    probes = result.probes()
    out = probes[(probes.probe == "fixed") & (probes.quantity == "output_sq_norm")]
    if out.empty:
        raise ValueError("this result has no output_sq_norm probes (cached before they were recorded): use one "
                         "trained since, e.g. main-uvit")
    out = out[["label", "seed", "step", "value"]].rename(columns={"value": "out_sq"})
    outer = features(result)
    frame = out.merge(outer[outer.skip == 1][["label", "seed", "step", "S"]], on=["label", "seed", "step"])
    return frame.assign(c_out=frame.out_sq / (x_t_sq * frame.S))


def feature_ranges(result: ExperimentResult, x_t_sq: float) -> pd.DataFrame:
    """How far each skip's ``||h_i||^2`` swings over the last :data:`LATE` of training, in units of
    ``||x_t||^2`` (the quantity Theorem 3.1 bounds by ``O(S_i)``), one row per run and skip.

    Columns: ``label, seed, skip, S`` (at the last probe), ``range`` (max - min of
    ``||h_i||^2 / ||x_t||^2``), ``low`` and ``high`` (its min and max).
    """
    frame = _late(features(result), result.spec["profile"]["steps"]).assign(r=lambda f: f.sq_norm / x_t_sq)
    grouped = frame.sort_values("step").groupby(["label", "seed", "skip"], sort=False)
    out = grouped.agg(S=("S", "last"), low=("r", "min"), high=("r", "max")).reset_index()
    return out.assign(range=out.high - out.low)


def spread_by(frame: pd.DataFrame, column: str, factors: Sequence[str]) -> dict[str, float]:
    """How much ``column`` (a positive constant, e.g. ``c`` of :func:`feature_constants`) varies
    with each factor: for each name in ``factors``, the ratio of the largest to the smallest
    geometric mean of ``column`` over the groups of that factor. 1 means the factor does not
    move it; the factor with the largest ratio drives the looseness of a one-constant bound.

    NaN values (not measured) are left out of the means.

    Raises:
        ValueError: a value of ``column`` that is infinite or not > 0 (its log is not a number).
    """
    import numpy as np

    values = frame[column].to_numpy(dtype=float)
    bad = np.isinf(values) | (values <= 0)
    if bad.any():
        raise ValueError(f"spread_by needs {column!r} finite and > 0, but {int(bad.sum())} of {len(values)} rows "
                         f"are not (e.g. {values[bad][0]:g}): drop them first (e.g. the step-0 probes, "
                         "frame[frame.step > 0])")
    logs = np.log(frame[column])
    return {f: float(np.exp(logs.groupby(frame[f]).mean().agg(["max", "min"]).diff().abs().iloc[-1])) for f in factors}


def trend(table: pd.DataFrame, x: str, y: str, margin: float = 0.3, direction: str = "greater") -> TrendTest | None:
    """:func:`scalelong_edu.stats.trend_test` of column ``y`` against column ``x`` over the runs of a
    run table (one row a run) that have both values; ``None`` when fewer than 4 do (runs too short
    to measure ``y``, as at the ``ci`` profile, or an empty table)."""
    if table.empty:
        return None
    ok = table[table[x].notna() & table[y].notna()]
    return trend_test(ok[x], ok[y], margin, direction) if len(ok) >= 4 else None


def gradient_constants(result: ExperimentResult, x_t_sq: float) -> pd.DataFrame:
    """The constant of Theorem 3.3's bound at every probe: ``g = ||grad b_i|| / (loss ||x_t||^2 S_i)``,
    with the fixed batch's loss and decoder-block gradient norms. Columns: ``label, seed, step,
    skip, grad_norm, loss, S, g``."""
    probes = result.probes()
    grads = probes[(probes.probe == "grads") & (probes.block == "b")][["label", "seed", "step", "skip", "value"]]
    loss = probes[(probes.probe == "fixed") & (probes.quantity == "loss")][["label", "seed", "step", "value"]]
    loss = loss.rename(columns={"value": "loss"})
    tails = features(result)[["label", "seed", "step", "skip", "S"]]
    frame = grads.rename(columns={"value": "grad_norm"}).merge(loss, on=["label", "seed", "step"])
    frame = frame.merge(tails, on=["label", "seed", "step", "skip"])
    return frame.assign(g=frame.grad_norm / (frame.loss * x_t_sq * frame.S))


def adam_table(result: ExperimentResult, block: str = "model") -> pd.DataFrame:
    """Adam's moments per run (the reviewer's question 2), averaged over the probes of the last
    :data:`LATE` of training: columns ``label, seed, diverged_at``, ``method`` (the label) and
    ``broke_down`` (diverged), so that :func:`compare` pairs them, and the quantities of
    :data:`scalelong_edu.probes.ADAM_QUANTITIES` for ``block`` (``"model"``: all parameters,
    ``"a"``/``"b"``: the mean over encoder/decoder blocks). Diverged runs get ``NaN``."""
    import pandas as pd

    probes = result.probes()
    adam = _late(probes[(probes.probe == "adam") & (probes.block == block)], result.spec["profile"]["steps"])
    means = adam.pivot_table(index=["label", "seed"], columns="quantity", values="value", aggfunc="mean")
    runs = pd.DataFrame([{"label": r["label"], "seed": r["run"]["seed"], "diverged_at": r["diverged_at"]}
                         for r in result.runs])
    table = runs.merge(means.reset_index(), on=["label", "seed"], how="left")
    table.loc[table.diverged_at.notna(), list(means.columns)] = float("nan")
    table.columns.name = None
    return table.assign(method=table.label, broke_down=table.diverged_at.notna())


def robustness_table(result: ExperimentResult, sigma: float) -> pd.DataFrame:
    """Theorem 3.4 per run: measured sensitivity against the bound's factor.

    Columns: ``label, seed, diverged_at``; ``output_change`` and ``loss_change`` at ``sigma``;
    ``jacobian``, the network's measured input Lipschitz factor; ``m0``, the largest block factor
    (the theorem's ``M_0``: every block stretches its input at most that much); ``bound``,
    :func:`scalelong_edu.theory.robustness_factor` of the last probed effective ``kappa_i`` and
    ``m0``; ``m0_median`` and ``bound_median``, the same with the median block factor (a typical
    block rather than the worst). Diverged runs have no end-of-training probes: ``NaN``.
    """
    import pandas as pd

    probes = result.probes()
    rows = []
    for record in result.runs:
        label, seed = record["label"], record["run"]["seed"]
        row = {"label": label, "seed": seed, "diverged_at": record["diverged_at"]}
        run = probes[(probes.label == label) & (probes.seed == seed)]
        lip = run[run.probe == "lipschitz"]
        if not lip.empty:
            rob = run[(run.probe == "robustness") & ((run.sigma - sigma).abs() < 1e-12)]
            if rob.empty:
                probed = sorted(float(v) for v in run.sigma.dropna().unique())
                raise ValueError(f"sigma {sigma} was not probed; the runs have {probed}")
            kappa = run[run.quantity == "kappa"]  # Theorem 3.4's factor is linear in kappa_i: the mean gate
            kappas = kappa[kappa.step == kappa.step.max()].sort_values("skip").value.tolist()
            blocks = lip[lip.block != "model"].value
            row |= {"output_change": rob[rob.quantity == "output_change"].value.item(),
                    "loss_change": rob[rob.quantity == "loss_change"].value.item(),
                    "jacobian": lip[lip.block == "model"].value.item(),
                    "m0": blocks.max(), "bound": robustness_factor(kappas, blocks.max()),
                    "m0_median": blocks.median(), "bound_median": robustness_factor(kappas, blocks.median())}
        rows.append(row)
    columns = ["label", "seed", "diverged_at", "output_change", "loss_change", "jacobian", "m0", "bound", "m0_median",
               "bound_median"]
    return pd.DataFrame(rows, columns=columns)


def xt_norm_ratio(images: Tensor, schedule: DiscreteSchedule, ts: Sequence[int], seed: int = 0) -> pd.DataFrame:
    """Lemma 3.2 on real data: ``||x_t||^2 / m`` of every image at each ``t`` in ``ts``.

    Each image is noised once per ``t`` (``eps`` from a generator seeded with ``seed``).
    Columns: ``t``, ``mean``, ``q05``, ``q95`` (the 5% and 95% quantiles over images) and
    ``expected``, :func:`scalelong_edu.theory.expected_xt_sq_ratio` with the images' own
    ``E ||x_0||^2 / m``.
    """
    import pandas as pd

    m = images[0].numel()
    x0_ratio = images.flatten(1).square().sum(1).mean().item() / m
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for t in ts:
        eps = torch.randn(images.shape, generator=generator)
        x_t = q_sample(images, torch.full((len(images),), int(t)), schedule, eps)
        ratio = x_t.flatten(1).square().sum(1) / m
        lo, hi = torch.quantile(ratio, torch.tensor([0.05, 0.95])).tolist()
        rows.append({"t": int(t), "mean": ratio.mean().item(), "q05": lo, "q95": hi,
                     "expected": float(expected_xt_sq_ratio(schedule.alpha_bars[int(t)].item(), x0_ratio))})
    return pd.DataFrame(rows)


def fd_curves(result: ExperimentResult) -> pd.DataFrame:
    """The Frechet classifier distance measured during training (experiments with ``fd_points``).

    Columns: ``label, seed, step, fcd``. A run that diverged keeps the points before it did.
    """
    import pandas as pd

    frames = [pd.DataFrame(r["fd"]).assign(label=r["label"], seed=r["run"]["seed"]) for r in result.runs if "fd" in r]
    if not frames:
        raise ValueError("this result has no Frechet distances over training: its experiment has fd_points = 0")
    return pd.concat(frames, ignore_index=True)[["label", "seed", "step", "fcd"]]


def steps_to_reach(steps: Sequence[float], values: Sequence[float], target: float) -> float:
    """The first step at which a curve measured at ``steps`` falls to ``target`` or below, by linear
    interpolation between evaluations; ``steps[0]`` when the first evaluation is already there (the
    curve is not resolved earlier) and ``NaN`` when it never gets there."""
    if len(steps) != len(values) or not len(steps):
        raise ValueError(f"need as many steps as values (at least one), got {len(steps)} and {len(values)}")
    if values[0] <= target:
        return float(steps[0])
    for (s0, v0), (s1, v1) in zip(zip(steps, values), zip(steps[1:], values[1:])):
        if v1 <= target:
            return float(s0 + (s1 - s0) * (v0 - target) / (v0 - v1))
    return math.nan


SPEED_AT = 0.5
"""The declared target of a speed-up: the level the baseline reaches at this fraction of training
(its median over seeds at the nearest evaluation). Declared as a rule, before any run: it reads the
baseline only, and the baseline reaches it by construction, in about half its seeds by then."""

SPEED_QUANTITIES = {"fcd": "FCD", "ema_loss": "fixed-batch EMA loss"}
"""The curves a speed-up can be measured on (:func:`speed_curves`), and their names in the text."""


def speed_curves(result: ExperimentResult, quantity: str = "fcd") -> pd.DataFrame:
    """One value per run and evaluation, columns ``label, seed, step, value``: the ``fcd`` measured
    during training (:func:`fd_curves`) or the EMA model's loss on the fixed probe batch
    (``ema_loss``, the experiments that record it)."""
    if quantity == "fcd":
        return fd_curves(result).rename(columns={"fcd": "value"})
    if quantity != "ema_loss":
        raise ValueError(f"unknown quantity {quantity!r}; choose one of {', '.join(SPEED_QUANTITIES)}")
    probes = result.probes()
    rows = probes[probes.probe == "fixed_ema"]
    if rows.empty:
        raise ValueError("this result has no fixed-batch EMA loss: its experiment has ema_loss = False")
    return rows[["label", "seed", "step", "value"]].reset_index(drop=True)


def speed_target(curves: pd.DataFrame, baseline: str = "none", at: float = SPEED_AT) -> float:
    """The declared target (:data:`SPEED_AT`): the baseline's median over seeds of ``value`` at the
    evaluation nearest ``at`` times the last step of ``curves`` (:func:`speed_curves`)."""
    base = curves[curves.label == baseline]
    if base.empty:
        raise ValueError(f"no runs labelled {baseline!r}; labels: {list(dict.fromkeys(curves.label))}")
    if not 0 < at <= 1:
        raise ValueError(f"at must be a fraction of training in (0, 1], got {at!r}")
    steps = base.step.unique()
    step = steps[abs(steps - at * curves.step.max()).argmin()]
    return float(base[base.step == step].value.median())


def steps_to_target(curves: pd.DataFrame, target: float, baseline: str = "none",
                    length: float | None = None) -> pd.DataFrame:
    """How many steps each run of ``curves`` (:func:`speed_curves`) needs to reach ``target`` or
    below (:func:`steps_to_reach`), beside its baseline run of the same seed: runs with the same seed
    share initial weights and data order. ``speedup`` is the baseline's steps over the run's (above
    1 is faster); a run that never gets there is not ``reached``, and ``length`` (default: the last
    step of ``curves``, the planned training) is a lower bound on the steps it would need.

    Columns: ``label, seed, target, steps, reached, base_steps, last, speedup``.
    """
    import pandas as pd

    length = float(curves.step.max()) if length is None else float(length)
    reach = {key: steps_to_reach(c.step.tolist(), c.value.tolist(), target)
             for key, c in curves.sort_values("step").groupby(["label", "seed"], sort=False)}
    if not any(label == baseline for label, _ in reach):
        raise ValueError(f"no runs labelled {baseline!r}; labels: {list(dict.fromkeys(curves.label))}")
    frame = pd.DataFrame([{"label": label, "seed": seed, "target": target, "steps": steps,
                           "reached": math.isfinite(steps), "base_steps": reach.get((baseline, seed), math.nan),
                           "last": length} for (label, seed), steps in reach.items()])
    return frame.assign(speedup=frame.base_steps / frame.steps)


def speedup(result: ExperimentResult, quantity: str = "fcd", baseline: str = "none",
            at: float = SPEED_AT) -> pd.DataFrame:
    """The paper's "faster training" on ``result``: :func:`steps_to_target` of its ``quantity``
    curves to the declared target (:func:`speed_target`), with each run's ``diverged_at``; a run
    that never gets there counts at the planned length of training."""
    curves = speed_curves(result, quantity)
    table = steps_to_target(curves, speed_target(curves, baseline, at), baseline, result.spec["profile"]["steps"])
    diverged = {(r["label"], r["run"]["seed"]): r["diverged_at"] for r in result.runs}
    return table.assign(diverged_at=[diverged.get(key) for key in zip(table.label, table.seed)])


def speedup_verdict(speed: pd.DataFrame, label: str, margin: float = 0.05) -> tuple[str, PairedTest]:
    """What :func:`speedup` says about "``label`` trains faster than the baseline": the measured
    text and the paired test of the log steps each seed needed to reach the target (method against
    baseline, margin ``log(1 + margin)``). A run that never gets there is counted at the run's
    length, a lower bound on the steps it would need: the test is then ``censored`` (it can still
    find the method faster or slower, but never call the difference absent). A run already at the
    target at a step-0 probe counts as needing one step (a log needs a positive count)."""
    import numpy as np

    rows = speed[speed.label == label]
    if rows.empty:
        raise KeyError(f"no runs labelled {label!r}; labels: {list(dict.fromkeys(speed.label))}")
    bound = rows["last"]
    base, steps = rows.base_steps.fillna(bound), rows.steps.where(rows.reached, bound)
    base, steps = base.clip(lower=1), steps.clip(lower=1)  # there at the step-0 probe: no step needed
    unreached = int((~rows.reached | rows.base_steps.isna()).sum())
    test = replace(paired_test(np.log(base), np.log(steps), math.log1p(margin), "less"), censored=unreached)
    lo, hi = (math.exp(-v) for v in test.ci[::-1])
    n = len(rows)
    text = f"speed-up {math.exp(-test.estimate):.2f}× [{lo:.2f}, {hi:.2f}] to reach {rows.target.iloc[0]:.3g}, n = {n}"
    if unreached:
        text += f" ({unreached} of {n} pairs with a run that never gets there: counted at the run's length)"
    return text, test


def speedup_claim(chapter: int, paper: str, speed: pd.DataFrame, label: str, planned: int, *,
                  baseline: str = "none", margin: float = 0.05, family: str = "") -> Claim:
    """The claims-table line of "``label`` trains faster than ``baseline``" (:func:`speedup_verdict`)
    on ``speed``, a table of :func:`speedup` (of the runs finished so far: :func:`landed` with it as
    ``measure``, empty while none has), on the seeds both arms have finished out of the ``planned``
    ones: *undecided* until all have landed, and without a test while fewer than two have; in the
    Holm ``family`` given (as :func:`paired_claim`). The target still reads every finished baseline
    run (:func:`speed_target`)."""
    from .ledger import Claim

    rows = _paired_seeds(speed, label, baseline, {}, arm="label")
    n = rows.seed.nunique()
    if n < 2:
        return replace(landing_claim(chapter, paper, n, planned), family=family)
    text, test = speedup_verdict(rows, label, margin)
    return Claim(chapter, paper, text, test=test, margin=f"{margin:.0%}", planned=planned, family=family)


def geometric_fit(kappas: Sequence[float]) -> tuple[float, float, float]:
    """Fit the CS profile ``kappa_i = a * kappa ** (i - 1)`` (paper Eq. 8, with a free level ``a``)
    to effective coefficients ``kappa_1 .. kappa_N`` by least squares on ``log kappa_i``.

    The free level matters for LS: a decoder's merge can absorb any common factor, so only the
    decay from skip to skip is comparable with CS. Returns ``(kappa, a, r2)``, ``r2`` the share
    of the variance of ``log kappa_i`` the line explains (1 for an exact geometric profile;
    ``NaN`` when the coefficients are all equal, which a flat line, kappa = 1, fits exactly).
    """
    y = torch.as_tensor(kappas, dtype=torch.float64)
    if y.ndim != 1 or len(y) < 2 or not (torch.isfinite(y) & (y > 0)).all():
        raise ValueError(f"need at least two positive finite coefficients kappa_1 .. kappa_N, got {list(kappas)}")
    y = y.log()
    x = torch.arange(len(y), dtype=torch.float64)
    slope = ((x - x.mean()) * (y - y.mean())).sum() / (x - x.mean()).square().sum()
    level = y.mean() - slope * x.mean()
    total = (y - y.mean()).square().sum()
    r2 = 1 - (y - level - slope * x).square().sum() / total if total > 0 else torch.tensor(math.nan)
    return math.exp(slope), math.exp(level), float(r2)


def fitted_kappas(result: ExperimentResult, labels: Sequence[str]) -> pd.DataFrame:
    """Per run of the learnable methods ``labels`` (e.g. ``"LS"``): :func:`geometric_fit` of its
    effective coefficients ``kappa_1 .. kappa_N`` at the last probe, the CS rate that would give
    the same decay from skip to skip. Columns ``label, seed, kappa, level, r2``."""
    import pandas as pd

    probes = result.probes()
    gates = probes[(probes.probe == "features") & (probes.quantity == "kappa") & probes.label.isin(labels)]
    if gates.empty:
        raise ValueError(f"no learned coefficients of {list(labels)} in this result; its methods are "
                         f"{list(dict.fromkeys(probes.label))}")
    last = gates[gates.step == gates.step.max()]
    rows = [dict(zip(("kappa", "level", "r2"), geometric_fit(run.sort_values("skip").value.tolist())),
                 label=label, seed=seed) for (label, seed), run in last.groupby(["label", "seed"], sort=False)]
    return pd.DataFrame(rows)[["label", "seed", "kappa", "level", "r2"]]


__all__ = ["BREAKDOWN_LOSS", "BREAKDOWN_MARGIN", "FIG1", "LATE", "SPEED_AT", "SPEED_QUANTITIES", "SPIKE", "VERDICTS",
           "ConfirmationRuns", "MethodSummary", "adam_table", "breakdown_claim", "breakdown_rates", "breakdown_scale",
           "by_method", "compare", "compare_breakdowns", "complete_seeds", "confirmation", "confirmation_power",
           "confirmations", "confident_samples", "curves_by_backbone", "early_speed_claims", "fd_curves",
           "feature_constants", "feature_ranges", "features", "fig1_paths", "fitted_kappas", "geometric_fit",
           "gradient_constants", "interaction_claim", "join_baseline", "landed", "landing_claim", "method_of",
           "output_constants", "paired_claim", "rate_text", "ratio_text", "robustness_table", "run_table",
           "seed_means", "seed_ratios", "seeds_landed", "select", "speed_curves", "speed_target", "speedup",
           "speedup_claim", "speedup_verdict", "spread_by", "steps_to_reach", "steps_to_target", "stress_scale",
           "trajectories", "trajectory", "trend", "xt_norm_ratio"]
