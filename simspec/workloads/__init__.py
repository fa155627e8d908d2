"""Workloads: when requests arrive and what they ask for.

Arrival processes are Poisson, Gamma renewal (vLLM's ``--burstiness`` is the
Gamma shape, inter-arrival CV = 1/sqrt(shape)), on/off bursts (a two-state
Markov-modulated Poisson process) and replay of a real trace with optional
time scaling. Each request gets a text prompt, zero or more images (each
worth the visual tokens its size gives by the model's rule: one size, a
distribution of sizes, or a trace's column; a fixed-size model's fixed
number) and an output length, drawn from lognormal distributions or taken
from the trace. Trace readers cover the
Azure LLM 2023 and Azure LMM 2025 CSV schemas and vLLM/AIPerf Mooncake-style
JSONL. Implements DESIGN.md, section "Workloads".

The package: ``config`` (the settings and the random streams), ``arrivals``,
``mix`` (what each request asks for) and ``traces`` (the readers).

Imports: the standard library, numpy, pandas and ``simspec.types`` only (no
simpy, no torch), so workloads can be built and inspected without the engine.

Randomness comes from five streams (:class:`WorkloadStreams`): arrivals,
lengths, images, shared content, image sizes. Each request consumes a fixed number of draws from the
lengths and images streams whatever the settings, so two scenarios with the
same seed share arrival times and lengths and differ only in what changed
(common random numbers); e.g. raising ``multimodal_share`` only adds images.
"""

from simspec.workloads.arrivals import arrival_times
from simspec.workloads.config import (ARRIVALS, BOUNDS, MAX_REQUESTS, OVER_CONTEXT, RESCALES, ImageSizes,
                                      WorkloadConfig, WorkloadStreams, arrival_cv, cv_to_burstiness, image_pixels,
                                      image_sizes)
from simspec.workloads.mix import ImageRule, Workload, make_requests, make_workload
from simspec.workloads.traces import MAX_COUNT, MAX_IMAGE_SIDE, Trace, read_trace

__all__ = ["ARRIVALS", "BOUNDS", "ImageRule", "ImageSizes", "MAX_COUNT", "MAX_IMAGE_SIDE", "MAX_REQUESTS",
           "OVER_CONTEXT", "RESCALES", "Trace", "Workload", "WorkloadConfig", "WorkloadStreams", "arrival_cv",
           "arrival_times", "cv_to_burstiness", "image_pixels", "image_sizes", "make_requests", "make_workload",
           "read_trace"]
