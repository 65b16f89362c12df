"""What the output-length baselines' policies rank by, for a replay: ``Workload.lengths``.

A policy that needs ``"length"`` (:class:`~.policies.LengthSRPT`: ``ssjf``, ``s3``, ``ltr``,
``trail``) ranks by ``P + r̂`` like DWISE, with ``r̂`` taken from the output-length baseline it
names instead of the admission and refinement predictors. A workload carries those estimates
in rounds under ``lengths[KIND]`` (at arrival) and ``lengths["KIND:refined"]`` (rounds still to
go after the first denoising round, TRAIL's re-estimate):

* on traces, :func:`lengths_from_bundle` runs a bundle that holds the baseline kinds
  (``dwise-predict train --only ...,ssjf,s3,ltr,trail``);
* on the paper-matched synthetic workload, which has no prompts or hidden states,
  :func:`synthetic_lengths` draws each baseline's predicted OUTPUT TOKENS as the true output
  tokens with log-normal noise solved for a Spearman ρ with them (by default the ρ the trained
  baselines reach on the reference model's traces, :data:`MEASURED_TOKEN_RHO`), stated in
  rounds with the workload's own tokens per round. The noise is on output length, not on
  work: what the policies then show is what ranking by output length costs where output length
  and denoising work part ways, as in the paper's workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, TraceError
from .workload import Workload

if TYPE_CHECKING:
    import pyarrow as pa

    from ..bundle import Bundle
    from .policies import Policy

#: the baselines' kinds (``dwise_predict.predictors.baselines.LENGTH_KINDS``)
LENGTH_KINDS = ("ssjf", "s3", "ltr", "trail")
#: Spearman ρ of each baseline's predicted output tokens with the true output tokens, measured
#: on held-out tiny-bd traces by ``benchmarks/baselines.py`` (597 traces, the mean of two folds;
#: ``trail:refined`` is TRAIL's re-estimate after the first round): what
#: :func:`synthetic_lengths` reproduces by default
MEASURED_TOKEN_RHO: dict[str, float] = {
    "ssjf": 0.856,
    "s3": 0.887,
    "ltr": 0.823,
    "trail": 0.856,
    "trail:refined": 0.946,
}


def refined_key(kind: str) -> str:
    return f"{kind}:refined"


def length_inputs(workload: Workload, policy: Policy) -> tuple[np.ndarray, np.ndarray | None]:
    """(arrival estimates, refined estimates or None) of the baseline ``policy`` names."""
    kind = str(getattr(policy, "predictor", ""))
    lengths = workload.lengths or {}
    keys = [kind, *([refined_key(kind)] if "refined" in policy.needs else [])]
    missing = [k for k in keys if k not in lengths]
    if missing:
        raise ConfigError(
            f"policy {policy.name!r} ranks by the {kind or '?'} output-length baseline, and the "
            f"workload carries no {missing} estimates (Workload.lengths): replay traces with a "
            "bundle trained with --only ...,ssjf,s3,ltr,trail (lengths_from_bundle), or the "
            "synthetic workload with synthetic_lengths"
        )
    refined = lengths[keys[1]] if len(keys) > 1 else None
    return lengths[kind], refined


def lengths_from_bundle(bundle: Bundle, table: pa.Table) -> dict[str, np.ndarray]:
    """``Workload.lengths`` for every trace row, from each baseline kind the bundle holds."""
    from ..bundle.modules import module_class
    from ..features import FEATURE_NAMES
    from ..traces import hidden_matrix

    for c in (*FEATURE_NAMES, "prompt_tokens", "output_budget"):
        if c not in table.column_names:
            raise TraceError(f"traces lack the column {c!r} the baselines read")
    features = np.column_stack(
        [table.column(c).to_numpy().astype(np.float64) for c in FEATURE_NAMES]
    )
    out: dict[str, np.ndarray] = {}
    hidden: np.ndarray | None = None
    for kind in LENGTH_KINDS:
        model: Any = bundle.module(module_class(kind))
        if model is None:
            continue
        out[kind] = np.asarray(model.arrival_rounds(features), dtype=np.float64)
        if model.refines:
            if hidden is None:
                hidden = hidden_matrix(table)
            out[refined_key(kind)] = np.asarray(
                model.refined_rounds(
                    hidden,
                    table.column("prompt_tokens").to_numpy().astype(np.float64),
                    table.column("output_budget").to_numpy().astype(np.float64),
                ),
                dtype=np.float64,
            )
    if not out:
        raise ConfigError(
            "the bundle holds no output-length baseline; train one with "
            "`dwise-predict train --only ssjf,s3,ltr,trail ...`"
        )
    return out


def synthetic_lengths(
    workload: Workload,
    rho: Mapping[str, float] | None = None,
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """``Workload.lengths`` for a workload without prompts (the synthetic one): each
    baseline's predicted output tokens drawn around the truth with Spearman ρ = ``rho[name]``
    (default :data:`MEASURED_TOKEN_RHO`), ÷ the workload's tokens per round (Σ output tokens /
    Σ denoising rounds). TRAIL's refined estimate is its re-estimated tokens in rounds less the
    round spent (no output block is committed after the first round)."""
    from .synthetic import noisy_estimate

    rho = dict(MEASURED_TOKEN_RHO if rho is None else rho)
    tokens = workload.output_tokens.astype(np.float64)
    if np.any(tokens < 0):
        raise ConfigError(
            "synthetic_lengths draws around the true output tokens, and this workload lacks "
            "them for some requests"
        )
    tpr = float(tokens.sum() / workload.total_rounds.sum())
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in sorted(rho):  # a fixed order: the same seed draws the same noise
        est = noisy_estimate(tokens, float(rho[name]), rng, name) / tpr
        out[name] = np.maximum(est - 1.0, 0.0) if name.endswith(":refined") else est
    return out


def length_predictor(bundle: Bundle, policy: Policy) -> Any:
    """The output-length baseline a ``"length"`` policy ranks by, from ``bundle`` (an engine
    integration's feed: ``arrival_rounds(features)`` at arrival, ``refined_rounds(hidden,
    prompt_tokens, output_budget)`` after the first round); None for any other policy. A
    bundle without it is refused, naming the fix."""
    if "length" not in policy.needs:
        return None
    from ..bundle.modules import module_class

    return bundle.need(module_class(str(getattr(policy, "predictor", ""))))
