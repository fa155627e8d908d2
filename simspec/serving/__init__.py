"""What the simulator and the live engine share about serving: the engine's
knobs and GPU memory (``config``), the vLLM / SGLang / simspec presets of
them (``modes``), the scheduler's compiled rules (``queues``), the Python
scheduler and prefix cache over them (``scheduler``), and the acceptance
estimate the adaptive policies read (``estimate``).

Nothing here imports simpy or torch.
"""
