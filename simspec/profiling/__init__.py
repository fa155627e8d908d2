"""GPU/CPU operator profiling (torch)."""
