"""The scenario flags of ``simulate`` and ``tune`` (simspec.config.FLAGS as
argparse options), and argparse's number types with one-line errors."""

from __future__ import annotations

import argparse

from simspec import config as configuration
from simspec.acceptance.presets import check_drafter
from simspec.config import FLAGS, SimConfig
from simspec.policies import POLICIES


def number(kind: type, flag: str):
    """An argparse type: ``kind(text)``, or an error naming ``flag``."""
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a{'n integer' if kind is int else ' number'} "
                                             f"(got {text!r})") from None
    return convert


def on_off(flag: str):
    """An argparse type: ``on`` is True, ``off`` False, else an error naming ``flag``."""
    def convert(text: str) -> bool:
        if text not in ("on", "off"):
            raise argparse.ArgumentTypeError(f"{flag} must be on or off (got {text!r})")
        return text == "on"
    return convert


def add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    parser.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                        help=f"policy to compare (repeat); one of {', '.join(POLICIES)}; "
                             f"default: {' '.join(configuration.DEFAULT_POLICIES)}")
    parser.add_argument("--policy-file", metavar="TUNED.toml",
                        help="add the policies `simspec tune` chose: the load-adaptive one of the nearest CV and "
                             "each family's best at the nearest load (after --policy / the config's, else after ar)")
    parser.add_argument("--cv", type=number(float, "--cv"), help="inter-arrival CV (sets --burstiness)")
    parser.add_argument("--fleet", metavar="FILE.toml",
                        help="serve on groups of replicas of different setups (GPU, tp, engine, policy) behind "
                             "--router: a fleet file of [[group]] tables (docs/fleets.md)")
    for flag in FLAGS:
        kind = flag.type if flag.type is str else on_off(flag.name) if flag.type is bool else number(flag.type, flag.name)
        default = {True: "on", False: "off"}.get(flag.default, flag.default) if flag.type is bool else flag.default
        parser.add_argument(flag.name, type=kind, default=None, help=f"{flag.help} (default: {default})")


def scenario_config(args: argparse.Namespace) -> SimConfig:
    """The scenario the flags describe (simspec.config.from_flags), with the
    policies of ``--policy-file`` added after those named."""
    file_values = configuration.load(args.config) if args.config else {}
    config = configuration.build(file_values, configuration.flag_overrides(vars(args)))
    if getattr(args, "acceptance", None) is not None or "acceptance" in file_values:  # chosen, not the default
        check_drafter(config.acceptance, config.drafter)
    if getattr(args, "policy_file", None):
        from simspec import tune  # only for --policy-file: a simulate process need not import the tuner

        config = tune.with_policy_file(config, args.policy_file, keep=bool(args.policy) or "policies" in file_values)
    return config
