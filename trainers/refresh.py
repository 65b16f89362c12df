"""Refresh a live bundle from serving traces: train a candidate, score both, publish only a win.

Why a job of its own: traffic drifts after a bundle ships (the category mix, the system prompt,
the answer lengths), and the plugin's observe mode already writes what the server saw as
traces. Retraining by hand and hoping is not an operation; this is one step a cron job or a
Kubernetes job can run, with an exit status that says what happened:

1. the serving traces must come from the live bundle's dLLM (fingerprint check, as at serving);
2. the most recent ``holdout_frac`` of them (the last shards: writers name shards in time
   order) is held out; the candidate trains on the rest, optionally with the bundle's original
   training traces, with the live bundle's kinds that these traces can train;
3. live and candidate are scored on the same held-out requests;
4. the candidate is written to ``out`` only when it ranks at least as well (admission ρ within
   ``margin``) and is no worse calibrated (median predicted/actual no further from 1); otherwise
   nothing is written and the report says why.

The candidate is a new revision of the live bundle: its name, plus ``revision`` one higher and
``refreshed_from`` naming the live bundle in its training facts.
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dwise_predict.bundle import Bundle, load_bundle
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.features import FEATURE_SETS
from dwise_predict.predictors import AdmissionModel
from dwise_predict.traces import lexical_of_table, read_trace_fingerprint, read_traces

from .admission import AdmissionConfig

log = logging.getLogger(__name__)

#: the kind (and its estimate) a refresh is judged on: it orders every request at admission
JUDGED = AdmissionModel.kind


@dataclass(frozen=True)
class RefreshConfig:
    """How a refresh splits, trains and judges."""

    #: share of the serving traces, the most recent, held out to judge on
    holdout_frac: float = 0.2
    #: fewest held-out requests a verdict is based on
    min_holdout: int = 50
    #: the candidate may rank this much worse (admission ρ) and still count as at least as good
    margin: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.holdout_frac < 1.0:
            raise ConfigError(f"holdout_frac={self.holdout_frac} must lie in (0, 1)")
        if self.min_holdout < 3:
            raise ConfigError(f"min_holdout={self.min_holdout} must be >= 3 (a ρ needs 3)")
        if not math.isfinite(self.margin) or self.margin < 0:
            raise ConfigError(f"margin={self.margin} must be a finite number >= 0")


@dataclass
class RefreshReport:
    """What a refresh found: both bundles' held-out figures and the verdict."""

    live: dict[str, Any]
    candidate: dict[str, Any]
    train_requests: int
    holdout_requests: int
    promoted: bool
    reason: str
    published: Path | None = None
    kinds: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "candidate": self.candidate,
            "train_requests": self.train_requests,
            "holdout_requests": self.holdout_requests,
            "promoted": self.promoted,
            "reason": self.reason,
            "published": None if self.published is None else str(self.published),
            "kinds": self.kinds,
        }


def refresh_bundle(
    live: str | Path | Bundle,
    serving_traces: str | Path,
    out: str | Path,
    *,
    base_traces: str | Path | None = None,
    config: RefreshConfig | None = None,
) -> RefreshReport:
    """Train a candidate for ``live`` from ``serving_traces`` and publish it to ``out`` only
    when it is at least as good on the most recent held-out requests (see the module doc)."""
    cfg = config or RefreshConfig()
    bundle = live if isinstance(live, Bundle) else load_bundle(live)
    bundle.check(read_trace_fingerprint(serving_traces))  # refuses another dLLM's traces
    train, holdout = split_recent(read_traces(serving_traces), cfg)
    if base_traces is not None:
        train = _concat(read_traces(base_traces), train)
    kinds = _trainable_kinds(bundle, train)
    admission = _admission_config(bundle, train, holdout)
    log.info(
        "refresh %s: training %s on %d requests, judging on the %d most recent",
        bundle.name,
        "+".join(kinds),
        train.num_rows,
        holdout.num_rows,
    )
    with tempfile.TemporaryDirectory(prefix="dwise-refresh-") as tmp:
        draft = _train_candidate(bundle, train, Path(tmp) / "candidate", kinds, cfg.seed, admission)
        candidate = load_bundle(draft)
        live_m, cand_m = _judged(bundle, holdout), _judged(candidate, holdout)
        promoted, reason = verdict(live_m, cand_m, cfg.margin)
        published = _publish(draft, Path(out), bundle) if promoted else None
    log.info("refresh %s: %s", bundle.name, reason)
    return RefreshReport(
        live_m, cand_m, train.num_rows, holdout.num_rows, promoted, reason, published, kinds
    )


def split_recent(table: pa.Table, cfg: RefreshConfig) -> tuple[pa.Table, pa.Table]:
    """(older rows, the most recent ``holdout_frac`` of rows) in the order they were read."""
    n = table.num_rows
    n_hold = max(cfg.min_holdout, int(round(cfg.holdout_frac * n)))
    if n - n_hold < cfg.min_holdout:
        raise TrainingError(
            f"{n} serving requests are too few to refresh: holding out {n_hold} leaves "
            f"{n - n_hold} to train on (at least {cfg.min_holdout} each); serve longer "
            "with DWISE_SGLANG_TRACE_DIR set, or pass base traces"
        )
    return table.slice(0, n - n_hold), table.slice(n - n_hold)


def verdict(live: dict[str, Any], candidate: dict[str, Any], margin: float) -> tuple[bool, str]:
    """Whether the candidate is at least as good as the live bundle, and why (one line)."""
    rl, rc = live.get("spearman"), candidate.get("spearman")
    ml, mc = live.get("median_ratio"), candidate.get("median_ratio")
    if rc is None or mc is None:
        return False, "the candidate's admission estimates are undefined on the held-out requests"
    if rl is not None and rc < rl - margin:
        return False, f"kept the live bundle: candidate ρ {rc:.3f} < live ρ {rl:.3f} - {margin:g}"
    if ml is not None and ml > 0 and abs(math.log(mc)) > abs(math.log(ml)) + 1e-12:
        return False, (
            f"kept the live bundle: candidate median ratio {mc:.3f} is further from 1 than "
            f"live {ml:.3f}"
        )
    return True, (
        f"promoted: candidate ρ {rc:.3f} (live {'n/a' if rl is None else f'{rl:.3f}'}), "
        f"median ratio {mc:.3f} (live {'n/a' if ml is None else f'{ml:.3f}'})"
    )


def _trainable_kinds(bundle: Bundle, train: pa.Table) -> list[str]:
    """The live bundle's kinds these traces can train (refinement needs hidden states; DWS
    needs prompt text, which serving traces keep only on request)."""
    from .kind import trainable, trainer_for

    kinds = []
    for kind in bundle.modules:
        if kind not in trainable():
            continue
        t = trainer_for(kind)
        if t.needs_hidden and _all_null(train, "first_round_hidden"):
            log.warning("refresh: the serving traces carry no hidden states; %s is kept", kind)
            continue
        if (t.reads_text or t.needs_cost_profile) and _all_null(train, "prompt"):
            log.warning("refresh: the serving traces carry no prompt text; %s is kept", kind)
            continue
        kinds.append(kind)
    if JUDGED not in kinds:
        raise TrainingError(
            f"bundle '{bundle.name}' has no admission predictor to refresh; train one with "
            "`dwise-predict train`"
        )
    return kinds


def _admission_config(bundle: Bundle, train: pa.Table, holdout: pa.Table) -> AdmissionConfig:
    """The candidate's admission model reads the live one's features, so the two are judged on
    the same inputs; features that read the prompt's text need serving traces that keep it."""
    model = bundle.need(AdmissionModel)
    name = next((k for k, v in FEATURE_SETS.items() if v == model.feature_names), None)
    if name is None:
        raise TrainingError(
            f"bundle '{bundle.name}' reads the admission features {list(model.feature_names)}, "
            f"in no order this release trains ({sorted(FEATURE_SETS)}); retrain it with "
            "`dwise-predict train`"
        )
    if model.needs_text and (lexical_of_table(train) is None or lexical_of_table(holdout) is None):
        raise TrainingError(
            f"bundle '{bundle.name}' reads the prompt's lexical counts ({name} features) and "
            "these serving traces carry neither them nor the prompt's text (traces older than "
            "schema v3): trace again with this release, or serve a bundle trained with "
            "`--admission-features counts`"
        )
    return AdmissionConfig(features=name)


def _all_null(table: pa.Table, column: str) -> bool:
    return column not in table.column_names or table.column(column).null_count == table.num_rows


def _train_candidate(
    bundle: Bundle,
    train: pa.Table,
    out: Path,
    kinds: list[str],
    seed: int,
    admission: AdmissionConfig,
) -> Path:
    from .pipeline import train_bundle

    featurizer = bundle.admission.featurizer if bundle.admission is not None else None
    return train_bundle(
        train,
        out,
        only=kinds,
        seed=seed,
        featurizer=featurizer,
        name=bundle.name,
        cost_profile=bundle.cost_profile,
        configs={AdmissionModel.kind: admission},
        # serving traffic need not be labelled: the candidate is judged on the held-out
        # requests' rank correlation, which one category does not prevent
        allow_single_category=True,
    )


def _judged(bundle: Bundle, holdout: pa.Table) -> dict[str, Any]:
    from .evaluate import evaluate_bundle

    metrics = evaluate_bundle(bundle, holdout).get(JUDGED) or {}
    return {k: metrics.get(k) for k in ("spearman", "median_ratio", "n")}


def _publish(candidate: Path, out: Path, live: Bundle) -> Path:
    """Write the candidate to ``out`` as the live bundle's next revision (verified, atomic)."""
    from dwise_predict.bundle.update import update_bundle

    if out.exists():
        raise ConfigError(f"{out} exists; choose a new folder for the refreshed bundle")
    previous = int(live.manifest.get("revision", 0))
    with update_bundle(candidate, out=out) as draft:
        draft.manifest["revision"] = previous + 1
        training = dict(draft.manifest.get("training") or {})
        training["refreshed_from"] = {"name": live.name, "revision": previous}
        draft.manifest["training"] = training
    return out


def _concat(a: pa.Table, b: pa.Table) -> pa.Table:
    try:
        return pa.concat_tables([a, b.cast(a.schema)])
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TrainingError(
            f"base traces and serving traces do not share a schema ({e}); migrate both with "
            "`dwise-predict traces compact`"
        ) from e
