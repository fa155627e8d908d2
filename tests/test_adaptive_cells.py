"""Three cells of benchmarks/adaptive_vs_fixed.py: on the default scenario,
untuned ``marginal`` has a mean and p99 E2EL within 2% of the best of
``ar`` and ``linear:k=1..5`` (the same requests served by each), at a light,
a saturating and an overloaded Gamma CV 2 load; and the comparison can
fail (``tree``, a fixed policy, is far off the best at the same cells)."""

from __future__ import annotations


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
