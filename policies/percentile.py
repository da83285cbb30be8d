"""`percentile`: the one definition of a percentile every report and metric in this project uses.

The ``q``-th percentile of ``n`` values is read at rank ``q / 100 * (n - 1)`` of the sorted
values, interpolating linearly between the two values around that rank: numpy's default
(``np.percentile(values, q)``, ``method="linear"``), so the 0th is the minimum, the 100th the
maximum and the 50th the median. For 160 values the 99th lies 41 % of the way from the 158th
to the 159th smallest.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (``0 <= q <= 100``) of ``values``, linearly interpolated.

    Raises:
        ValueError: if ``values`` is empty or ``q`` is outside ``[0, 100]``.
    """
    array = np.asarray(values if isinstance(values, np.ndarray) else list(values),
                       dtype=np.float64)
    if not array.size:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    return float(np.percentile(array, q))
