"""Pick the ``m`` smallest keys, ties broken by arrival sequence, in O(n) + O(m log m).

A full sort of 4,096 keys every round costs more than the whole round budget; ``argpartition``
finds the m smallest in linear time, and only the m winners are sorted. Ties at the cut are
resolved by the tie-break (earlier arrival first) so the choice never depends on numpy's
partition internals: the same state always gives the same plan.
"""

from __future__ import annotations

import numpy as np


def smallest(keys: np.ndarray, tiebreak: np.ndarray, m: int) -> np.ndarray:
    """Positions of the ``m`` smallest ``(key, tiebreak)`` pairs, sorted best first."""
    n = keys.size
    if m <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > m:
        part = np.argpartition(keys, m - 1)
        idx = part[:m]
        kth = keys[part[m - 1]]
        # argpartition leaves every key < kth inside idx; only ties at kth may straddle the cut
        if np.count_nonzero(keys == kth) > np.count_nonzero(keys[idx] == kth):
            less = idx[keys[idx] < kth]
            eq = np.flatnonzero(keys == kth)
            eq = eq[np.argsort(tiebreak[eq], kind="stable")[: m - less.size]]
            idx = np.concatenate((less, eq))
    else:
        idx = np.arange(n)
    order = np.lexsort((tiebreak[idx], keys[idx]))
    return idx[order]
