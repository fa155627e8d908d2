"""The live engine: real batched speculative decoding with the project's own
target VLM and drafter, the same policies as the simulator, wall-clock
replay of a workload (DESIGN.md "Live engine and the real models").

Imports: torch, on first use of :class:`LiveEngine` (this package is never
imported by the simulator core); :class:`LiveConfig` and the records load
without it, so that the command line reads the engine's defaults cheaply.
"""

from simspec.live.config import LiveConfig
from simspec.live.records import LiveResult, StepRecord


def __getattr__(name: str):
    """``LiveEngine``, imported (with torch) when first asked for."""
    if name == "LiveEngine":
        from simspec.live.engine import LiveEngine

        return LiveEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LiveConfig", "LiveEngine", "LiveResult", "StepRecord"]
