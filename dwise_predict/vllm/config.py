"""The vLLM scheduler's settings: environment variables (``DWISE_VLLM_*``).

vLLM builds the scheduler class it is given with ``--scheduler-cls`` and passes it no settings
of ours, so, as for the SGLang plugin, they travel through the environment of the engine
process. Only ``DWISE_VLLM_BUNDLE`` is required; without it the DWISE scheduler refuses to
start (drop ``--scheduler-cls`` to serve with vLLM's own order).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..env_settings import coerce
from ..errors import ConfigError
from ..runtime.policies import Policy
from ..runtime.registry import TUNABLES, make_policy_from_env

PREFIX = "DWISE_VLLM_"
#: the per-request inputs (a policy's ``needs``) the scheduler can give a policy in vLLM's
#: loop: the admission estimate (a bundle), and the true work (``vllm_xargs``, benchmarks).
#: ``refined`` is accepted and served with the admission estimate, counted down: vLLM 0.33.0
#: hands the scheduler no hidden state (docs/vllm.md, "Refinement")
SERVABLE_NEEDS = frozenset({"estimate", "refined", "true_rounds"})


@dataclass(frozen=True)
class VllmConfig:
    """What the DWISE scheduler does in a vLLM engine process.

    ``policy`` names the runtime policy (``dwise_predict.runtime.make_policy``) whose ``key``
    orders vLLM's waiting queue and running list (default ``dwise``: P + r̂, with whatever tail
    rule the runtime's ``dwise`` carries). ``aging`` and the ``starvation_*`` settings, when
    set, are passed to ``make_policy``; unset (None), the policy keeps its own defaults.
    ``allow_mismatch`` serves a bundle whose fingerprint differs from the server's with a
    warning instead of refusing.
    """

    bundle: str | None = None
    policy: str = "dwise"
    allow_mismatch: bool = False
    aging: float | None = None
    starvation_cap: int | None = None
    starvation_clock: str | None = None
    starvation_slack: float | None = None

    def make_policy(self) -> Policy:
        """The runtime policy, by name, with the tunables that were set."""
        options = {k: getattr(self, k) for k in TUNABLES}
        return make_policy_from_env(PREFIX, self.policy, **options)

    def __post_init__(self) -> None:
        policy = self.make_policy()  # refuses an unknown name or a bad setting
        unmet = set(policy.needs) - SERVABLE_NEEDS
        if unmet:
            raise ConfigError(
                f"{PREFIX}POLICY={self.policy} ranks by {sorted(unmet)}, which the vLLM "
                "scheduler cannot compute per request: use dwise (the default), "
                "dwise-admission, dwise-r0, oracle or fcfs"
            )
        if not self.bundle and ({"estimate", "refined"} & set(policy.needs)):
            raise ConfigError(
                f"--scheduler-cls dwise_predict.vllm.DWISEDiffusionScheduler ranks requests by "
                f"a bundle's estimates: set {PREFIX}BUNDLE (a folder, hf://org/name@rev, or a "
                "zoo name such as tiny-bd), or drop --scheduler-cls"
            )


_KINDS: dict[str, type] = {
    "bundle": str,
    "policy": str,
    "allow_mismatch": bool,
    "aging": float,
    "starvation_cap": int,
    "starvation_clock": str,
    "starvation_slack": float,
}


def load_config(env: Mapping[str, str] | None = None) -> VllmConfig:
    """The scheduler's settings from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    values = {
        name: coerce(PREFIX, name, kind, env[f"{PREFIX}{name.upper()}"])
        for name, kind in _KINDS.items()
        if f"{PREFIX}{name.upper()}" in env
    }
    if values.get("policy") is None:
        values.pop("policy", None)
    return VllmConfig(**values)
