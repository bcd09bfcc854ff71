"""Sweeps: one row per run over depth, kappa and learning rate, summaries and a stability map.

Chapter 8 asks how the methods behave as a setting changes: the number of long skips ``N``, the
CS base ``kappa`` (or the block-output ``eta``), the learning rate. Its experiments
(``depth-uvit``, ``depth-unet``, ``kappa-grid``, ``block-output``, ``stability-map``) label every run
``"<method>, N=<n>[, lr x<k>]"``; :func:`sweep_table` turns any of them into one frame with the
setting as columns, so that a study is a ``groupby``:

* :func:`summarize` gives mean and 95% interval over seeds of one column per setting, counting
  diverged runs instead of averaging them;
* :func:`stability_map` gives, per method, the share of seeds whose training was unstable (it
  diverged, it ended far from trained, or its hidden features oscillated far more than in
  gentle training) at each learning rate and depth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .evidence import MethodSummary, by_method, run_table
from .models import PRESETS
from .scaling import path_factors
from .stats import mean_se
from .theory import sum_kappa_squared

if TYPE_CHECKING:
    import pandas as pd

    from .experiments import ExperimentResult

BREAKDOWN_LOSS = 0.5
"""A final training loss at or above this counts as a breakdown. Predicting zero noise scores
``E||eps||^2 / m = 1``; a model above 0.5 explains less than half of the noise it must predict,
while every gentle run of chapter 8 (400 steps) ends below 0.36."""
OSC_FACTOR = 3.0
"""A run whose feature oscillation is this many times the median of the gentle runs of its depth
counts as unstable (:func:`oscillation_limit`), even when its loss is fine."""


def n_skips(run: dict, preset: str) -> int:
    """The number of long skips ``N`` of a run record's model (``run`` as cached: its
    ``model_overrides`` applied to the profile's ``preset``)."""
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


def sweep_table(*results: ExperimentResult) -> pd.DataFrame:
    """One row per run of ``results``: :func:`scalelong_edu.evidence.run_table`'s numbers with
    the run's setting and its final Frechet distance.

    Added columns: ``experiment, backbone, method`` (the label before ``", N="``), ``scaling``
    and ``kappa`` (the method's name and base), ``N``, ``lr_scale``, ``lr``, ``sum_kappa2``
    (:func:`sum_kappa2`), ``fcd`` (the last Frechet distance measured in training, ``NaN``
    without one or when the run diverged) and ``wall_time_s`` (the run's training time).
    """
    import pandas as pd

    frames = []
    for result in results:
        table = run_table(result)
        rows = []
        for record in result.runs:
            run = record["run"]
            preset = result.spec["profile"][run["backbone"]]
            n = n_skips(run, preset)
            fd = record.get("fd", {}).get("fcd", [])
            rows.append({"experiment": result.spec["experiment"]["name"], "backbone": run["backbone"],
                         "method": record["label"].split(", N=")[0], "scaling": run["method"],
                         "kappa": run["kappa"], "N": n, "lr_scale": run["lr_scale"], "lr": run["lr"],
                         "sum_kappa2": sum_kappa2(run["method"], run["kappa"], n),
                         "fcd": fd[-1] if fd and record["diverged_at"] is None else math.nan,
                         "wall_time_s": record["wall_time_s"]})
        frames.append(pd.concat([pd.DataFrame(rows), table.drop(columns="label")], axis=1))
    return pd.concat(frames, ignore_index=True)


def summarize(table: pd.DataFrame, column: str, by: Sequence[str] = ("backbone", "method", "N")) -> pd.DataFrame:
    """Mean and 95% interval over seeds of ``column`` of :func:`sweep_table` for each setting ``by``.

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
            summary = mean_se(values)
            mean, (lo, hi) = summary.mean, summary.interval()
        elif values:
            mean = values[0]
        rows.append({**dict(zip(by, key)), "mean": mean, "lo": lo, "hi": hi, "finished": len(values),
                     "diverged": int(group.diverged_at.notna().sum()), "runs": len(group)})
    return pd.DataFrame(rows)


def paired_differences(table: pd.DataFrame, column: str, baseline: str = "none",
                       by: Sequence[str] = ("backbone", "N")) -> pd.DataFrame:
    """Per run of every method but ``baseline``: its ``column`` minus that of the baseline's run
    with the same seed and setting ``by`` (the run's row of ``table`` with a ``diff`` column).

    Runs of one experiment with the same seed and setting start from the same weights and see the
    same batches (the seed fixes both; LS's calibration networks are created after the backbone),
    so most of what separates seeds cancels in the difference."""
    keys = [*by, "seed"]
    base = table[table.method == baseline][[*keys, column]].rename(columns={column: "base"})
    if base.empty:
        raise ValueError(f"no runs of the baseline {baseline!r}; methods: {list(dict.fromkeys(table.method))}")
    pairs = table[table.method != baseline].merge(base, on=keys)
    return pairs.assign(diff=pairs[column] - pairs.base).drop(columns="base")


def paired(table: pd.DataFrame, column: str, baseline: str = "none",
           by: Sequence[str] = ("backbone", "N")) -> pd.DataFrame:
    """:func:`paired_differences` summarised per setting ``by`` and method. Columns: ``by``,
    ``method``, ``mean, lo, hi`` (95% interval over the pairs; ``NaN`` below two pairs) and
    ``pairs`` (the seeds where both runs finished)."""
    out = summarize(paired_differences(table, column, baseline, by), "diff", by=(*by, "method"))
    return out.drop(columns=["diverged", "runs"]).rename(columns={"finished": "pairs"})


def paired_verdict(row: pd.Series) -> str:
    """Whether a :func:`paired` difference says "the method is below the baseline": ``"reproduced"``
    when its interval lies below 0, ``"contradicted"`` above 0, else ``"not at this scale"``."""
    if not row.hi < 0 and not row.lo > 0:  # overlaps 0, or no interval (NaN)
        return "not at this scale"
    return "reproduced" if row.hi < 0 else "contradicted"


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


def select(table: pd.DataFrame, **where: object) -> pd.DataFrame:
    """The rows of ``table`` whose columns equal the given values, e.g. ``select(t, N=8, method="LS")``."""
    mask = np.ones(len(table), dtype=bool)
    for column, value in where.items():
        if column not in table.columns:
            raise KeyError(f"no column {column!r}; the sweep table has {list(table.columns)}")
        mask &= (table[column] == value).to_numpy()
    return table[mask]


def method_summary(table: pd.DataFrame, column: str, **where: object) -> MethodSummary:
    """``column`` over the runs of one setting (:func:`select`), summarised as in the comparisons
    of chapters 3-7 (:func:`scalelong_edu.evidence.by_method`), so that
    :func:`scalelong_edu.evidence.verdict` can compare two settings."""
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
    gentle = table[(table.lr_scale == 1) & table.feature_osc.notna()]
    medians = gentle.groupby("N").feature_osc.median()
    return (factor * medians).reindex(sorted(table.N.unique())).rename("osc_limit")


def unstable(table: pd.DataFrame, limit: float = BREAKDOWN_LOSS, osc_limit: pd.Series | None = None) -> pd.Series:
    """Per run of :func:`sweep_table`: True when it diverged, ended with a loss of at least
    ``limit`` (it broke down), or, with ``osc_limit`` (a limit per ``N``, :func:`oscillation_limit`),
    its feature oscillation reached the limit of its depth."""
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


def stability_verdict(stability: pd.DataFrame, method: str, baseline: str = "none") -> tuple[str, str]:
    """Whether ``method`` is unstable less often than ``baseline`` over all settings of a
    :func:`stability_map`, by Fisher's exact test on the pooled counts (two-sided, 5%): the
    measured text (``"<method's>/<runs> vs <baseline's>/<runs> unstable, Fisher p = ..."``) and
    ``"reproduced"``, ``"contradicted"`` or ``"not at this scale"``."""
    from scipy.stats import fisher_exact

    counts = stability.groupby("method")[["unstable", "runs"]].sum()
    for name in (method, baseline):
        if name not in counts.index:
            raise KeyError(f"no method {name!r} in the map; it has {list(counts.index)}")
    (a, n), (b, m) = counts.loc[method], counts.loc[baseline]
    p = float(fisher_exact([[a, n - a], [b, m - b]]).pvalue)
    text = f"{a}/{n} vs {b}/{m} unstable, Fisher p = {p:.2g}"
    if p >= 0.05:
        return text, "not at this scale"
    return text, "reproduced" if a / n < b / m else "contradicted"


__all__ = ["BREAKDOWN_LOSS", "OSC_FACTOR", "method_summary", "n_skips", "optimum", "oscillation_limit", "paired",
           "paired_differences", "paired_verdict", "select", "stability_map", "stability_verdict", "summarize",
           "sum_kappa2", "sweep_table", "unstable"]
