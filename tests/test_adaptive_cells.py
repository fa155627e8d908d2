"""Three cells of benchmarks/adaptive_vs_fixed.py: on the default scenario,
untuned ``marginal`` has a mean and p99 E2EL within 2% of the best of
``ar`` and ``linear:k=1..5`` (the same requests served by each), at a light,
a saturating and an overloaded Gamma CV 2 load; and the comparison can
fail (``tree``, a fixed policy, is far off the best at the same cells)."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import load_benchmark

SATURATION = 18.29  # AR saturation of the default scenario, req/s (the benchmark's first line)


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("adaptive_vs_fixed")


@pytest.mark.slow
@pytest.mark.parametrize("load", [0.5, 1.0, 1.5])
def test_marginal_is_within_2_percent_of_the_best_fixed_chain(bench, load):
    flags = {"workload": {"arrival": "gamma", "burstiness": 0.25, "rate_per_s": load * SATURATION,
                          "num_requests": 400}}
    cell = bench.run_cell(f"gamma CV 2 {load}x", flags, bench.FIXED + ("marginal", "tree"))
    mean, p99 = cell.ratios("marginal")
    assert mean <= bench.TOLERANCE and p99 <= bench.TOLERANCE, (mean, p99)
    assert cell.passes("marginal")
    assert not cell.passes("tree")  # the check tells a policy that is not as good


def test_pooled_seeds_measure_what_the_metrics_measure(bench):
    """--seeds pools each cell's requests over seeds: its mean and p99 are
    simspec.metrics' own over the pooled requests (one seed's cell computed
    from its requests gives the metrics' figures), and the pooled cell
    holds every seed's requests."""
    flags = {"workload": {"arrival": "gamma", "burstiness": 0.25, "rate_per_s": 6.0, "num_requests": 60}}
    cells = [bench.run_cell("light", {**flags, "seed": s}, ("ar", "linear:k=2")) for s in (0, 1)]
    for cell in cells:
        alone = bench.pooled([cell, cell])  # the same requests twice: the same mean
        for p in ("ar", "linear:k=2"):
            assert abs(alone.mean_ms[p] - cell.mean_ms[p]) <= 1e-9 * cell.mean_ms[p]
            assert abs(np.percentile(cell.e2el_s[p], 99) * 1e3 - cell.p99_ms[p]) <= 1e-9 * cell.p99_ms[p]
    both = bench.pooled(cells)
    for p in ("ar", "linear:k=2"):
        assert len(both.e2el_s[p]) == 120
        assert min(c.mean_ms[p] for c in cells) < both.mean_ms[p] < max(c.mean_ms[p] for c in cells)
    assert bench.pooled(cells[:1]) is cells[0]
