"""``simspec profile-gpu``: measure a device's operator profile, or import Vidur's.

Imports: argparse, simspec.costs, simspec.profiling's torch-free modules;
torch only inside the handler, so ``simspec`` itself starts without torch.
simspec.cli registers the subcommand with ``add(subparsers)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import simspec
from simspec.costs import MODELS, model_spec
from simspec.profiling.grid import DEFAULT_MODELS
from simspec.profiling.vidur import import_vidur
from simspec.files import check_writable
from simspec.types import InputError

PROFILES = Path(simspec.__file__).resolve().parents[1] / "profiles"
"""The repository's profiles/ folder: the default --out."""


def add(subparsers) -> argparse.ArgumentParser:
    """Register ``profile-gpu`` on an argparse subparsers object."""
    p = subparsers.add_parser("profile-gpu", help="measure operator timings on this GPU (or CPU) into profiles/",
                              description="Time the operators of each model spec (decoder-layer pieces, attention, "
                                          "LM head, vision encoder, drafter step, selection, int8 quantization) "
                                          "on this machine; resumes from the CSVs already written.")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="device to profile (default: cuda if available, else an error)")
    p.add_argument("--model", action="append", metavar="NAME",
                   help=f"model spec (repeat); one of {', '.join(MODELS)}; default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--quick", action="store_true",
                   help="a small grid (on a CPU: up to 512 tokens and 4096 context tokens)")
    p.add_argument("--out", type=Path, default=PROFILES, metavar="DIR",
                   help=f"profiles folder (default: {PROFILES})")
    p.add_argument("--import-vidur", type=Path, default=None, metavar="DIR",
                   help="instead of measuring, import Vidur's vidur_<gpu>_<model>_<kind>.csv profiles from DIR")
    p.add_argument("--collectives", action="store_true",
                   help="instead of operators, time torch.distributed all-reduce over this machine's GPUs (NCCL; "
                        "gloo workers with --device cpu) into <out>/<device>/collectives/all_reduce.csv")
    p.add_argument("--workers", type=_workers, default=None, metavar="N[,N...]",
                   help="with --collectives: GPU counts to measure (2, 4, 8; default: every degree the machine has)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=cmd_profile_gpu)
    return p


def _workers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated GPU counts among 2, 4, 8 (got {text!r})") from None


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    check_writable(out, f"--out {out}")


def cmd_profile_gpu(args: argparse.Namespace) -> int:
    _check_out(args.out)
    if args.import_vidur is not None:
        given = [flag for flag, value in (("--model", args.model), ("--device", args.device), ("--quick", args.quick),
                                          ("--collectives", args.collectives), ("--workers", args.workers)) if value]
        if given:
            raise InputError(f"--import-vidur takes no {', '.join(given)} (it imports what the files hold)")
        for folder in import_vidur(args.import_vidur, args.out):
            print(f"imported {folder}")
        return 0
    if args.workers is not None and not args.collectives:
        raise InputError("--workers goes with --collectives")
    if args.collectives and args.model:
        raise InputError("--collectives takes no --model (it times all-reduces, whatever the model)")
    models = [model_spec(name).name for name in args.model or DEFAULT_MODELS]  # checked before torch loads
    try:
        import torch
    except ImportError:
        raise InputError("profile-gpu needs torch: pip install -e '.[kernels]' (or use --import-vidur DIR)") from None
    device = args.device or "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device; use --device cpu")
    if args.collectives:
        return _collectives(args, device)
    from simspec.profiling.runner import run_profile

    for folder in run_profile(device=device, models=models, quick=args.quick, out=args.out,
                              progress=not args.quiet):
        print(f"profile {folder}")
    return 0


def _collectives(args: argparse.Namespace, device: str) -> int:
    from simspec.profiling.collectives import run_collectives
    from simspec.profiling.runner import describe_device

    name, slug, _, _ = describe_device(device)
    folder = run_collectives(device=device, name=name, slug=slug, out=args.out, workers=args.workers,
                             quick=args.quick, progress=(lambda _: None) if args.quiet else print)
    print(f"collectives {folder}")
    return 0
