"""The tuned file as a table: per cell, the best fixed strategy against the
tuned marginal policy, and the notes a reader must see."""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from simspec.tune.records import FIXED, OBJECTIVES, Tuned, paired


TABLE_COLUMNS = ("load", "rate_per_s", "cv", "best_fixed", "best_fixed_value", "marginal", "marginal_value",
                 "marginal_vs_fixed_pct", "ci95_low_pct", "ci95_high_pct", "verdict", "best", "adaptive_value",
                 "best_vs_runner_up_separable")


def table_rows(t: Tuned) -> list[dict]:
    """Per cell: the best fixed strategy (linear / tree / truncate) vs the
    tuned marginal policy, paired over the confirm seeds."""
    rows = []
    for c in t.cells:
        fixed = [c.families[f] for f in FIXED if f in c.families]
        row = {"load": round(c.load, 3), "rate_per_s": round(c.rate_per_s, 3), "cv": c.cv, "best": c.best.spec,
               "adaptive_value": float(np.mean(c.adaptive)) if c.adaptive else math.nan}
        if c.runner_up is not None:
            row["best_vs_runner_up_separable"] = paired(c.best.values, c.runner_up.values).separable
        if fixed:
            bf = max(fixed, key=lambda x: x.score)
            row.update(best_fixed=bf.spec, best_fixed_value=bf.mean)
        if "marginal" in c.families:
            m = c.families["marginal"]
            row.update(marginal=m.spec, marginal_value=m.mean)
            if fixed:
                p = paired(m.values, bf.values)
                scale = 100.0 / abs(bf.mean) if bf.mean else math.nan
                better = p.high < 0 if not t.maximize else p.low > 0
                worse = p.low > 0 if not t.maximize else p.high < 0
                row.update(marginal_vs_fixed_pct=p.diff * scale, ci95_low_pct=p.low * scale,
                           ci95_high_pct=p.high * scale,
                           verdict="marginal better" if better else "marginal worse" if worse else "not separable")
        rows.append(row)
    return rows


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def table_markdown(t: Tuned) -> str:
    rows = table_rows(t)
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(f"{r[k]:+.2f}" if k.endswith("_pct") and k in r else _fmt(r.get(k))
                                for k in TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table_csv(t: Tuned) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in table_rows(t):
        writer.writerow({k: _fmt(r.get(k)) if isinstance(r.get(k), bool) else r.get(k, "") for k in TABLE_COLUMNS})
    return out.getvalue()


def notes(t: Tuned) -> list[str]:
    """What a reader must know: unmet SLOs, inseparable winners."""
    metric = OBJECTIVES[t.objective][0]
    out = []
    for c in t.cells:
        at = f"load {c.load:.2f} (rate {c.rate_per_s:.3g}/s, CV {c.cv:g})"
        if c.meets_slo is False:
            out.append(f"{at}: no candidate meets the SLOs (goodput 0 for all); closest is {c.best.spec}, whose "
                       f"median request is at {c.best.slo_gap:.2f}x the SLO")
        if c.runner_up is not None:
            p = paired(c.best.values, c.runner_up.values)
            if not p.separable:
                out.append(f"{at}: best {c.best.spec} and runner-up {c.runner_up.spec} are not separable at 95% "
                           f"({metric} difference {p.diff:.4g}, CI [{p.low:.4g}, {p.high:.4g}] over "
                           f"{len(c.best.values)} seeds)")
    return out
