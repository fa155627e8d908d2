"""Simulated against live: the project's own engine (``engine``: calibrate
the simulator from live runs, then predict held-out loads) and a running
vLLM (``vllm``: serve, benchmark, fit, compare).
"""
