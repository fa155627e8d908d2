"""``simspec plan``: the cheapest deployment that meets a set of SLOs.

The package: ``records`` (SLOs, prices, the settings, candidates, rows and
the plan), ``search`` (the steps below) and ``output`` (the table, the
verdict, the launch commands, the files and the Pareto plot); this module
re-exports what callers use.

A candidate is one replica's setup (GPU kind, tensor-parallel degree,
batch limit, speculative policy, engine mode) and the router its fleet is
served behind (the scenario's, or each of ``PlanConfig.routers``); the
fleet is N such replicas behind that router. The search, as Vidur-Search
sizes its candidates:

1. **Fit.** A candidate whose model does not fit its GPUs at its degree
   (no KV cache left) is skipped and counted.
2. **Capacity.** The highest request rate one replica serves within every
   SLO, by bisection on the rate between the replica's saturation rate
   (:func:`simspec.experiment.burst_rate`) and 1/64 of it, on a sample of
   the workload's mix and arrival process at that rate (once a replica
   setup: one replica has no router). A candidate that
   misses an SLO at 1/64 of its saturation rate cannot meet it at any
   replica count (a TPOT the batch-1 step already exceeds) and is pruned.
3. **Sizing.** ``ceil(target / capacity)`` replicas, and the fleet's price
   per hour from the price table.
4. **Confirmation.** The cheapest candidates by that estimate are served
   as whole fleets at the target rate, on fresh seeds shared by every
   candidate (common random numbers); a fleet that misses an SLO on any
   seed grows by half until it meets them (up to four times its
   estimate), and the count is bisected; one that meets them on every seed
   is tried with 1, 2, 4... fewer until one misses, and the count is
   bisected (a fleet pools its load, so the one-replica estimate may err
   high). The router matters here alone: where several are searched, each
   is confirmed as a fleet of its own. Each confirmed fleet's SLO metrics
   are the means over the seeds; the ranking's confidence is the paired
   interval of the tightest SLO's ratio between the first two.

SLOs are bounds on any latency statistic of the run's metrics
(``p99_ttft_ms=2000``: at most 2000 ms) or a share of requests meeting the
per-request SLOs (``goodput_share=0.9``: at least 90% of requests within
``--slo-ttft-ms`` / ``--slo-tpot-ms`` / ``--slo-e2el-ms``).
"""

from simspec.plan.output import COLUMNS, frame, launch, markdown, pareto, pareto_plot, table, verdict, write
from simspec.plan.records import (GOODPUT, PRICES, PRICES_SOURCE, Candidate, Plan, PlanConfig, Row, Slo, load_prices,
                                  parse_slo, parse_splits, slo_names)
from simspec.plan.search import candidates, plan, winner_at

__all__ = ["PRICES", "PRICES_SOURCE", "Slo", "parse_slo", "load_prices", "PlanConfig", "Candidate", "Row", "Plan",
           "plan", "candidates", "COLUMNS", "table", "frame", "markdown", "verdict", "launch", "write", "pareto",
           "pareto_plot", "slo_names", "GOODPUT", "winner_at", "parse_splits"]
