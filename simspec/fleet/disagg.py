"""Prefill/decode disaggregation: prefill replicas compute each prompt, its
KV cache moves to a decode replica over a priced link, and the decode
replica generates the output, speculating there.

Imports: numpy, simspec.types, simspec.fleet (run, merge).

It follows vLLM's disaggregated serving (its KV connectors, NIXL among
them, and the proxy that sends each request first to a prefill instance
with ``max_tokens=1``, then whole to a decode instance:
benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py in
github.com/vllm-project/vllm). The prefill side
serves every request as a one-token request under ``ar`` (it drafts
nothing); when its prefill ends, the KV cache of the prompt moves to the
decode side, ``latency + bytes / bandwidth`` later; there the request
arrives (routed by the fleet's router among the decode replicas) with
its prompt's KV computed (simspec.serving.queues ``Tokens.ready``, which
vLLM's scheduler counts as external computed tokens, as it does a prefix
hit), runs its prompt's last token and decodes its whole output. Its
first token, and so its TTFT, is the decode replica's: the prefill
side's token is not sent (as vLLM's proxy discards it). The bytes are
the prompt's KV cache on one GPU (simspec.costs.ModelSpec.kv_bytes_per_token,
sharded by the tensor-parallel degree), each GPU of a replica sending
its shard over its own link at once; where the two sides' degrees
differ, the side with more bytes a GPU sets the time.

The run's merged log is the decode side's, with each request's arrival
and admission put back to the prefill side's (TTFT and E2E latency count
from the request's arrival at the fleet), its preemptions summed and the
prefill replicas' busy time added (the fleet's GPU share is over both).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from simspec.fleet.groups import Link
from simspec.fleet.run import FleetRun, simulate_fleet
from simspec.types import InputError, Request, RunLog, StepStats, require

PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)  # as simspec.fleet.groups.ROLES


def transfer_s(requests: Sequence[Request], link: Link, bytes_per_token: int) -> np.ndarray:
    """Seconds each request's prompt KV takes to reach the decode side."""
    tokens = np.array([r.context_tokens for r in requests], dtype=float)
    return link.latency_s + tokens * bytes_per_token / link.bytes_per_s


def serve(requests: Sequence[Request], *, setups: Sequence[dict], roles: Sequence[str], router: str, seed: int,
          label: str, link: Link, bytes_per_token: int, staleness_s: float = 0.0,
          progress: Callable[[int], None] | None = None, **serve_args) -> FleetRun:
    """Serve ``requests`` (sorted by arrival) on a fleet whose replica k has
    simspec.sim.simulate's arguments ``setups[k]`` over ``serve_args`` and
    the role ``roles[k]`` (prefill or decode); both sides behind ``router``."""
    require(len(setups) == len(roles) and set(roles) == set(ROLES),
            "a disaggregated fleet needs prefill and decode replicas (one role a replica)")
    pre_at = [k for k, role in enumerate(roles) if role == PREFILL]
    dec_at = [k for k, role in enumerate(roles) if role == DECODE]
    n = len(requests)

    def stage(offset: int) -> Callable[[int], None] | None:
        return (lambda done: progress(offset + done // 2)) if progress else None

    first = [replace(r, output_tokens=1) for r in requests]  # the prefill side: the prompt and one token
    prefill = simulate_fleet(first, replicas=len(pre_at), router=router, seed=seed, label=label,
                             staleness_s=staleness_s, setups=[setups[k] for k in pre_at], progress=stage(0),
                             **serve_args)
    order = {r.id: j for j, r in enumerate(requests)}
    done_s = np.empty(n)
    admitted_s = np.empty(n)
    preempted = np.zeros(n, np.int64)
    table = prefill.log.table
    at = np.array([order[int(i)] for i in table.id], dtype=np.int64)
    done_s[at], admitted_s[at], preempted[at] = table.first_token_s, table.admitted_s, table.preemptions
    if not np.isfinite(done_s).all():
        raise InputError("a prefill replica left requests unserved: its KV budget cannot hold them")
    moved = transfer_s(requests, link, bytes_per_token)
    ready = done_s + moved
    later = np.argsort(ready, kind="stable")
    second = [replace(requests[j], arrival_s=float(ready[j])) for j in later]
    decode = simulate_fleet(second, replicas=len(dec_at), router=router, seed=seed, label=label,
                            staleness_s=staleness_s, setups=[{**setups[k], "transferred_kv": True} for k in dec_at],
                            progress=stage(n // 2), **serve_args)
    replicas: list[RunLog | None] = [None] * len(roles)
    for k, log in zip(pre_at, prefill.replicas):
        replicas[k] = log
    for k, log in zip(dec_at, decode.replicas):
        replicas[k] = log
    assignment = np.empty(n, np.int64)
    assignment[later] = np.asarray(dec_at)[decode.assignment]
    prefill_assignment = np.asarray(pre_at)[prefill.assignment]
    if progress is not None:
        progress(n)
    return FleetRun(log=_fleet_log(decode.log, prefill, requests, order, admitted_s, preempted, label),
                    replicas=tuple(replicas), assignment=assignment, prefill_assignment=prefill_assignment,
                    transfer_s=moved)


def _fleet_log(decoded: RunLog, prefill: FleetRun, requests: Sequence[Request], order: dict, admitted_s: np.ndarray,
               preempted: np.ndarray, label: str) -> RunLog:
    """The decode side's merged log with each request's arrival, admission and
    preemptions as the fleet saw them, and the prefill side's busy time added."""
    table = decoded.table
    rows = np.array([order[int(i)] for i in table.id], dtype=np.int64)
    arrival_s = np.array([requests[j].arrival_s for j in rows])
    table = table._replace(arrival_s=arrival_s, admitted_s=admitted_s[rows],
                           preemptions=table.preemptions + preempted[rows])
    both = prefill.log.steps
    steps = StepStats(steps=decoded.steps.steps + both.steps, busy_s=decoded.steps.busy_s + both.busy_s,
                      plans=decoded.steps.plans, decode_busy_s=decoded.steps.decode_busy_s,
                      batch_busy_s=decoded.steps.batch_busy_s)
    return replace(decoded, table=table, steps=steps, start_s=float(min(decoded.start_s, arrival_s.min())))


__all__ = ["transfer_s", "serve", "ROLES", "PREFILL", "DECODE"]
