"""Fused MoE kernel times engines published vs the roofline prior's price
of the same call: every row of ``validation/published/moe_kernels.csv``
(vLLM's and SGLang's MoE tuning benchmarks on H100, H200 and B200), the
prior with its fused-call floor (FixedCosts.moe_call_s) and without it,
and the median |error| of each at 1-8 tokens (decode) and overall.

    python benchmarks/moe_kernels.py
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simspec.costs.roofline import FIXED
from simspec.validation.moe_kernels import checks


def main() -> None:
    floor = checks()
    bare = checks(fixed=dataclasses.replace(FIXED, moe_call_s=0.0))
    print(f"{'row':20s} {'gpu':9s} {'model':20s} {'tokens':>6s} {'measured us':>12s} {'prior us':>9s} {'error':>7s}"
          f" {'no floor':>9s} {'error':>7s}")
    for c, b in zip(floor, bare):
        print(f"{c.id:20s} {c.gpu:9s} {c.model:20s} {c.tokens:6d} {c.measured_us:12.2f} {c.predicted_us:9.2f} "
              f"{c.error:+7.1%} {b.predicted_us:9.2f} {b.error:+7.1%}")
    for label, keep in (("1-8 tokens", lambda c: c.tokens <= 8), ("all rows", lambda c: True)):
        for name, result in (("with the floor", floor), ("without", bare)):
            errors = [abs(c.error) for c in result if keep(c)]
            print(f"median |error|, {label}, {name}: {np.median(errors):.1%} ({len(errors)} rows)")


if __name__ == "__main__":
    main()
