"""Sweeps: the methods across depth, kappa and learning rate, summaries and a stability map.

Chapter 8 asks how the methods behave as a setting changes: the number of long skips ``N``, the
CS base ``kappa`` (or the block-output ``eta``), the learning rate. Its experiments
(``depth-uvit``, ``depth-unet``, ``kappa-grid``, ``block-output``, ``stability-map``) label every run
``"<method>, N=<n>[, lr x<k>]"``; :func:`scalelong_edu.evidence.run_table` turns any of them into
one frame with the setting as columns, so that a study is a ``groupby``:

* :func:`summarize` gives mean and 95% interval over seeds of one column per setting, counting
  diverged runs instead of averaging them;
* :func:`paired` tests every method against a baseline at every setting, paired by seed
  (:func:`scalelong_edu.evidence.compare`);
* :func:`stability_map` gives, per method, the share of seeds whose training was unstable (it
  diverged, it ended far from trained, or its hidden features oscillated far more than in
  gentle training) at each learning rate and depth; :func:`stability_verdict` tests it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .evidence import BREAKDOWN_LOSS, BREAKDOWN_MARGIN, MethodSummary, by_method, compare, join_baseline, select
from .models import PRESETS
from .scaling import path_factors
from .stats import RateTest, mean_se, paired_rates
from .theory import check_number, sum_kappa_squared

if TYPE_CHECKING:
    import pandas as pd

    from .experiments import ExperimentResult

OSC_FACTOR = 3.0
"""A run whose feature oscillation is this many times the median of the gentle runs of its depth
counts as unstable (:func:`oscillation_limit`), even when its loss is fine."""


def n_skips(run: dict, preset: str) -> int:
    """The number of long skips ``N`` of a run record's model (``run`` as cached: its
    ``model_overrides`` applied to the profile's ``preset``)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}: give the profile's preset for the run's backbone, "
                         f"one of {', '.join(PRESETS)}")
    kwargs = {**PRESETS[preset][1], **dict(run["model_overrides"])}
    if "depth" in kwargs:
        return kwargs["depth"] // 2
    return len(kwargs["channel_mults"]) * kwargs["blocks_per_level"]


def sum_kappa2(method: str, kappa: float, n: int) -> float:
    """``sum_i kappa_i^2`` over the ``N`` skip paths (Theorem 3.1's factor) of a constant method,
    from the total factor on each path (:func:`scalelong_edu.scaling.path_factors`); ``NaN`` for
    LS, whose ``kappa_i`` are learned."""
    if method in ("ls", "ls-per-skip"):
        return math.nan
    return sum_kappa_squared(path_factors(method, kappa, n)[:n])


def summarize(table: pd.DataFrame, column: str, by: Sequence[str] = ("backbone", "method", "N"),
              log: bool = False) -> pd.DataFrame:
    """Mean and 95% interval over seeds of ``column`` of :func:`scalelong_edu.evidence.run_table`
    for each setting ``by``; with ``log``, the geometric mean and the interval of the mean log, for a
    positive quantity (a loss, an oscillation) whose interval must stay above zero.

    Columns: ``by``, ``mean, lo, hi`` (``NaN`` when fewer than two runs finished), ``finished``,
    ``diverged`` and ``runs``. Settings keep the order in which they first appear.
    """
    import pandas as pd

    if column not in table.columns:
        raise KeyError(f"no column {column!r}; the sweep table has {list(table.columns)}")
    rows = []
    for key, group in table.groupby(list(by), sort=False):
        values = [v for v in group[column] if math.isfinite(v)]
        lo = hi = mean = math.nan
        if len(values) >= 2:
            summary = mean_se([math.log(v) for v in values] if log else values)
            mean, (lo, hi) = summary.mean, summary.interval()
            if log:
                mean, lo, hi = math.exp(mean), math.exp(lo), math.exp(hi)
        elif values:
            mean = values[0]
        rows.append({**dict(zip(by, key)), "mean": mean, "lo": lo, "hi": hi, "finished": len(values),
                     "diverged": int(group.diverged_at.notna().sum()), "runs": len(group)})
    return pd.DataFrame(rows)


def paired_differences(table: pd.DataFrame, column: str, baseline: str = "none",
                       by: Sequence[str] = ("backbone", "N")) -> pd.DataFrame:
    """Per run of every method but ``baseline``: its ``column`` minus that of the baseline's run
    with the same seed and setting ``by`` (the run's row of ``table`` with a ``diff`` column), for
    figures. Runs of one experiment with the same seed and setting start from the same weights and
    see the same batches, so most of what separates seeds cancels in the difference.

    Raises:
        ValueError: a (setting, method, seed) with more than one run (:func:`check_one_run_each`).
    """
    check_one_run_each(table, by)
    pairs = join_baseline(table, column, baseline, by=by)
    pairs = pairs[pairs.method != baseline]
    return pairs.assign(diff=pairs[column] - pairs.base).drop(columns="base")


def check_one_run_each(table: pd.DataFrame, by: Sequence[str]) -> None:
    """A ValueError, naming the rows, when two rows of ``table`` share a setting ``by``, a method and
    a seed (e.g. two experiments with a common setting in one table, or one result passed twice):
    paired by seed, they would count as several pairs of one seed."""
    keys = [*by, "method", "seed"]
    missing = [k for k in keys if k not in table.columns]
    if missing:
        raise KeyError(f"no column {missing[0]!r}; the sweep table has {list(table.columns)}")
    duplicated = table.duplicated(keys, keep=False)
    if not duplicated.any():
        return
    first = table[duplicated].iloc[0]
    same = table[duplicated & (table[keys] == first[keys]).all(axis=1)]
    source = f" (experiments {list(same.experiment)})" if "experiment" in table.columns else ""
    setting = "".join(f", {k}={first[k]}" for k in by)
    raise ValueError(f"{int(duplicated.sum())} rows share a (setting, method, seed) with another row, e.g. rows "
                     f"{list(same.index)}{source}: method {first.method!r}, seed {first.seed}{setting}; "
                     "a pair must be one run each: select one experiment (select(table, experiment=...)) or add the "
                     "setting that tells them apart to by (e.g. 'lr_scale')")


def paired(table: pd.DataFrame, column: str, baseline: str = "none", by: Sequence[str] = ("backbone", "N"),
           margin: float = 0.05, direction: str = "less", log: bool = True) -> pd.DataFrame:
    """Every method against ``baseline`` at every setting ``by``, paired by seed
    (:func:`scalelong_edu.evidence.compare` with ``margin``, ``direction`` and ``log``).

    Columns: ``by``, ``method``, ``estimate``, ``lo``, ``hi`` (the method's value over the
    baseline's, a ratio with ``log=True``, else the difference, with its 95% interval), ``p``,
    ``pairs``, ``verdict`` (before any family correction) and ``test`` (the
    :class:`scalelong_edu.stats.PairedTest`, for :func:`scalelong_edu.ledger.publish`).

    Raises:
        ValueError: a (setting, method, seed) with more than one run (:func:`check_one_run_each`).
    """
    import pandas as pd

    check_one_run_each(table, by)
    rows = []
    for key, group in table.groupby(list(by), sort=False):
        where = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for method in dict.fromkeys(group.method):
            if method == baseline:
                continue
            test = compare(group, column, method, baseline, margin=margin, direction=direction, log=log)
            estimate, (lo, hi) = test.estimate, test.ci
            if log:
                estimate, lo, hi = math.exp(estimate), math.exp(lo), math.exp(hi)
            rows.append({**where, "method": method, "estimate": estimate, "lo": lo, "hi": hi, "p": test.p,
                         "pairs": test.n, "verdict": test.verdict, "test": test})
    return pd.DataFrame(rows)


def optimum(summary: pd.DataFrame, x: str) -> tuple[float, set[float]]:
    """The setting ``x`` with the lowest mean in a :func:`summarize` frame, among the settings with
    an interval, and every setting whose 95% interval overlaps the best one's (the best included):
    the values the runs cannot tell from the best. Settings without an interval (fewer than two
    finished runs) are in neither."""
    ok = summary[summary.lo.notna()]
    if ok.empty:
        raise ValueError(f"no setting of {x!r} has an interval (each needs two finished runs)")
    best = ok.loc[ok["mean"].idxmin()]
    tied = ok[(ok.lo <= best.hi) & (ok.hi >= best.lo)]
    return float(best[x]), {float(v) for v in tied[x]}


def method_summary(table: pd.DataFrame, column: str, **where: object) -> MethodSummary:
    """``column`` over the runs of one setting (:func:`select`), summarised as in chapters 3-7
    (:func:`scalelong_edu.evidence.by_method`): mean and 95% interval, for figures and text."""
    rows = select(table, **where)
    if rows.empty:
        raise ValueError(f"no runs with {where}")
    label = str(where.get("method", ", ".join(f"{k}={v}" for k, v in where.items())))
    return by_method(rows.assign(label=label), column)[label]


def oscillation_limit(table: pd.DataFrame, factor: float = OSC_FACTOR) -> pd.Series:
    """Per depth ``N`` of ``table``: ``factor`` times the median feature oscillation of its gentle
    runs (``lr_scale == 1``) at that depth. Oscillation grows with depth under every method
    (chapter 8), so a run is compared with ordinary training of the same depth. ``NaN`` for a depth
    without a gentle run that has an oscillation (runs too short to measure one, as at the ``ci``
    profile): no run of that depth then counts as oscillating."""
    factor = check_number(factor, "factor", 0, above=True, hint=" (times the gentle runs' median oscillation)")
    gentle = table[(table.lr_scale == 1) & table.feature_osc.notna()]
    medians = gentle.groupby("N").feature_osc.median()
    return (factor * medians).reindex(sorted(table.N.unique())).rename("osc_limit")


def unstable(table: pd.DataFrame, limit: float = BREAKDOWN_LOSS, osc_limit: pd.Series | None = None) -> pd.Series:
    """Per run of :func:`scalelong_edu.evidence.run_table`: True when it diverged, ended with a loss of at least
    ``limit`` (it broke down), or, with ``osc_limit`` (a limit per ``N``, :func:`oscillation_limit`),
    its feature oscillation reached the limit of its depth."""
    limit = check_number(limit, "limit", 0, above=True, hint=" (the final loss of a breakdown, e.g. the profile's "
                         "breakdown_loss)")
    out = table.diverged_at.notna() | (table.loss >= limit)
    if osc_limit is None:
        return out
    return out | (table.feature_osc >= table.N.map(osc_limit))


def stability_map(table: pd.DataFrame, limit: float = BREAKDOWN_LOSS,
                  osc_limit: pd.Series | None = None) -> pd.DataFrame:
    """The share of seeds that were :func:`unstable`, per ``method``, ``lr_scale`` and ``N``.

    Columns: ``method, lr_scale, N, unstable, runs, share`` (``share = unstable / runs``).
    """
    frame = table.assign(unstable=unstable(table, limit, osc_limit))
    out = frame.groupby(["method", "lr_scale", "N"], sort=False).unstable.agg(unstable="sum", runs="size")
    out = out.reset_index()
    return out.assign(unstable=out.unstable.astype(int), share=out.unstable / out.runs)


def stability_verdict(table: pd.DataFrame, method: str, baseline: str = "none", limit: float = BREAKDOWN_LOSS,
                      osc_limit: pd.Series | None = None, margin: float = BREAKDOWN_MARGIN) -> tuple[str, RateTest]:
    """Whether ``method`` is :func:`unstable` less often than ``baseline`` over the runs of
    ``table``, each (depth, learning rate, seed) one pair: the exact McNemar test of
    :func:`scalelong_edu.stats.paired_rates` (a rate above ``margin`` would matter). Returns the
    measured text (``"<method's>/<runs> vs <baseline's>/<runs> unstable, McNemar p = ..."``) and
    the test."""
    frame = table.assign(unstable=unstable(table, limit, osc_limit))
    keys = ["N", "lr_scale", "seed"]
    arms = []
    for name in (baseline, method):
        arm = frame[frame.method == name]
        if arm.empty:
            raise KeyError(f"no method {name!r} in the table; it has {list(dict.fromkeys(frame.method))}")
        if arm.duplicated(keys).any():
            raise ValueError(f"{name!r} has several runs for one (N, lr_scale, seed): select one experiment")
        arms.append(arm.set_index(keys).unstable)
    if set(arms[0].index) != set(arms[1].index):
        raise ValueError(f"{method!r} and {baseline!r} were not run at the same settings and seeds")
    order = sorted(arms[0].index)
    test = paired_rates(arms[0].loc[order].to_numpy(bool), arms[1].loc[order].to_numpy(bool), margin)
    (b, a), n = test.events, test.n
    return f"{a}/{n} vs {b}/{n} unstable, McNemar p = {test.p:.2g}", test


__all__ = ["OSC_FACTOR", "check_one_run_each", "method_summary", "n_skips", "optimum", "oscillation_limit", "paired",
           "paired_differences", "select", "stability_map", "stability_verdict", "summarize",
           "sum_kappa2", "unstable"]
