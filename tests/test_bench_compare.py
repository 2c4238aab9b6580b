"""benchmarks/compare.py's verdict (``nox -s bench_compare``): a figure is
slower only beyond the A/A spread, the band two runs of one commit differ by."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_compare", Path(__file__).resolve().parent.parent / "benchmarks" / "compare.py")
compare = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(compare)


def test_geomean_interval_by_hand():
    # logs of 2 and 1/2 average to 0: geometric mean 1; sd of (ln2, -ln2) is sqrt(2) ln2, t(1 df) = 12.71
    g, lo, hi = compare.geomean_interval([2.0, 0.5])
    half = 12.71 * math.sqrt(2) * math.log(2) / math.sqrt(2)
    assert g == pytest.approx(1.0) and lo == pytest.approx(math.exp(-half)) and hi == pytest.approx(math.exp(half))
    assert compare.geomean_interval([1.5])[1:] == (None, None)


def test_aa_band_is_the_far_end_of_the_aa_interval():
    assert compare.aa_band(0.8, 1.1) == pytest.approx(1.25)  # 1/0.8 is farther from 1 than 1.1
    assert compare.aa_band(0.95, 1.3) == pytest.approx(1.3)
    assert compare.aa_band(None, None) is None


@pytest.mark.parametrize("g,smaller,slower", [
    (1.10, True, False),   # a latency 10 % up, inside a +-20 % A/A spread
    (1.30, True, True),    # 30 % up: beyond it
    (0.70, True, False),   # faster is never "slower"
    (0.70, False, True),   # a throughput 30 % down: beyond it
    (0.90, False, False),
])
def test_verdict_against_the_aa_spread(g, smaller, slower):
    assert compare.verdict(g, 0.5, 2.0, 1.2, smaller) is slower  # the head/base interval plays no part with a band


def test_verdict_without_control_is_the_own_interval():
    assert compare.verdict(1.3, 1.05, 1.6, None, True) and not compare.verdict(1.3, 0.9, 1.6, None, True)
    assert compare.verdict(0.7, 0.5, 0.95, None, False) and not compare.verdict(0.7, 0.5, 1.02, None, False)

