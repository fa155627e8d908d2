"""``simspec costs report``: how well a fitted cost model predicts its profile."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_costs_report(args: argparse.Namespace) -> int:
    from simspec import costs
    from simspec.costs import report
    from simspec.files import write_png

    root = Path(args.profiles) if args.profiles else None
    device, model = costs.gpu_spec(args.device, root), costs.model_spec(args.model)
    found, result = report.fit_for(device, model, root)
    repeat = report.load_repeat(Path(args.repeat), device, model) if args.repeat else None
    print(f"{result.cost_model.label}")
    print(f"profiles: {', '.join(str(p.folder) for p in found)}")
    if repeat is not None:
        print(f"repeat: {repeat.folder} (difference: |repeat - profile| / profile at the points both measured)")
    print()
    print(report.table(result, report.repeat_differences(found, repeat) if repeat else None,
                       report.prior_attention(result, model, device)))
    png = Path(args.png) if args.png else found[0].folder / "fit_report.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    write_png(png, report.figure(found, result))
    print(f"\nmeasured vs fitted: {png}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``costs report``."""
    cost_cmd = sub.add_parser("costs", help="cost models fitted from profiles")
    cost_sub = cost_cmd.add_subparsers(dest="costs_command", metavar="SUBCOMMAND", required=True)
    rep = cost_sub.add_parser("report", help="held-out error of the fitted cost model of a device and model")
    rep.add_argument("--device", required=True, help="device slug (profiles/<device>/)")
    rep.add_argument("--model", required=True, help="model spec name")
    rep.add_argument("--profiles", metavar="DIR", help="profiles folder (default: the repository's profiles/)")
    rep.add_argument("--png", metavar="FILE", help="where to draw measured vs fitted (default: in the profile)")
    rep.add_argument("--repeat", metavar="DIR",
                     help="a second profile of the same device and model (its folder, or a profiles folder "
                          "holding it): print each operator's run-to-run difference, the timing's noise floor")
    rep.set_defaults(handler=cmd_costs_report)
