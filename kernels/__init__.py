"""simspec's GPU kernels (installed as ``simspec_kernels``): Triton kernels,
each with a plain-PyTorch reference that is its specification.

One public function per op, each taking ``impl="auto" | "reference" | "triton"``
("auto": Triton on CUDA tensors or under ``TRITON_INTERPRET=1``, else the
reference):

- ``int8_cache.quantize_keys`` / ``dequantize_keys``: the int8 visual-key cache;
- ``selection.select_visual_tokens``: top-k visual tokens by layer voting;
- ``cross_attention.gated_cross_attention``: the drafter's view of those tokens;
- ``tree_attention.tree_attention``: draft-tree verification.

Uni-LaSpec (Nie et al., arXiv 2611.01617) for the first three; EAGLE-2 and
vLLM v1 tree attention for the last.

Imports: torch and triton only (never simspec); triton only when a Triton
implementation is called, so the references work without it.
"""
