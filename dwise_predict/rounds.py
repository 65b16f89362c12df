"""Totals derived from a request's rounds per output block, defined once for every record.

A traced request (the tracer's result) and a simulated request both keep the list of denoising
rounds each output block took; the total rounds and the output block count follow from it the
same way for both.
"""

from __future__ import annotations

from collections.abc import Sequence


class RoundsPerBlock:
    """Mixin for a record with ``rounds_per_block`` (one count per output block, in order)."""

    rounds_per_block: Sequence[int]

    @property
    def total_rounds(self) -> int:
        """All denoising rounds of the request."""
        return int(sum(self.rounds_per_block))

    @property
    def output_blocks(self) -> int:
        return len(self.rounds_per_block)
