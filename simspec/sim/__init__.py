"""The SimPy serving model (the only simpy importer). See replica.py."""

from simspec.scheduling import EngineConfig
from simspec.sim.replica import Replica, simulate

__all__ = ["EngineConfig", "Replica", "simulate"]
