"""The policy registry: every scheduling policy by name, in one place.

Why: the simulator, ``dwise-predict simulate``/``demo``, :func:`make_policy` and the SGLang
plugin all pick a policy by name. They read this one table, so a new policy is one class plus
one :func:`register_policy` line, and nothing else in the library names it. A driver learns
what to feed a policy from the policy itself (its ``needs``, see
:class:`~dwise_predict.runtime.policies.Policy`), never from its name.

The shipped policies register at the bottom of :mod:`.policies`. ``"dwise"`` is the library's
default policy: the name the CLI, the simulator and the plugin's ``DWISE_SGLANG_POLICY``
default to. Which policy it means is the
one ``register_policy("dwise", ...)`` line; the paper's plain DWISE stays available as
``"dwise-uncapped"``.

A registry of names is process-wide by nature (like timm's model names); it holds only
constructors, never state, and :func:`make_policy` builds a fresh, frozen policy per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .policies import Policy

#: the name every entry point defaults to
DEFAULT_POLICY = "dwise"

#: the per-request inputs a policy may list in ``needs``, and where a driver finds them
NEEDS = {
    "estimate": "the admission estimate of total denoising rounds (a bundle)",
    "refined": "the refined estimate after the first denoising round (a refinement predictor)",
    "true_rounds": "each request's true denoising rounds (oracle; replays only)",
    "score": "a per-request score, lower first (the driver supplies it)",
    "cost": "the score is the DWS surface priced by the cost profile, in ms (an encoder pass "
    "per arrival; the bundle needs a DWS predictor and a cost profile)",
    "length": "the estimate (and, with 'refined', the refined one) comes from the output-length "
    "baseline the policy names (``policy.predictor``: a bundle kind, docs/baselines.md), in "
    "rounds: predicted output tokens / its tokens per round",
}

#: anti-starvation settings a policy takes as dataclass fields; :func:`make_policy` applies the
#: ones a policy has and leaves the others (so ``--aging`` can ride along with ``fcfs``)
TUNABLES = ("aging", "starvation_cap", "starvation_clock", "starvation_slack")


@dataclass(frozen=True)
class PolicyEntry:
    """One registered name: how to build the policy, and one line saying what it is."""

    name: str
    build: Callable[[], Policy]
    summary: str


_ENTRIES: dict[str, PolicyEntry] = {}


def register_policy(name: str, build: Callable[[], Policy], summary: str) -> None:
    """Make ``build()`` available as policy ``name``; a name taken by another is refused."""
    key = name.strip().lower()
    if not key or key != name:
        raise ConfigError(f"policy name {name!r} must be lower case with no spaces around it")
    taken = _ENTRIES.get(key)
    if taken is not None and taken.build is not build:
        raise ConfigError(f"policy {name!r} is already registered; choose another name")
    _ENTRIES[key] = PolicyEntry(key, build, summary)


def unregister_policy(name: str) -> None:
    """Forget ``name`` (for tests and plug-ins that add a policy for a while)."""
    _ENTRIES.pop(name, None)


def _ensure_builtin() -> None:
    from . import policies  # noqa: F401 - registers the shipped policies on import


def policy_entries() -> dict[str, PolicyEntry]:
    """Every registered policy, in registration order (the shipped ones first)."""
    _ensure_builtin()
    return dict(_ENTRIES)


def policy_names() -> tuple[str, ...]:
    return tuple(policy_entries())


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy by its registered name.

    ``options`` are the anti-starvation settings of :data:`TUNABLES` (``aging``,
    ``starvation_cap``, ``starvation_clock``, ``starvation_slack``); None keeps the policy's
    own. A setting the policy does not have is refused, naming the policies that have it (the
    default ``dwise`` carries its own tail rule; the older rules belong to ``dwise-uncapped``
    and its family).
    """
    policy = _build(name)
    given = _given(options)
    unknown = sorted(set(given) - _settings(policy))
    if unknown:
        having = [n for n in policy_names() if set(unknown) <= _settings(_build(n))]
        raise ConfigError(
            f"policy {policy.name!r} has no setting {', '.join(unknown)}; "
            f"policies that have it: {', '.join(having) or 'none'}"
        )
    return _with(policy, given)


def make_policy_from_env(prefix: str, name: str, **options: Any) -> Policy:
    """:func:`make_policy` for settings an engine integration read from the environment
    (``{prefix}POLICY``, ``{prefix}AGING``, ...): a refusal names the variable to fix."""
    given = _given(options)
    try:
        return make_policy(name, **given)
    except ConfigError as e:
        bad = next((k for k in TUNABLES if f"{k}=" in str(e)), None)
        where = f"POLICY={name}" if bad is None else f"{bad.upper()}={given[bad]!r}"
        raise ConfigError(f"{prefix}{where}: {e}") from None


def parse_policies(text: str | Sequence[str | Policy], **options: Any) -> list[Policy]:
    """Policies from ``"fcfs,dwise"`` or a list of names and policies. Each setting in
    ``options`` (see :func:`make_policy`) goes to the policies named here that have it (policy
    objects are taken as they are); a setting none of them has is refused."""
    items: list[str | Policy] = (
        [s.strip() for s in text.split(",") if s.strip()] if isinstance(text, str) else list(text)
    )
    if not items:
        raise ConfigError("no policies given; pass e.g. --policies fcfs,dwise,oracle")
    given = _given(options)
    out: list[Policy] = []
    taken: set[str] = set()
    for item in items:
        if isinstance(item, str):
            policy = _build(item)
            have = _settings(policy)
            taken |= have
            item = _with(policy, {k: v for k, v in given.items() if k in have})
        out.append(item)
    unused = sorted(set(given) - taken)
    if unused:
        raise ConfigError(
            f"no listed policy has the setting {', '.join(unused)}; list one that does "
            "(e.g. dwise-uncapped)"
        )
    return out


def _build(name: str) -> Policy:
    entries = policy_entries()
    entry = entries.get(name.strip().lower())
    if entry is None:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(entries)}")
    return entry.build()


def _given(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(TUNABLES))
    if unknown:
        raise ConfigError(f"unknown policy options {unknown}; known: {list(TUNABLES)}")
    return {k: v for k, v in options.items() if v is not None}


def _settings(policy: Policy) -> set[str]:
    """The :data:`TUNABLES` ``policy`` has as fields."""
    if not dataclasses.is_dataclass(policy):
        return set()
    return {f.name for f in dataclasses.fields(policy)} & set(TUNABLES)


def _with(policy: Policy, given: dict[str, Any]) -> Policy:
    return dataclasses.replace(policy, **given) if given else policy  # type: ignore[type-var]


def policy_help() -> str:
    """``name: summary`` lines for ``--help`` and error messages."""
    return "; ".join(f"{e.name}: {e.summary}" for e in policy_entries().values())
