"""The SimPy serving model (the only simpy importer). See replica.py."""

from simspec.serving.config import EngineConfig
from simspec.sim.replica import Replica, simulate

__all__ = ["EngineConfig", "Replica", "simulate"]
