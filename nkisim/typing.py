"""``neuronxcc.nki.typing`` (nt): kernel parameter annotations and input placeholders (ref §1.1).

- ``nt.tensor`` / ``nt.tensor[shape]`` / ``nt.mutable_tensor``: annotations (``def k(a:
  nt.mutable_tensor)``: the kernel may write ``a`` and must return it).
- ``nt.tensor[[shape], dtype]``: a placeholder input for ``nki.benchmark`` / ``nki.profile``, which
  only need shapes and dtypes (nki-samples fc5c69f tutorials/matrix_multiplication:
  ``lhsT = nt.tensor[[8192, 4096], nl.bfloat16]`` then ``nki.benchmark(...)(kernel)(lhsT, rhs)``).
  nkisim simulates, so it needs values: a placeholder becomes an array of that shape and dtype
  filled with uniform [0, 1) values from a fixed seed (finite, reproducible).
"""

from __future__ import annotations

import numpy as np


class _TensorAnnotation:
    def __init__(self, name, shape=None, dtype=None, origin=None):
        self.__name__ = name
        self.shape = shape
        self.dtype = dtype
        self.__origin__ = origin

    def __getitem__(self, item):
        origin = self.__origin__ or self
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple)):
            shape, dtype = tuple(int(s) for s in item[0]), item[1]
            return TensorPlaceholder(self.__name__, shape, dtype, origin)
        shape = item if isinstance(item, tuple) else (item,)
        return _TensorAnnotation(self.__name__, shape, None, origin)

    def __repr__(self):
        if self.shape is None:
            return f"nt.{self.__name__}"
        return f"nt.{self.__name__}[{', '.join(map(str, self.shape))}]"


class TensorPlaceholder(_TensorAnnotation):
    """``nt.tensor[[shape], dtype]``: an input known by its shape and dtype only."""

    @property
    def ndim(self):
        return len(self.shape)

    def make(self, seed=0) -> np.ndarray:
        from . import dtypes
        dt = dtypes.normalize(self.dtype)
        vals = np.random.default_rng(seed).random(self.shape, dtype=np.float32)
        if dtypes.is_float(dt):
            return dtypes.cast(vals, dt)
        return (vals * 8).astype(dt)           # small non-negative integers

    def __repr__(self):
        return f"nt.{self.__name__}[{list(self.shape)}, {self.dtype!r}]"


# `def kernel(a: nt.mutable_tensor)`: the kernel may write `a` and must return it.
mutable_tensor = _TensorAnnotation("mutable_tensor")
tensor = _TensorAnnotation("tensor")
