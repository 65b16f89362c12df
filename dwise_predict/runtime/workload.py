"""A replayable workload: requests' true shapes and estimates as arrays (for the simulator).

:class:`SimRequest` is the readable record; :class:`Workload` holds the same data as numpy
arrays (rounds of all output blocks flattened with offsets), which is what a 60,000-round
replay needs. ``requests_from_traces`` turns trace tables into requests, and
``estimates_from_bundle`` runs a predictor bundle over traces to get DWISE's two estimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..errors import PredictorInputError, SchedulerError, TraceError
from .request import SimRequest

if TYPE_CHECKING:
    from ..bundle import Bundle

#: trace columns the simulator replays
SIM_COLUMNS = (
    "request_id",
    "category",
    "prompt_tokens",
    "prompt_blocks",
    "output_budget",
    "block_size",
    "rounds_per_block",
)


def _opt(values: Any, n: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size != n:
        raise SchedulerError(f"{name} has {a.size} values for {n} requests; give one per request")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchedulerError(
            f"{name}[{i}]={a[i]} must be finite and >= 0 ({int(bad.sum())} bad values); "
            "NaN means the predictor failed for that request: re-run it or drop the request"
        )
    return a


@dataclass(frozen=True)
class Workload:
    """Requests as a structure of arrays. Build with :meth:`from_requests` or the generators."""

    request_ids: np.ndarray
    category: np.ndarray
    prompt_blocks: np.ndarray
    prompt_tokens: np.ndarray
    output_budget: np.ndarray
    block_size: np.ndarray
    output_tokens: np.ndarray
    rounds_flat: np.ndarray
    block_offsets: np.ndarray
    admission: np.ndarray | None = None
    refined: np.ndarray | None = None
    cost: np.ndarray | None = None
    score: np.ndarray | None = None
    #: the output-length baselines' estimates in rounds, by name: ``KIND`` at arrival and
    #: ``KIND:refined`` after the first denoising round (TRAIL), for the policies that need
    #: ``"length"`` (:mod:`.lengths` builds them from a bundle or for the synthetic workload)
    lengths: Mapping[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        n = self.request_ids.size
        if n == 0:
            raise SchedulerError("the workload holds no requests")
        for name in (
            "category",
            "prompt_blocks",
            "prompt_tokens",
            "output_budget",
            "block_size",
            "output_tokens",
        ):
            if getattr(self, name).size != n:
                raise SchedulerError(
                    f"workload field {name} has {getattr(self, name).size} values for {n} requests"
                )
        if (
            self.block_offsets.size != n + 1
            or self.block_offsets[0] != 0
            or self.block_offsets[-1] != self.rounds_flat.size
        ):
            raise SchedulerError("workload block_offsets do not partition rounds_flat")
        if np.any(np.diff(self.block_offsets) < 1):
            i = int(np.flatnonzero(np.diff(self.block_offsets) < 1)[0])
            raise SchedulerError(
                f"request {self.request_ids[i]!r} has no "
                "output blocks; each request denoises >= 1 block"
            )
        for name in ("prompt_blocks", "prompt_tokens", "output_budget", "block_size"):
            a = getattr(self, name)
            lo = 0 if name == "prompt_blocks" else 1  # 0: SGLang's floor(L / block) accounting
            if np.any(a < lo):
                i = int(np.flatnonzero(a < lo)[0])
                raise SchedulerError(
                    f"request {self.request_ids[i]!r}: {name}={a[i]} must be >= {lo}"
                )
        if np.any(self.rounds_flat < 1):
            i = int(
                np.searchsorted(
                    self.block_offsets, np.flatnonzero(self.rounds_flat < 1)[0], side="right"
                )
                - 1
            )
            raise SchedulerError(
                f"request {self.request_ids[i]!r} has a block with "
                "zero or negative rounds; every block takes >= 1 round"
            )
        for name in ("admission", "refined", "cost", "score"):
            object.__setattr__(self, name, _opt(getattr(self, name), n, name))
        if self.lengths is not None:
            checked = {str(k): _opt(v, n, f"lengths[{k!r}]") for k, v in self.lengths.items()}
            object.__setattr__(self, "lengths", checked)
        if len(set(self.request_ids.tolist())) != n:
            raise SchedulerError("workload request ids repeat; give each request a unique id")

    @property
    def n(self) -> int:
        return int(self.request_ids.size)

    @property
    def output_blocks(self) -> np.ndarray:
        return np.diff(self.block_offsets)

    @property
    def total_rounds(self) -> np.ndarray:
        return np.add.reduceat(self.rounds_flat, self.block_offsets[:-1])

    @property
    def work(self) -> np.ndarray:
        """Slots each request occupies in all: prompt blocks + denoising rounds."""
        return self.prompt_blocks + self.total_rounds

    def with_estimates(self, **fields: Any) -> Workload:
        """A copy with ``admission``/``refined``/``cost``/``score``/``lengths`` replaced."""
        return replace(self, **fields)  # type: ignore[arg-type]

    @classmethod
    def from_requests(cls, requests: Sequence[SimRequest]) -> Workload:
        if not requests:
            raise SchedulerError("no requests to simulate")
        rpb = [r.rounds_per_block for r in requests]
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in rpb])

        def opt(name: str) -> np.ndarray | None:
            vals = [getattr(r, name) for r in requests]
            if all(v is None for v in vals):
                return None
            if any(v is None for v in vals):
                missing = next(r.request_id for r in requests if getattr(r, name) is None)
                raise SchedulerError(
                    f"{name} is given for some requests but not "
                    f"for {missing!r}; give it for all or none"
                )
            return np.asarray(vals, dtype=np.float64)

        return cls(
            request_ids=np.asarray([r.request_id for r in requests], dtype=object),
            category=np.asarray([r.category for r in requests], dtype=object),
            prompt_blocks=np.asarray([r.prompt_blocks for r in requests], dtype=np.int64),
            prompt_tokens=np.asarray([r.prompt_tokens for r in requests], dtype=np.int64),
            output_budget=np.asarray([r.output_budget for r in requests], dtype=np.int64),
            block_size=np.asarray([r.block_size for r in requests], dtype=np.int64),
            output_tokens=np.asarray(
                [-1 if r.output_tokens is None else r.output_tokens for r in requests],
                dtype=np.int64,
            ),
            rounds_flat=np.asarray([x for b in rpb for x in b], dtype=np.int64),
            block_offsets=offsets,
            admission=opt("admission_estimate"),
            refined=opt("refined_estimate"),
            cost=opt("cost"),
            score=opt("score"),
        )

    def requests(self) -> list[SimRequest]:
        """The workload as :class:`SimRequest` records."""
        out = []
        for i in range(self.n):
            a, b = self.block_offsets[i], self.block_offsets[i + 1]

            def g(arr: np.ndarray | None, i: int = i) -> float | None:
                return None if arr is None else float(arr[i])

            out.append(
                SimRequest(
                    request_id=str(self.request_ids[i]),
                    prompt_blocks=int(self.prompt_blocks[i]),
                    prompt_tokens=int(self.prompt_tokens[i]),
                    rounds_per_block=tuple(int(x) for x in self.rounds_flat[a:b]),
                    output_budget=int(self.output_budget[i]),
                    block_size=int(self.block_size[i]),
                    category=str(self.category[i]),
                    output_tokens=None if self.output_tokens[i] < 0 else int(self.output_tokens[i]),
                    admission_estimate=g(self.admission),
                    refined_estimate=g(self.refined),
                    cost=g(self.cost),
                    score=g(self.score),
                )
            )
        return out


def as_workload(requests: Workload | Sequence[SimRequest]) -> Workload:
    return requests if isinstance(requests, Workload) else Workload.from_requests(list(requests))


def costs_from_bundle(bundle: Bundle, table: pa.Table) -> np.ndarray:
    """The predicted cost (ms) of every trace row, for a policy that needs ``"cost"``: the
    bundle's DWS surface of the prompt priced by the bundle's cost profile, with the traced
    prompt blocks as ``m``."""
    if bundle.dws is None or bundle.cost_profile is None:
        raise TraceError(
            "pricing requests by cost needs a bundle with a DWS predictor and a cost profile "
            "(`dwise-predict train --cost-profile ...`)"
        )
    for c in ("prompt", "prompt_blocks"):
        if c not in table.column_names:
            raise TraceError(f"traces lack the column {c!r} DWS-SJF needs")
    prompts = table.column("prompt").to_pylist()
    if any(p is None for p in prompts):
        raise TraceError("the traces' prompts are redacted: DWS predicts from the prompt text")
    m = table.column("prompt_blocks").to_numpy().astype(np.float64)
    cost = np.asarray(
        bundle.cost_profile.expected_cost(bundle.predict_surface(prompts), m), dtype=np.float64
    )
    _opt(cost, table.num_rows, "bundle DWS costs")
    return cost


def requests_from_traces(
    table: pa.Table, admission: Any = None, refined: Any = None
) -> list[SimRequest]:
    """Replayable requests from a trace table (see :func:`dwise_predict.traces.read_traces`).

    ``admission`` (estimated total denoising rounds) and ``refined`` (estimated rounds still to
    go after the first denoising round), one per row, come from a bundle
    (:func:`estimates_from_bundle`) or any other predictor.
    """
    missing = [c for c in SIM_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(
            f"traces lack the columns {missing} the simulator "
            "replays; re-trace with `dwise-predict trace`"
        )
    n = table.num_rows
    if n == 0:
        raise TraceError("the trace table holds no requests")
    cols = {c: table.column(c).to_pylist() for c in SIM_COLUMNS}
    out_tok = (
        table.column("output_tokens").to_pylist()
        if "output_tokens" in table.column_names
        else [None] * n
    )
    adm = _opt(admission, n, "admission estimates")
    ref = _opt(refined, n, "refined estimates")
    reqs = []
    for i in range(n):
        for c in SIM_COLUMNS:
            if cols[c][i] is None:
                raise TraceError(
                    f"trace row {i} has no {c}; the trace is incomplete — re-trace that request"
                )
        reqs.append(
            SimRequest(
                request_id=str(cols["request_id"][i]),
                prompt_blocks=int(cols["prompt_blocks"][i]),
                prompt_tokens=int(cols["prompt_tokens"][i]),
                rounds_per_block=tuple(int(x) for x in cols["rounds_per_block"][i]),
                output_budget=int(cols["output_budget"][i]),
                block_size=int(cols["block_size"][i]),
                category=str(cols["category"][i]),
                output_tokens=out_tok[i],
                admission_estimate=None if adm is None else float(adm[i]),
                refined_estimate=None if ref is None else float(ref[i]),
            )
        )
    return reqs


def estimates_from_bundle(
    bundle: Bundle, table: pa.Table, *, admission_source: str = "lightgbm"
) -> tuple[np.ndarray, np.ndarray]:
    """(admission, refined) estimates for every trace row from a loaded predictor bundle.

    Admission reads the prompt counts the tracer recorded (word count, newline count,
    chat-template token count: exactly what the featurizer would compute from the text, so
    redacted traces work with a bundle on the ``counts`` feature set) and, when the bundle's
    features read the prompt's characters, the ``prompt`` column, through
    ``predict_admission_features``; refinement reads ``first_round_hidden`` through
    ``predict_refined(hidden, prompt_tokens, output_budget)``, the estimated rounds still to go
    after the first denoising round. ``admission_source="lightgbm+dws"`` averages the admission
    estimate with the DWS surface's expected rounds, as the SGLang plugin does under that setting
    (it reads the prompts' text).
    """
    from ..features import FEATURE_NAMES, select_features
    from ..predictors import AdmissionModel
    from ..traces import hidden_matrix, lexical_of_table  # the core reader; no heavy import

    for c in (*FEATURE_NAMES, "output_budget", "first_round_hidden"):
        if c not in table.column_names:
            raise TraceError(
                f"traces lack the column {c!r} the bundle "
                "needs; re-trace with `dwise-predict trace`"
            )
    counts = np.column_stack([table.column(c).to_numpy().astype(np.float64) for c in FEATURE_NAMES])
    model = bundle.need(AdmissionModel)
    lexical = lexical_of_table(table) if model.needs_text else None
    try:
        features = select_features(model.feature_names, counts, lexical)
    except PredictorInputError as e:
        raise TraceError(str(e)) from None
    admission = np.asarray(bundle.predict_admission_features(features), dtype=np.float64).ravel()
    bundle.check_admission_source(admission_source)
    prompts: list[Any] = []
    if admission_source == "lightgbm+dws":  # as the plugin ranks under DWISE_SGLANG_ADMISSION
        prompts = table.column("prompt").to_pylist() if "prompt" in table.column_names else []
        if len(prompts) != table.num_rows or any(p is None for p in prompts):
            raise TraceError(
                "admission source 'lightgbm+dws' reads each prompt's text, and some traces "
                "were written with prompts redacted: re-trace without redaction or use "
                "'lightgbm'"
            )
    admission = bundle.admission_from_source(admission, prompts, admission_source)
    hidden = hidden_matrix(table)
    prompt_tokens = table.column("prompt_tokens").to_numpy().astype(np.float64)
    output_budget = table.column("output_budget").to_numpy().astype(np.float64)
    refined = np.asarray(
        bundle.predict_refined(hidden, prompt_tokens, output_budget), dtype=np.float64
    ).ravel()
    n = table.num_rows
    _opt(admission, n, "bundle admission estimates")
    _opt(refined, n, "bundle refined estimates")
    return admission, refined
