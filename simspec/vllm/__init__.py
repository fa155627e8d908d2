"""Driving a real vLLM: its server and benchmark as commands (``server``),
the files they write read back (``logs``), the small models it serves
(``models``, ``distill``), and step costs and acceptance fitted from its
logs (``calibrate``). vLLM is never imported; it runs as a process.
"""
