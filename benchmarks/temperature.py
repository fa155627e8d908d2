"""Acceptance at temperature 1 predicted from temperature 0: EAGLE's own
per-position chain rates on MT-Bench (Table 2 of arXiv 2401.15077, held
out) against simspec's temperature rule, whose falls were fitted to
EAGLE-2's tree acceptance lengths on six other datasets. Prints, per
target, the published rates at 0 and 1, simspec's prediction at 1 and the
mean error.

    python benchmarks/temperature.py
"""

from __future__ import annotations

from simspec.validation.temperature import checks


def _rates(values) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def main() -> None:
    print(f"{'target':16s} {'fall':>7s}  {'published at 0':24s}  {'published at 1':24s}  {'simspec at 1':24s}  error")
    for c in checks():
        print(f"{c.target:16s} {c.fall:+7.3f}  {_rates(c.greedy):24s}  {_rates(c.sampled):24s}  "
              f"{_rates(c.predicted):24s}  {c.error:+.3f}")


if __name__ == "__main__":
    main()
