"""What simspec plan shows and writes: the table, its typed frame and
Markdown, the verdict, the launch commands, the files, the Pareto front and plot.

Imports: the standard library, simspec.policies, simspec.config, simspec.plan.records;
pandas and matplotlib inside the functions that write or draw.
"""

from __future__ import annotations

import math
from pathlib import Path

from simspec import policies
from simspec.config import SimConfig
from simspec.plan.records import Plan, Row

# -- what plan shows and writes --------------------------------------------------------------------------------

COLUMNS = ("rank", "status", "device", "tp", "max_num_seqs", "policy", "replicas", "gpus", "usd_per_hour",
           "capacity_per_replica", "headroom_per_s", "tokens_per_usd", "tightest_slo", "tightest_ratio", "engine",
           "router", "split")


def table(p: Plan) -> list[dict]:
    """One dict a row. A disaggregated candidate's replicas are its units'
    (prefill and decode), its capacity a replica the unit's over them, and
    ``split`` says its unit (``1P3D``: one prefill and three decode replicas)."""
    out = []
    for i, r in enumerate(p.rows):
        c = r.candidate
        row = {"rank": i + 1 if r.status == "confirmed" else "", "status": r.status, "device": c.device, "tp": c.tp,
               "max_num_seqs": c.max_num_seqs, "policy": c.policy, "replicas": r.replicas * c.unit or "",
               "gpus": r.gpus or "", "usd_per_hour": round(r.usd_per_hour, 2) if r.replicas else "",
               "capacity_per_replica": round(r.capacity_per_s / c.unit, 3) if math.isfinite(r.capacity_per_s) else "",
               "headroom_per_s": round(r.capacity_per_s * r.replicas, 2) if r.replicas and math.isfinite(
                   r.capacity_per_s) else "",
               "tokens_per_usd": round(r.tokens_per_usd) if math.isfinite(r.tokens_per_usd) else "",
               "tightest_slo": r.worst_slo, "tightest_ratio": round(r.worst_ratio, 3) if math.isfinite(
                   r.worst_ratio) else "", "engine": c.engine, "router": p.router_of(c),
               "split": c.split_label}
        for s in p.slos:
            v = r.values.get(s.metric)
            row[s.metric] = round(v, 3) if v is not None else ""
        row["note"] = r.note
        out.append(row)
    return out


def markdown(p: Plan, limit: int = 12) -> str:
    every = table(p)
    rows = [r for r in every if r["status"] in ("confirmed", "missed", "estimated")][:limit]
    if not rows:
        return "(no candidate fits and can meet the SLOs)\n"
    many = {c: len({r[c] for r in every}) > 1 for c in ("engine", "router", "split")}  # shown where they differ
    cols = [c for c in COLUMNS if c != "tightest_slo" and many.get(c, True)] + [s.metric for s in p.slos]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def verdict(p: Plan) -> str:
    w = p.winner
    if w is not None:
        c = w.candidate
        mode = f" on {c.engine}" if c.engine != "simspec" else ""
        behind = f", behind {c.router}" if c.router else ""
        if c.split:
            device, tp = c.prefill_side
            return (f"cheapest within every SLO: {w.replicas * c.split[0]} prefill {device} replicas at tp {tp} + "
                    f"{w.replicas * c.split[1]} decode {c.device} replicas at tp {c.tp} ({w.gpus} GPUs; {w.replicas} "
                    f"unit{'s' * (w.replicas > 1)} of {c.split_label}), {c.policy}{mode} on the decode side, "
                    f"max_num_seqs {c.max_num_seqs}{behind}: ${w.usd_per_hour:,.2f}/h, "
                    f"{w.tokens_per_usd:,.0f} output tokens/$")
        return (f"cheapest within every SLO: {w.replicas} x {c.device} at tp {c.tp} ({w.gpus} GPU{'s' * (w.gpus > 1)}), "
                f"{c.policy}{mode}, "
                f"max_num_seqs {c.max_num_seqs}{behind}: ${w.usd_per_hour:,.2f}/h, "
                f"{w.tokens_per_usd:,.0f} output tokens/$")
    tried = [r for r in p.rows if r.status == "missed"] or [r for r in p.rows if r.note and r.status == "cannot meet"]
    if not tried:
        return "no candidate meets the SLOs: none fits its model at the candidate tensor-parallel degrees"
    close = min(tried, key=lambda r: r.worst_ratio if math.isfinite(r.worst_ratio) else math.inf)
    miss = (f"misses {close.worst_slo} by {close.worst_ratio - 1:.0%} at {close.replicas} replicas"
            if math.isfinite(close.worst_ratio) else close.note)
    return f"no candidate meets every SLO; the closest, {close.candidate.label}, {miss}"


def launch(p: Plan, base: SimConfig) -> str:
    """The winner's serving command (one replica; run ``replicas`` of them
    behind the router): its engine's, or vLLM's and SGLang's for a
    candidate of simspec's own engine mode; a disaggregated winner's, each
    side's."""
    w = p.winner
    if w is None:
        return ""
    c = w.candidate
    vllm, sglang, note = _commands(base.model, c.tp, c.max_num_seqs, c.policy)
    if c.split:
        return _split_launch(base.model, c, vllm, sglang) + note
    lines = [line for kind, line in (("vllm", f"vLLM:   {vllm}"), ("sglang", f"SGLang: {sglang}"))
             if c.engine in (kind, "simspec")]
    return "\n".join(lines) + note


def _commands(model: str, tp: int, max_num_seqs: int, policy: str) -> tuple[str, str, str]:
    """(vLLM's command, SGLang's, a note) serving ``policy`` (EAGLE chain
    settings for ``linear:k``; a note for a policy no one flag sets)."""
    spec = policies.parse(policy)
    k = getattr(spec, "k", None)
    vllm = f"vllm serve {model} --tensor-parallel-size {tp} --max-num-seqs {max_num_seqs}"
    sglang = f"python -m sglang.launch_server --model-path {model} --tp {tp} --max-running-requests {max_num_seqs}"
    note = ""
    if spec.name == "linear" and k:
        vllm += (" --speculative-config '{\"method\": \"eagle\", \"model\": \"<your EAGLE drafter>\", "
                 f"\"num_speculative_tokens\": {k}}}'")
        sglang += (f" --speculative-algorithm EAGLE --speculative-draft-model-path <your EAGLE drafter> "
                   f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    elif spec.name != "ar":
        note = (f"\n(note: {policy} has no one-flag engine setting; tune it and use `simspec export` for the "
                f"engine's nearest settings)")
    return vllm, sglang, note


# vLLM's NixlConnector (docs/features/nixl_connector_usage.md: both sides kv_both, the proxy assigns the roles)
# and SGLang's PD disaggregation (docs/advanced_features/pd_disaggregation.md: --disaggregation-mode)
NIXL = " --kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}'"


def _split_launch(model: str, c, vllm: str, sglang: str) -> str:
    """A disaggregated winner's two kinds of replica, each on its own GPU:
    prefill ones at their own degree without speculation, decode ones with
    it (``vllm`` and ``sglang``: the decode side's commands), for each
    engine the candidate runs on."""
    device, tp = c.prefill_side
    prefill_vllm, prefill_sglang, _ = _commands(model, tp, c.max_num_seqs, "ar")
    lines = []
    if c.engine in ("vllm", "simspec"):
        lines += [f"vLLM prefill ({c.split[0]} a unit, {device}):   {prefill_vllm}{NIXL}",
                  f"vLLM decode ({c.split[1]} a unit, {c.device}):    {vllm}{NIXL}",
                  "  (behind a proxy that sends each request to a prefill replica, then to a decode one: vLLM's "
                  "toy_proxy_server.py)"]
    if c.engine in ("sglang", "simspec"):
        lines += [f"SGLang prefill ({c.split[0]} a unit, {device}): {prefill_sglang} --disaggregation-mode prefill",
                  f"SGLang decode ({c.split[1]} a unit, {c.device}):  {sglang} --disaggregation-mode decode",
                  "  (behind sglang_router with --pd-disaggregation)"]
    return "\n".join(lines)


def frame(p: Plan, rows: list[dict] | None = None):
    """:func:`table` (or its ``rows``, already made) as a typed pandas
    DataFrame (numbers as numbers, an empty cell missing)."""
    import pandas as pd

    typed = pd.DataFrame(table(p) if rows is None else rows).replace("", None).infer_objects()
    return typed.astype({"rank": "Int64", "tightest_slo": "string", "note": "string", "router": "string",
                         "split": "string"})


PARETO_COLUMNS = ("device", "tp", "max_num_seqs", "policy", "replicas", "usd_per_hour", "tightest_ratio", "engine",
                  "router", "split")


def write(p: Plan, out: str | Path) -> list[Path]:
    """plan.csv, plan.parquet and pareto.png (and pareto.csv: the front's
    rows of the table) under ``out``, each written whole or not at all."""
    import pandas as pd

    from simspec.files import write_bytes, write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = table(p)
    write_text(out / "plan.csv", pd.DataFrame(rows).to_csv(index=False))
    write_bytes(out / "plan.parquet", frame(p, rows).to_parquet(index=False))
    front = pareto(p)
    row_of = {id(r): row for r, row in zip(p.rows, rows)}
    write_text(out / "pareto.csv", pd.DataFrame([{c: row_of[id(r)][c] for c in PARETO_COLUMNS} for r in front],
                                                columns=PARETO_COLUMNS).to_csv(index=False))
    write_bytes(out / "pareto.png", pareto_plot(p, front))
    return [out / name for name in ("plan.csv", "plan.parquet", "pareto.csv", "pareto.png")]


def pareto(p: Plan) -> list[Row]:
    """The confirmed and missed fleets no other beats on both $/hour and the tightest SLO ratio."""
    pts = sorted((r for r in p.rows if r.status in ("confirmed", "missed") and math.isfinite(r.worst_ratio)),
                 key=lambda r: (r.usd_per_hour, r.worst_ratio))
    front, best = [], math.inf
    for r in pts:
        if r.worst_ratio < best:
            front.append(r)
            best = r.worst_ratio
    return front


def pareto_plot(p: Plan, front: list[Row] | None = None) -> bytes:
    """The Pareto plot (PNG): every confirmed or missed fleet by $/hour and tightest SLO ratio, the front dashed."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = pareto(p) if front is None else front
    pts = [r for r in p.rows if r.status in ("confirmed", "missed") and math.isfinite(r.worst_ratio)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for status, marker in (("confirmed", "o"), ("missed", "x")):
        sel = [r for r in pts if r.status == status]
        ax.scatter([r.usd_per_hour for r in sel], [r.worst_ratio for r in sel], marker=marker, label=status)
    if front:
        ax.plot([r.usd_per_hour for r in front], [r.worst_ratio for r in front], "k--", lw=1, label="Pareto front")
    ax.axhline(1.0, color="red", lw=0.8)
    ax.set_xlabel("fleet $ per hour")
    ax.set_ylabel("tightest SLO: value / bound (<= 1 meets)")
    ax.set_title(f"{p.target_per_s:.3g} req/s")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()



__all__ = ["COLUMNS", "table", "frame", "markdown", "verdict", "launch", "write", "pareto", "pareto_plot"]
