"""The KV pool with worst-case reservations.

DWISE admits a request only when its worst-case KV footprint fits: prompt tokens + the full
output budget + a slack of 2 blocks, summed over residents, under 90% of the pool (paper §4.3).
Because every resident holds the memory to finish, pausing or preempting it can never deadlock
the pool. The pool counts tokens; a serving framework converts its own page/byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, SchedulerError


@dataclass
class KVPool:
    """Token-counted KV pool. ``limit_tokens`` = ``limit_frac`` · ``pool_tokens`` is what residents
    may reserve."""

    pool_tokens: int
    limit_frac: float = 0.9
    slack_blocks: int = 2
    reserved: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.pool_tokens, (int,)) or self.pool_tokens < 1:
            raise ConfigError(
                f"kv pool_tokens={self.pool_tokens!r} must be "
                "a positive integer (tokens the KV cache holds)"
            )
        if not 0.0 < self.limit_frac <= 1.0:
            raise ConfigError(
                f"kv limit_frac={self.limit_frac} must lie in (0, 1]; the paper uses 0.9"
            )
        if self.slack_blocks < 0:
            raise ConfigError(f"kv slack_blocks={self.slack_blocks} must be >= 0; the paper uses 2")

    @property
    def limit_tokens(self) -> int:
        return int(self.pool_tokens * self.limit_frac)

    @property
    def free_tokens(self) -> int:
        return self.limit_tokens - self.reserved

    def worst_case(self, prompt_tokens: int, output_budget: int, block_size: int) -> int:
        """Tokens a request may ever hold: prompt + full output budget + slack blocks."""
        return int(prompt_tokens) + int(output_budget) + self.slack_blocks * int(block_size)

    def check_admissible(self, tokens: int, where: str) -> None:
        """Refuse at arrival a request that could never be admitted (it would wait forever)."""
        if tokens > self.limit_tokens:
            raise SchedulerError(
                f"{where} needs {tokens} KV tokens worst case but the pool admits at most "
                f"{self.limit_tokens} ({self.limit_frac:.0%} of {self.pool_tokens}); raise "
                "kv_pool_tokens or shorten the prompt/output budget"
            )

    def fits(self, tokens: int) -> bool:
        return self.reserved + tokens <= self.limit_tokens

    def reserve(self, tokens: int) -> None:
        if not self.fits(tokens):
            raise SchedulerError(
                f"KV over-commit: reserving {tokens} with "
                f"{self.reserved}/{self.limit_tokens} reserved"
            )
        self.reserved += int(tokens)

    def release(self, tokens: int) -> None:
        self.reserved -= int(tokens)
        if self.reserved < 0:
            raise SchedulerError(
                "KV released more than reserved; a finished request was reported twice"
            )
