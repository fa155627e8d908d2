"""The live engine: real batched speculative decoding with the project's own
target VLM and drafter, the same policies as the simulator, wall-clock
replay of a workload (DESIGN.md "Live engine and the real models").

Imports: torch (this package is never imported by the simulator core).
"""

from simspec.live.engine import LiveConfig, LiveEngine
from simspec.live.records import LiveResult, StepRecord

__all__ = ["LiveConfig", "LiveEngine", "LiveResult", "StepRecord"]
