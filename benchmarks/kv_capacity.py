"""KV capacity engines logged vs simspec's memory rules: every row of
``validation/published/kv_capacity.csv`` (vLLM and SGLang logs on H100s,
1, 2 and 4 GPUs), logged and predicted weights, activation peak and KV cache
per GPU, the relative KV error and the memory share (the row's own, or
the one SGLang's rule chose and logged); then the largest |error| per role (the
row each constant was fitted to, the held-out rows).

    python benchmarks/kv_capacity.py
"""

from __future__ import annotations

from simspec.validation.kv_capacity import checks


def _gib(value: float | None) -> str:
    return f"{value:7.2f}" if value is not None else "      -"


def main() -> None:
    results = checks()
    print(f"{'row':32s} {'role':13s} {'weights log/sim':>16s} {'activation log/sim':>19s} {'KV GiB log/sim':>16s} "
          f"{'error':>7s}  share log/sim")
    for c in results:
        print(f"{c.id:32s} {c.role:13s} {c.logged_weights_gib:7.2f} {c.predicted_weights_gib:7.2f}  "
              f"{_gib(c.logged_activation_gib)} {_gib(c.predicted_activation_gib)}   "
              f"{c.logged_kv_gib:7.2f} {c.predicted_kv_gib:7.2f} {c.error:+7.1%}  "
              f"{c.logged_share if c.logged_share is not None else '(set)'} {c.predicted_share:.3f}")
    for role in sorted({c.role for c in results}):
        worst = max(abs(c.error) for c in results if c.role == role)
        print(f"largest |KV error|, {role}: {worst:.1%}")


if __name__ == "__main__":
    main()
