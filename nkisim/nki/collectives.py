"""``nki.collectives`` (2.28+): collective communication between NeuronCores.

The real CPU simulator does not implement collectives ("nki.collectives is not implemented", SIM
§Simulation Limitations; spec nki-current.md §3), and neither does nkisim: the module imports
(nki-library imports it at module level) and every collective raises NotImplementedError when a
kernel calls it. ``ReplicaGroup`` holds its groups so kernels can build one.
"""

from __future__ import annotations


class ReplicaGroup:
    """``ReplicaGroup(groups)``: the ranks taking part in a collective."""

    def __init__(self, groups=None, *args, **kwargs):
        self.groups = [list(g) for g in groups] if groups is not None else []

    def __repr__(self):
        return f"ReplicaGroup({self.groups!r})"


def _not_simulated(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"nki.collectives.{name} is not supported by nkisim: collectives are not simulated "
            "(nor by AWS's CPU simulator, SIM 'Simulation Limitations')")
    fn.__name__ = fn.__qualname__ = name
    return fn


for _name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
              "all_gather_v", "collective_permute", "collective_permute_implicit",
              "collective_permute_implicit_current_processing_rank_id",
              "collective_permute_implicit_reduce", "rank_id",
              "send", "recv"):
    globals()[_name] = _not_simulated(_name)
del _name
