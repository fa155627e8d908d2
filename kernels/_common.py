"""What every kernel op shares: choosing the implementation and checking inputs.

``choose(impl, *tensors)`` picks "reference" or "triton" for ``impl="auto"``:
Triton when the tensors live on CUDA or ``TRITON_INTERPRET=1`` is set (the
Triton interpreter then runs the kernels on the CPU), the plain-PyTorch
reference otherwise, and whenever triton is not installed. ``Dims`` binds the
shape letters of one call (B, Q, H, D, ...) as it meets each tensor and raises
``ValueError`` naming the tensor that breaks them.

Imports: torch only (triton is imported lazily, by the op that needs it).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

IMPLS = ("auto", "reference", "triton")
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
INT64 = (torch.int64,)


@functools.lru_cache(maxsize=None)
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def choose(impl: str, *tensors: torch.Tensor) -> str:
    """Resolve ``impl`` ("auto" | "reference" | "triton") for these tensors."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    on_cuda = any(t.is_cuda for t in tensors)
    if impl == "auto":
        return "triton" if triton_installed() and (on_cuda or interpreting()) else "reference"
    if impl == "triton":
        if not triton_installed():
            raise ValueError("impl='triton' needs the triton package (pip install simspec[kernels])")
        if not (on_cuda or interpreting()):
            raise ValueError("impl='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
    return impl


def upcast_dots(dtype: torch.dtype) -> bool:
    """Whether kernels must feed ``tl.dot`` fp32 instead of ``dtype``: the Triton
    interpreter (3.9) multiplies bfloat16 operands as raw bits. On a GPU, never."""
    return dtype == torch.bfloat16 and interpreting()


class Dims:
    """Shape letters bound across the inputs of one call.

    ``dims.check("q", q, "B Q H D", FLOATS)`` binds B, Q, H and D the first time
    a letter is seen and checks every later tensor against them, so the error
    names the tensor that disagrees and the one the size came from.
    """

    def __init__(self, **known: int) -> None:
        self.sizes: dict[str, int] = dict(known)
        self.source: dict[str, str] = {letter: "argument" for letter in known}
        self.device: torch.device | None = None

    def __getitem__(self, letter: str) -> int:
        return self.sizes[letter]

    def check(self, name: str, t: object, letters: str, dtypes: tuple[torch.dtype, ...] | None = None) -> torch.Tensor:
        names = letters.split()
        want = "[" + ", ".join(names) + "]"
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor {want}, got {type(t).__name__}")
        if t.dim() != len(names):
            raise ValueError(f"{name} must be {want} (rank {len(names)}), got shape {tuple(t.shape)}")
        for letter, size in zip(names, t.shape):
            if letter in self.sizes and self.sizes[letter] != size:
                raise ValueError(f"{name} must be {want} with {letter}={self.sizes[letter]} "
                                 f"(from {self.source[letter]}), got shape {tuple(t.shape)}")
            self.sizes.setdefault(letter, size)
            self.source.setdefault(letter, name)
        if dtypes is not None and t.dtype not in dtypes:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"{name} must have dtype {allowed}; got {str(t.dtype).removeprefix('torch.')}")
        if self.device is None:
            self.device = t.device
        elif t.device != self.device:
            raise ValueError(f"{name} is on {t.device}, the other inputs on {self.device}")
        return t


def check_range(name: str, t: torch.Tensor, low: int | torch.Tensor, high: int | torch.Tensor, what: str) -> None:
    """Raise unless ``low <= t <= high`` elementwise (one host sync on CUDA)."""
    bad = (t < low) | (t > high)
    if t.numel() and bool(bad.any()):
        raise ValueError(f"{name} must lie in {what}; got {t[bad][:8].tolist()}")
