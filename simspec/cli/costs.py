"""``simspec costs report``: how well a fitted cost model predicts its profile."""

from __future__ import annotations

import argparse
from pathlib import Path

from simspec.types import InputError


def cmd_costs_report(args: argparse.Namespace) -> int:
    from simspec import costs
    from simspec.costs import report
    from simspec.files import write_png

    root = Path(args.profiles) if args.profiles else None
    if args.held_out_shapes:
        return _held_out_shapes(args.device, root)
    if not args.model:
        raise InputError("costs report: --model is required (except with --held-out-shapes)")
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


def _held_out_shapes(device: str, root: Path | None) -> int:
    """The linear layers' shape law fitted on the device's small models, judged on its big ones."""
    from simspec.costs import profiles, shapes

    checks = shapes.held_out_check(root or profiles.default_root(), (device,))
    print("linear layers at tensor parallelism: one shape law per operator group, fitted on small models, "
          "judged on held-out big ones (relative error of each point's median)")
    print(shapes.table(checks))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``costs report``."""
    cost_cmd = sub.add_parser("costs", help="cost models fitted from profiles")
    cost_sub = cost_cmd.add_subparsers(dest="costs_command", metavar="SUBCOMMAND", required=True)
    rep = cost_sub.add_parser("report", help="held-out error of the fitted cost model of a device and model")
    rep.add_argument("--device", required=True, help="device slug (profiles/<device>/)")
    rep.add_argument("--model", help="model spec name (required, except with --held-out-shapes)")
    rep.add_argument("--profiles", metavar="DIR", help="profiles folder (default: the repository's profiles/)")
    rep.add_argument("--png", metavar="FILE", help="where to draw measured vs fitted (default: in the profile)")
    rep.add_argument("--repeat", metavar="DIR",
                     help="a second profile of the same device and model (its folder, or a profiles folder "
                          "holding it): print each operator's run-to-run difference, the timing's noise floor")
    rep.add_argument("--held-out-shapes", action="store_true",
                     help="instead: the linear layers' shape law at tensor parallelism 1-8, fitted on the "
                          "device's small Vidur shapes and judged on its big ones (simspec.costs.shapes)")
    rep.set_defaults(handler=cmd_costs_report)
