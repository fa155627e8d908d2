"""What a step costs after the engine sat idle: the cold start the cost model's wake term prices.

Times the shipped target's two prefill pieces, the vision encoder on one
image and a 30-token prefill forward (the live engine's tree forward over
one chain), right after another call (warm) and after polling the clock for
an idle spell, as the live engine polls between requests. Prints the median
of each and its ratio to warm. On the development machine (a 2-core
Firecracker VM) the encoder took 0.5 ms warm and 8-17 ms after 0.5-1 s
idle; ``simspec validate`` fits the same effect from its calibration steps
(``step_costs.json``, ``wake``).

    python benchmarks/idle_wake.py [--repeats 7] [--gaps 0.05,0.2,0.5,1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from simspec.live.run import load_models


def poll(seconds: float) -> None:
    """Spin on the clock, as the live engine waits for the next arrival."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--gaps", default="0.05,0.2,0.5,1", help="idle spells to time after, seconds (comma-separated)")
    args = ap.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    torch.set_num_threads(1)  # as the live engine serves on a CPU
    target = load_models().target
    c = target.config
    image = torch.randint(0, 256, (1, c.image_px, c.image_px, 3), dtype=torch.uint8)
    q = 30
    x = torch.randn(1, q, c.width)
    empty = [torch.zeros(1, 0, c.heads, c.width // c.heads) for _ in target.blocks]
    calls = {
        "vision encoder, 1 image": lambda: target.encode_image(image),
        f"prefill forward, {q} tokens": lambda: target.tree_forward(
            x, torch.arange(q)[None], torch.arange(-1, q - 1)[None], torch.tensor([q]), empty, empty,
            torch.tensor([0]), impl="reference"),
    }
    with torch.no_grad():
        for name, call in calls.items():
            for _ in range(3):
                call()
            times = {}
            for gap in [0.0, *gaps]:
                samples = []
                for _ in range(args.repeats):
                    call()  # warm: straight after a call
                    poll(gap)
                    start = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - start)
                times[gap] = float(np.median(samples)) * 1e3
            print(f"{name}: " + ", ".join(
                f"{'warm' if gap == 0 else f'after {gap:g} s idle'} {ms:.2f} ms"
                + ("" if gap == 0 else f" ({ms / times[0.0]:.1f}x)") for gap, ms in times.items()))


if __name__ == "__main__":
    main()
