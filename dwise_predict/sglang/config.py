"""The plugin's settings: environment variables, optionally on top of a JSON config file.

SGLang plugins take no arguments and run in processes SGLang spawns, so the settings travel
the one way that reaches every scheduler process: the environment. ``DWISE_SGLANG_CONFIG``
may name a JSON file holding the same keys (lower case, without the prefix); a variable that
is set wins over the file. With neither ``DWISE_SGLANG_BUNDLE`` nor a ``bundle`` in the file,
and no ``DWISE_SGLANG_POLICY=observe``, the plugin registers nothing and SGLang runs exactly as
stock.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..bundle.bundle import ADMISSION_SOURCES
from ..bundle.promotion import PromotionRule
from ..env_settings import coerce
from ..errors import ConfigError
from ..runtime.fleet import DEFAULT_TOLERANCE
from ..runtime.policies import Policy
from ..runtime.registry import TUNABLES, make_policy_from_env, policy_entries

PREFIX = "DWISE_SGLANG_"
#: the policies that leave SGLang's rounds alone and only watch (fcfs: the older name)
OBSERVED = ("observe", "fcfs")
#: what the plugin can feed a policy in SGLang's loop (a bundle's estimates, the DWS cost, an
#: oracle file, an output-length baseline the bundle holds); a policy that needs anything else
#: (a score from outside) cannot serve here
SERVABLE_NEEDS = frozenset({"estimate", "refined", "true_rounds", "cost", "length"})
#: the data-parallel controller's methods the plugin offers (DWISE_SGLANG_DISPATCH)
DISPATCH_METHODS = ("sglang", "dwise")


def unmet_needs(policy: Policy) -> frozenset[str]:
    """What ``policy`` reads that the plugin cannot compute (a score is fine when it is the
    DWS cost the plugin prices)."""
    needs = policy.needs - ({"score"} if "cost" in policy.needs else set())
    return needs - SERVABLE_NEEDS


def planned_policies() -> tuple[str, ...]:
    """The registered policies whose rounds the plugin composes from the core scheduler's
    plan: every one whose ``needs`` the plugin can feed (the simulator's names)."""
    return tuple(
        name
        for name, entry in policy_entries().items()
        if name not in OBSERVED and not unmet_needs(entry.build())
    )


@dataclass(frozen=True)
class PluginConfig:
    """What the plugin does in a scheduler process.

    ``policy="observe"`` (or its older name ``"fcfs"``) leaves SGLang's own round composition
    in place and writes serving traces (``trace_dir``); it needs no bundle, and with one the
    monitor compares its estimates with what requests took. ``"dwise"`` ranks waiting ∪
    resident by P + r̂ and runs the B smallest in one mixed-phase round; any policy of
    :func:`planned_policies` serves the same way (one that needs ``"cost"`` needs a bundle
    with a DWS predictor and a cost profile). ``slots`` = B block slots per round, ``k`` the
    resident multiplier (at most k·B residents: launch SGLang with
    ``--max-running-requests`` at least k·B).
    """

    bundle: str | None = None
    policy: str = "dwise"
    slots: int = 16
    k: int = 8
    refine: bool = True
    #: where an arrival's admission estimate comes from (``bundle.ADMISSION_SOURCES``):
    #: ``lightgbm`` (the paper's, microseconds) or ``lightgbm+dws`` (its mean with the DWS
    #: surface's expected rounds: ranks better, an encoder pass per arrival)
    admission: str = "lightgbm"
    #: the DWISE family's anti-starvation settings (``runtime.registry.TUNABLES``, see
    #: ``runtime.policies.DWISE``); None keeps the policy's own
    aging: float | None = None
    starvation_cap: int | None = None
    starvation_clock: str | None = None
    starvation_slack: float | None = None
    allow_mismatch: bool = False
    trace_dir: str | None = None
    trace_prompt_text: bool = False
    monitor_file: str | None = None
    monitor_window: int = 256
    monitor_every: int = 64
    #: finished requests a long-running request may hold out of the monitor's window before the
    #: earliest enter regardless (the window takes whole arrival cohorts); 0 = 4 windows
    monitor_hold: int = 0
    drift_threshold: float = 1.5
    #: the monitor also flags drift when ρ falls this far below its first full window's
    drift_rho_drop: float = 0.2
    kv_limit_frac: float = 0.9
    slack_blocks: int = 2
    #: policy "oracle": a JSON file {request id: denoising forwards} or a trace folder whose
    #: rows give each request's true work (benchmarks replay requests they served before)
    oracle: str | None = None
    #: hot swap (docs/refresh.md): seconds between checks of ``bundle`` for a new revision;
    #: 0 = never (the bundle is read once, at start-up)
    watch_seconds: float = 0.0
    #: the data-parallel controller's method (``--dp-size N``): ``sglang`` keeps SGLang's own
    #: ``--load-balance-method``; ``dwise`` sends each arrival to the rank where its predicted
    #: work adds least to the completion times under SRPT (docs/fleet.md)
    dispatch: str = "sglang"
    #: a busy rank whose work report is older than this many seconds counts as missing
    dispatch_stale_s: float = 5.0
    #: ``dwise`` dispatch takes the ranks within this share of the least added cost in turn
    #: (0: always the least; docs/fleet.md)
    dispatch_tolerance: float = DEFAULT_TOLERANCE
    #: a new revision predicts beside the live bundle for this many finished requests first
    shadow_requests: int = 128
    #: how much worse (ρ, |log median ratio|) a revision may look in shadow and be promoted
    promote_margin: float = 0.02
    #: after promotion, a fall of the live figures past this from the shadow ones rolls back
    #: (when the previous bundle does better on the same requests)
    rollback_drop: float = 0.10

    def __post_init__(self) -> None:
        if self.policy not in OBSERVED:
            self.make_policy()  # refuses an unknown name or a bad setting, naming it
        for name in ("slots", "k", "monitor_window", "monitor_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{PREFIX}{name.upper()}={v!r} must be a positive integer")
        if not isinstance(self.monitor_hold, int) or self.monitor_hold < 0:
            raise ConfigError(
                f"{PREFIX}MONITOR_HOLD={self.monitor_hold!r} must be a whole number of finished "
                "requests >= 0 (0: four monitor windows)"
            )
        if self.admission not in ADMISSION_SOURCES:
            raise ConfigError(
                f"{PREFIX}ADMISSION={self.admission!r} is not one of {ADMISSION_SOURCES} "
                "(lightgbm = the admission model alone; lightgbm+dws = its mean with the DWS "
                "surface's expected rounds)"
            )
        if not self.drift_threshold > 1.0:
            raise ConfigError(
                f"{PREFIX}DRIFT_THRESHOLD={self.drift_threshold!r} must be > 1 "
                "(a factor: warn when median predicted/actual leaves [1/t, t])"
            )
        if not (math.isfinite(self.drift_rho_drop) and self.drift_rho_drop >= 0):
            raise ConfigError(
                f"{PREFIX}DRIFT_RHO_DROP={self.drift_rho_drop!r} must be >= 0 (2 turns the "
                "ρ rule off)"
            )
        if not (math.isfinite(self.watch_seconds) and self.watch_seconds >= 0):
            raise ConfigError(
                f"{PREFIX}WATCH_SECONDS={self.watch_seconds!r} must be >= 0 (0: no hot swap)"
            )
        self.promotion_rule()  # refuses a bad shadow/margin/rollback setting, naming it
        if self.watch_seconds and self.admission != "lightgbm":
            raise ConfigError(
                f"{PREFIX}WATCH_SECONDS: a new revision shadows with the admission model's own "
                f"estimate, which {PREFIX}ADMISSION={self.admission} does not rank by; use "
                f"{PREFIX}ADMISSION=lightgbm with hot swap, or set {PREFIX}WATCH_SECONDS=0"
            )
        if self.dispatch not in DISPATCH_METHODS:
            raise ConfigError(
                f"{PREFIX}DISPATCH={self.dispatch!r} is not one of {DISPATCH_METHODS} "
                "(sglang = SGLang's own --load-balance-method; dwise = by predicted work)"
            )
        if not (math.isfinite(self.dispatch_stale_s) and self.dispatch_stale_s > 0):
            raise ConfigError(f"{PREFIX}DISPATCH_STALE_S={self.dispatch_stale_s!r} must be > 0")
        if not (math.isfinite(self.dispatch_tolerance) and self.dispatch_tolerance >= 0):
            raise ConfigError(
                f"{PREFIX}DISPATCH_TOLERANCE={self.dispatch_tolerance!r} must be a share >= 0 "
                f"of the least added cost (0: always the rank that adds least; default "
                f"{DEFAULT_TOLERANCE})"
            )
        if not 0.0 < self.kv_limit_frac <= 1.0:
            raise ConfigError(f"{PREFIX}KV_LIMIT_FRAC={self.kv_limit_frac!r} must lie in (0, 1]")
        if not self.bundle and self.policy not in OBSERVED:
            raise ConfigError(
                f"{PREFIX}POLICY={self.policy} ranks requests by a bundle's estimates: set "
                f"{PREFIX}BUNDLE, or serve with {PREFIX}POLICY=observe to trace without one"
            )
        if self.policy == "oracle" and not self.oracle:
            raise ConfigError(
                f"{PREFIX}POLICY=oracle ranks by each request's true work: set {PREFIX}ORACLE "
                "to a JSON file {request id: denoising forwards} or a folder of its traces"
            )
        if not self.bundle and not self.trace_dir:
            raise ConfigError(
                f"{PREFIX}POLICY={self.policy} without a bundle only writes serving traces: "
                f"set {PREFIX}TRACE_DIR (or {PREFIX}BUNDLE to monitor a bundle's estimates)"
            )

    @property
    def planned(self) -> bool:
        """Whether the plugin composes SGLang's rounds (False: it only observes)."""
        return self.policy not in OBSERVED

    def make_policy(self) -> Policy:
        """The core policy this configuration serves (the simulator's, by the same name)."""
        options = {k: getattr(self, k) for k in TUNABLES}
        policy = make_policy_from_env(PREFIX, self.policy, **options)
        if unmet_needs(policy):
            raise ConfigError(
                f"{PREFIX}POLICY={self.policy} ranks by inputs the plugin cannot compute in "
                f"SGLang's loop ({sorted(unmet_needs(policy))}); choose one of "
                f"{planned_policies()} or observe"
            )
        return policy

    def promotion_rule(self) -> PromotionRule:
        """How a new revision shadows, is promoted and rolled back (``bundle.promotion``)."""
        try:
            return PromotionRule(self.shadow_requests, self.promote_margin, self.rollback_drop)
        except ConfigError as e:
            raise ConfigError(
                f"{PREFIX}SHADOW_REQUESTS / PROMOTE_MARGIN / ROLLBACK_DROP: {e}"
            ) from None

    @property
    def max_residents(self) -> int:
        return self.slots * self.k


_KINDS: dict[str, type] = {
    "slots": int,
    "k": int,
    "monitor_window": int,
    "monitor_every": int,
    "monitor_hold": int,
    "slack_blocks": int,
    "refine": bool,
    "allow_mismatch": bool,
    "trace_prompt_text": bool,
    "aging": float,
    "starvation_cap": int,
    "starvation_slack": float,
    "drift_threshold": float,
    "drift_rho_drop": float,
    "kv_limit_frac": float,
    "watch_seconds": float,
    "dispatch_stale_s": float,
    "dispatch_tolerance": float,
    "shadow_requests": int,
    "promote_margin": float,
    "rollback_drop": float,
}


def load_config(env: Mapping[str, str] | None = None) -> PluginConfig | None:
    """The plugin's settings from ``env`` (default ``os.environ``); None = plugin off."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    file = env.get(f"{PREFIX}CONFIG")
    if file:
        path = Path(file).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{PREFIX}CONFIG={file!r} cannot be read as JSON ({e}); "
                "point it at a JSON object of plugin settings"
            ) from e
        if not isinstance(data, dict):
            raise ConfigError(f"{PREFIX}CONFIG={file!r} must hold a JSON object")
        values.update(data)
    known = {f.name for f in fields(PluginConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{PREFIX}CONFIG names unknown settings {unknown}; known: {sorted(known)}"
        )
    for name in known:
        raw = env.get(f"{PREFIX}{name.upper()}")
        if raw is not None:
            values[name] = raw
    if not values.get("bundle") and str(values.get("policy", "")).strip() not in OBSERVED:
        return None
    parsed = {name: coerce(PREFIX, name, _KINDS.get(name, str), v) for name, v in values.items()}
    return PluginConfig(**parsed)
