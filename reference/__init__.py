"""Golden models for the CS149 Assignment 4 kernels (NumPy only).

Each kernel has two models:

* an *exact* model computed in float64 from the (already rounded) inputs, the truth a kernel's
  output is compared against, and
* a low-precision *baseline* that mimics what correct hardware does (fp32 accumulation, output
  rounded to the kernel's dtype). Its error against the exact model is what a correct kernel
  can be expected to achieve.
"""

from .conv2d import (
    conv2d_maxpool,
    conv2d_maxpool_baseline,
    conv2d_maxpool_scale,
    conv2d_reduction_length,
    maxpool2d,
)
from .transpose import matrix_transpose, matrix_transpose_baseline
from .vector_add import vector_add, vector_add_baseline

__all__ = [
    "conv2d_maxpool",
    "conv2d_maxpool_baseline",
    "conv2d_maxpool_scale",
    "conv2d_reduction_length",
    "matrix_transpose",
    "matrix_transpose_baseline",
    "maxpool2d",
    "vector_add",
    "vector_add_baseline",
]
