"""The SimPy serving model (the only simpy importer). See replica.py."""

from simspec.sim.replica import EngineConfig, Replica, simulate

__all__ = ["EngineConfig", "Replica", "simulate"]
