"""``neuronxcc.nki.typing`` (nt): kernel parameter annotations (ref §1.1)."""

from __future__ import annotations


class _TensorAnnotation:
    def __init__(self, name):
        self.__name__ = name

    def __getitem__(self, item):
        return self

    def __repr__(self):
        return f"nt.{self.__name__}"


# `def kernel(a: nt.mutable_tensor)`: the kernel may write `a` and must return it.
mutable_tensor = _TensorAnnotation("mutable_tensor")
tensor = _TensorAnnotation("tensor")
