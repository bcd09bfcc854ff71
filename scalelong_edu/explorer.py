"""The kappa explorer that runs in the reader's browser, with no Python kernel.

:func:`kappa_explorer_chart` returns a Vega-Altair chart: a Vega-Lite specification whose
sliders (N, kappa) and menu (the method) are bound to Vega parameters, so that the chart is
recomputed by Vega expressions in the page itself. A notebook cell that ends with the chart stores
it as HTML that loads Vega, Vega-Lite and vega-embed, so the static book stays interactive; the
ipywidgets explorer of :mod:`.widgets` remains the one for live kernels (it also shows LS).

What it draws is what :func:`scalelong_edu.widgets.plot_kappas` draws: the total factor on the
path through every long skip i = 1 .. N of the paper's Eq. (3) (``kappa_i`` itself for the
skip-scaling methods, the paper's Eq. (8) ``kappa_i = kappa ** (i - 1)`` for CS), the factor on the
bottleneck path, and ``sum_i kappa_i^2`` (Theorem 3.1's factor on ``||x_t||^2``) against the band
:data:`scalelong_edu.theory.SUM_KAPPA2_BAND`. :data:`SKIP_PATH_EXPR` and
:data:`BOTTLENECK_EXPR` restate :func:`scalelong_edu.scaling.path_factors` in Vega's expression
language; the tests hold them to it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .plotting import METHOD_COLORS
from .scaling import check_kappa, check_n_skips
from .theory import SUM_KAPPA2_BAND, check_band
from .widgets import CONSTANT_METHODS, METHOD_LABELS

if TYPE_CHECKING:
    import altair as alt

SKIP_PATH_EXPR = {
    "none": "1",
    "sqrt2-cs": "1 / sqrt(2)",
    "cs": "pow(kappa, datum.i - 1)",  # the paper's Eq. (8)
    "block-output": "pow(kappa, datum.i - 1)",  # eta at each of the i - 1 merges above skip i
}
"""Vega expressions of the total factor on the path through skip ``datum.i``, per method, in the
parameters ``kappa`` (the CS base, or ``eta`` for block-output) and ``N``."""

BOTTLENECK_EXPR = {"none": "1", "sqrt2-cs": "1", "cs": "1", "block-output": "pow(kappa, N)"}
"""Vega expressions of the factor on the bottleneck path, per method."""

FORMULAS = {
    "none": "none: κᵢ = 1 on every skip",
    "sqrt2-cs": "1/√2-CS: κᵢ = 1/√2 on every skip",
    "cs": "CS (paper Eq. 8): κᵢ = κ^(i−1)",
    "block-output": "block-output: stream × η at every merge,\nso path i gets η^(i−1), bottleneck η^N",
}
"""The line above the bars that says what each method does (``\\n`` breaks it)."""

GREEN, RED = "#1a9850", "#d73027"  # inside / outside the band, as in plot_kappas
MAX_WIDTH = 340
"""Pixels: the widest chart that fits a 390 px phone screen beside the page margins."""


def _by_method(expressions: dict[str, str]) -> str:
    """One Vega expression that picks ``expressions[method]`` by the ``method`` parameter."""
    *first, last = CONSTANT_METHODS
    branches = "".join(f"method === '{m}' ? ({expressions[m]}) : " for m in first)
    return f"{branches}({expressions[last]})"


def _controls(method: str, kappa: float, n: int, n_max: int) -> list[alt.Parameter]:
    """The parameters ``method``, ``kappa`` and ``N``, bound to a menu and two sliders."""
    import altair as alt

    return [
        alt.param(name="method", value=method, bind=alt.binding_select(
            options=list(CONSTANT_METHODS), labels=[METHOD_LABELS[m] for m in CONSTANT_METHODS], name="method ")),
        alt.param(name="kappa", value=kappa, bind=alt.binding_range(
            min=0.05, max=max(1.5, kappa), step=0.01, name="κ (η for block-output) ")),
        alt.param(name="N", value=n, bind=alt.binding_range(min=1, max=n_max, step=1, name="N, long skips ")),
    ]


def _paths(n_max: int, lo: float, hi: float) -> alt.Chart:
    """Rows i = 1 .. N + 1 (the skips, then the bottleneck) with the path ``factor``, its colour, and
    the sum ``total`` of the squared skip factors and whether it is ``inside`` [lo, hi]."""
    import altair as alt

    return (
        alt.Chart(alt.sequence(1, n_max + 2, as_="i"))
        .transform_filter("datum.i <= N + 1")
        .transform_calculate(
            skip="datum.i <= N",
            factor=f"datum.i <= N ? ({_by_method(SKIP_PATH_EXPR)}) : ({_by_method(BOTTLENECK_EXPR)})",
            color=_by_method({m: f"'{METHOD_COLORS[m]}'" for m in CONSTANT_METHODS}),
        )
        .transform_calculate(k2="datum.skip ? datum.factor * datum.factor : 0")
        .transform_joinaggregate(total="sum(k2)")
        .transform_calculate(inside=f"datum.total >= {lo} && datum.total <= {hi}")
    )


def _profile(paths: alt.Chart) -> alt.LayerChart:
    """A bar per path with its factor, labelled when N <= 8; the bottleneck bar ``B`` paler."""
    import altair as alt

    x = alt.X("i:O", title="long skip i (1 = outermost), B = bottleneck",
              axis=alt.Axis(labelExpr="datum.value > N ? 'B' : datum.label", labelAngle=0))
    bars = paths.mark_bar().encode(
        x=x,
        y=alt.Y("factor:Q", title="total factor on the path", scale=alt.Scale(zero=True)),
        color=alt.Color("color:N", scale=None),
        opacity=alt.condition("datum.skip", alt.value(1.0), alt.value(0.35)),
        tooltip=[alt.Tooltip("i:O", title="path"), alt.Tooltip("factor:Q", title="factor", format=".4~g")],
    )
    values = paths.transform_filter("N <= 8").mark_text(dy=-6, fontSize=11).encode(
        x=x, y="factor:Q", text=alt.Text("factor:Q", format=".3~g"))
    return bars + values


def _text_line(paths: alt.Chart, expression: str, **mark) -> alt.Chart:
    """One line of text, computed by ``expression`` from the first row, at the view's top left."""
    import altair as alt

    return paths.transform_filter("datum.i == 1").transform_calculate(text=expression).mark_text(
        align="left", baseline="top", **mark).encode(x=alt.value(0), y=alt.value(0), text="text:N")


def _gauge(paths: alt.Chart, lo: float, hi: float) -> alt.LayerChart:
    """``sum_i kappa_i^2`` as a marker on a log axis over the shaded band [lo, hi]."""
    import altair as alt

    scale = alt.Scale(type="log", domain=[0.25, 64], clamp=True)
    band = alt.Chart(alt.Data(values=[{"lo": lo, "hi": hi}])).mark_rect(color=GREEN, opacity=0.3).encode(
        x=alt.X("lo:Q", scale=scale, title="Σκᵢ² (log scale), the band shaded",
                axis=alt.Axis(values=[0.25, lo, hi, 16, 64], format="~g")),
        x2="hi:Q")
    marker = paths.transform_filter("datum.i == 1").mark_rule(size=4).encode(
        x=alt.X("total:Q", scale=scale), color=alt.condition("datum.inside", alt.value(GREEN), alt.value(RED)))
    return band + marker


def kappa_explorer_chart(method: str = "cs", kappa: float = 0.5, n_skips: int = 6, *, n_max: int = 16,
                         band: tuple[float, float] = SUM_KAPPA2_BAND, width: int = 300) -> alt.VConcatChart:
    """The kappa explorer as a Vega-Lite chart whose controls work in a static web page.

    Three controls: the number of long skips ``N`` (1 .. ``n_max``), ``kappa`` (the CS base of the
    paper's Eq. 8, ``kappa_i = kappa ** (i - 1)``; ``eta`` for block-output) and the method (none,
    1/sqrt(2)-CS, CS, block-output). Vega recomputes, in the browser: a bar per path of Eq. (3)
    with its total factor (skips i = 1 .. N, then ``B``, the bottleneck), and ``sum_i kappa_i^2`` over
    the skips as a marker on a log scale against ``band``, green inside it and red outside.

    Args:
        method: the initial method, one of :data:`scalelong_edu.widgets.CONSTANT_METHODS`.
        kappa: the initial ``kappa`` (> 0); the slider spans 0.05 .. 1.5, widened to include it.
        n_skips: the initial ``N`` (1 .. ``n_max``).
        n_max: the largest ``N`` the slider offers.
        band: the target band for ``sum_i kappa_i^2``; by default the book's, from the paper's Section 4.1.
        width: the chart's width in pixels, at most :data:`MAX_WIDTH` so that it fits a phone.

    Raises:
        ValueError: an unknown method, ``kappa <= 0``, ``N`` outside 1 .. ``n_max``, a bad band or width.
    """
    import altair as alt

    if method not in CONSTANT_METHODS:
        raise ValueError(f"the browser explorer shows the constant methods {', '.join(CONSTANT_METHODS)}; got "
                         f"{method!r} (LS gates need a model: use scalelong_edu.widgets.kappa_explorer)")
    kappa, n, n_max = check_kappa(kappa), check_n_skips(n_skips), check_n_skips(n_max)
    if n > n_max:
        raise ValueError(f"n_skips={n} exceeds n_max={n_max}: raise n_max or lower n_skips")
    lo, hi = check_band(band)
    if not 120 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be 120 .. {MAX_WIDTH} px (a phone shows about {MAX_WIDTH}), got {width}")

    paths = _paths(n_max, lo, hi)
    formula = _text_line(paths, _by_method({m: json.dumps(f) for m, f in FORMULAS.items()}),
                         lineBreak="\n", fontSize=12)
    verdict = _text_line(
        paths, f"'Σκᵢ² = ' + format(datum.total, '.4~g') + (datum.inside ? ', inside' : ', outside')"
               f" + ' the band [{lo:g}, {hi:g}]'", fontSize=13, fontWeight="bold",
    ).encode(color=alt.condition("datum.inside", alt.value(GREEN), alt.value(RED)))
    return alt.vconcat(
        formula.properties(width=width, height=32),
        _profile(paths).properties(width=width, height=150),
        verdict.properties(width=width, height=18),
        _gauge(paths, lo, hi).properties(width=width, height=16),
        spacing=6,
    ).add_params(*_controls(method, kappa, n, n_max)).properties(
        usermeta={"embedOptions": {"actions": False, "renderer": "svg"}},
    ).configure_view(stroke=None).configure_axis(labelFontSize=12, titleFontSize=12)
