"""Tests of scalelong_edu.explorer: the kappa explorer as a Vega-Lite chart.

The chart computes in the browser; here its Vega expressions are evaluated in Python (they use
only ``pow``, ``sqrt``, arithmetic and the names ``kappa``, ``N``, ``datum.i``, which read the same
in both languages) and held to :func:`scalelong_edu.scaling.path_factors` and the sums of
:mod:`scalelong_edu.theory`. tests/test_book_html.py drives the same chart in Chromium.
"""

import json
import math
from types import SimpleNamespace

import pytest

from scalelong_edu.explorer import BOTTLENECK_EXPR, MAX_WIDTH, SKIP_PATH_EXPR, kappa_explorer_chart
from scalelong_edu.scaling import path_factors
from scalelong_edu.theory import SUM_KAPPA2_BAND, cs_sum_kappa_squared, sum_kappa_squared
from scalelong_edu.widgets import CONSTANT_METHODS

CASES = [(1, 0.5), (2, 0.7), (6, 0.5), (9, 0.95), (16, 1.2)]


def evaluate(expression: str, kappa: float, n: int, i: int) -> float:
    """A Vega expression of the explorer, evaluated in Python."""
    names = {"pow": pow, "sqrt": math.sqrt, "kappa": kappa, "N": n, "datum": SimpleNamespace(i=i)}
    return float(eval(expression, {"__builtins__": {}}, names))


def spec(**kwargs) -> dict:
    return kappa_explorer_chart(**kwargs).to_dict()


def find(node, key: str) -> list:
    """Every value stored under ``key`` anywhere in a spec."""
    if isinstance(node, dict):
        return ([node[key]] if key in node else []) + [v for value in node.values() for v in find(value, key)]
    if isinstance(node, list):
        return [v for value in node for v in find(value, key)]
    return []


def transforms(d: dict) -> list[dict]:
    return [t for ts in find(d, "transform") for t in ts]


def test_expressions_cover_exactly_the_constant_methods():
    assert set(SKIP_PATH_EXPR) == set(BOTTLENECK_EXPR) == set(CONSTANT_METHODS)


@pytest.mark.parametrize("method", CONSTANT_METHODS)
@pytest.mark.parametrize("n, kappa", CASES)
def test_expressions_give_the_packages_path_factors(method, n, kappa):
    skips = [evaluate(SKIP_PATH_EXPR[method], kappa, n, i) for i in range(1, n + 1)]
    bottleneck = evaluate(BOTTLENECK_EXPR[method], kappa, n, n + 1)
    assert skips + [bottleneck] == pytest.approx(path_factors(method, kappa, n), rel=1e-12)


@pytest.mark.parametrize("n, kappa", CASES)
def test_cs_sum_is_theorys_closed_form(n, kappa):
    """The sum the chart draws for CS is the paper's Eq. 8 summed: (1 - kappa^(2N)) / (1 - kappa^2)."""
    skips = [evaluate(SKIP_PATH_EXPR["cs"], kappa, n, i) for i in range(1, n + 1)]
    assert sum_kappa_squared(skips) == pytest.approx(cs_sum_kappa_squared(kappa, n), rel=1e-12)


def test_spec_binds_the_three_controls_with_their_initial_values():
    d = spec(method="block-output", kappa=0.7, n_skips=4, n_max=12)
    params = {p["name"]: p for p in d["params"]}
    assert set(params) == {"method", "kappa", "N"}
    assert params["method"]["value"] == "block-output"
    assert params["method"]["bind"]["input"] == "select"
    assert params["method"]["bind"]["options"] == list(CONSTANT_METHODS)
    assert (params["kappa"]["value"], params["kappa"]["bind"]["input"]) == (0.7, "range")
    assert (params["N"]["value"], params["N"]["bind"]["min"], params["N"]["bind"]["max"]) == (4, 1, 12)


def test_kappa_slider_widens_to_include_the_initial_value():
    params = {p["name"]: p for p in spec(kappa=2.5)["params"]}
    assert params["kappa"]["bind"]["max"] == 2.5


def test_chart_computes_in_the_browser_from_the_methods_expressions():
    d = spec(n_max=10)
    factor = {t["calculate"] for t in transforms(d) if t.get("as") == "factor"}
    assert len(factor) == 1
    (factor,) = factor
    for method in CONSTANT_METHODS:
        assert f"({SKIP_PATH_EXPR[method]})" in factor and f"({BOTTLENECK_EXPR[method]})" in factor
    assert factor.count("method === ") == 2 * (len(CONSTANT_METHODS) - 1)
    assert {"joinaggregate": [{"op": "sum", "field": "k2", "as": "total"}]} in transforms(d)
    assert {json.dumps(s) for s in find(d, "sequence")} == {json.dumps({"start": 1, "stop": 12, "as": "i"})}


def test_band_comes_from_theory_by_default_and_can_be_changed():
    lo, hi = SUM_KAPPA2_BAND
    inside = {t["calculate"] for t in transforms(spec()) if t.get("as") == "inside"}
    assert inside == {f"datum.total >= {lo} && datum.total <= {hi}"}
    text = json.dumps(spec(band=(2.0, 3.0)))
    assert "datum.total >= 2.0 && datum.total <= 3.0" in text and "the band [2, 3]" in text


def test_chart_fits_a_phone():
    d = spec()
    assert all(view["width"] <= MAX_WIDTH for view in d["vconcat"])
    assert d["usermeta"]["embedOptions"] == {"actions": False, "renderer": "svg"}


def test_notebook_output_is_html_that_loads_vega():
    bundle = kappa_explorer_chart()._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    html = bundle["text/html"]
    assert "vegaEmbed" in html and "cdn.jsdelivr.net/npm/vega@" in html


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "ls"}, "LS gates need a model"),
    ({"method": "nope"}, "constant methods"),
    ({"kappa": 0}, "kappa must be a finite number > 0"),
    ({"n_skips": 0}, "n_skips must be >= 1"),
    ({"n_skips": 20, "n_max": 16}, "exceeds n_max"),
    ({"band": (5, 1)}, "band must satisfy"),
    ({"width": MAX_WIDTH + 1}, "width must be"),
])
def test_bad_input_says_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kappa_explorer_chart(**kwargs)

