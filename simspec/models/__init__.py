"""The live models: a synthetic multimodal task and a small target VLM.

Imports: torch, numpy and :mod:`simspec.types`. The simulator
(:mod:`simspec.sim` and everything it imports) must never import this package.
"""
