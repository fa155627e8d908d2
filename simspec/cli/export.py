"""``simspec export``: a tuned policy as vLLM's or SGLang's own settings (simspec.export)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from simspec import tune
from simspec.serving import modes

from simspec.export import FORMATS, build, format_losses, losses, target_engine
from simspec.files import write_text


def cmd_export(args: argparse.Namespace) -> int:
    tuned = tune.load(args.tuned_file)
    export = build(tuned, args.format, args.cv)
    metric = tune.OBJECTIVES[tuned.objective][0]
    print(f"simspec export --format {export.format} | {args.tuned_file} | CV {export.cv:g} | objective {metric}")
    print(f"tuned policy: {next(s.policy for s in tuned.schedules if s.cv == export.cv)}")
    print()
    print("batch sizes  tuned spec -> engine draft tokens")
    for r in export.ranges:
        print(f"{r.lo:>4}-{r.hi:<6} {r.tuned} -> {r.draft_tokens}{'' if r.exact else '  (approximate)'}")
    print()
    if export.format == "vllm":
        print(f"vLLM launch flags (dynamic speculative decoding, a vLLM with num_speculative_tokens_per_batch_size):"
              f"\n  {export.flags}")
    else:
        print(f"SGLang launch flags:\n  {export.flags}\nADAPTIVE.json: {json.dumps(export.settings)}")
    print()
    for line in export.cannot:
        print(f"cannot express: {line}")
    if args.out:
        write_text(args.out, json.dumps(export.settings, indent=2) + "\n")
        print(f"wrote {args.out}")
    if args.no_simulate:
        return 0
    print()
    engine = target_engine(tuned, export.format)
    print(f"simulated: the exported settings on --engine {engine.kind} ({modes.describe(engine)}), "
          f"the tuned policy on the tuned scenario's engine ({tuned.scenario.engine.kind})\n")
    for name, spec in {f"exported ({export.approximation})": export.approximation, **export.alternatives}.items():
        rows = losses(tuned, export, spec, args.seeds)
        print(format_losses(name, rows, metric, tuned.maximize))
        mean = float(np.mean([r.pct for r in rows]))
        print(f"mean change over the {len(rows)} loads: {mean:+.2f}% {metric}\n")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simspec export``."""
    p = sub.add_parser("export", help="a tuned policy as vLLM / SGLang settings, with the simulated cost of the "
                                      "approximation")
    p.add_argument("tuned_file", metavar="TUNED_FILE", help="a file `simspec tune` wrote")
    p.add_argument("--format", required=True, choices=FORMATS, help="the serving engine")
    p.add_argument("--cv", type=float, help="inter-arrival CV of the traffic (default: the first tuned CV)")
    p.add_argument("--out", metavar="FILE.json", help="write the engine's config (vLLM speculative config; SGLang "
                                                      "adaptive config)")
    p.add_argument("--seeds", type=int, help="seeds per comparison (default: the tuned file's confirm seeds)")
    p.add_argument("--no-simulate", action="store_true", help="only print the settings")
    p.set_defaults(handler=cmd_export)
