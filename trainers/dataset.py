"""Arrays the trainers and the evaluator take from a trace table (one place that reads columns)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dwise_predict.errors import TraceError, TrainingError
from dwise_predict.features import FEATURE_NAMES, select_features
from dwise_predict.traces import hidden_matrix, lexical_of_table, read_traces


def as_table(traces: str | Path | pa.Table) -> pa.Table:
    return traces if isinstance(traces, pa.Table) else read_traces(traces)


@dataclass(frozen=True)
class TraceArrays:
    """Per-request arrays. ``remaining`` = total_rounds - 1: what the refined estimate targets."""

    request_id: np.ndarray
    category: np.ndarray  # str
    features: np.ndarray  # (n, 3) in FEATURE_NAMES order
    total_rounds: np.ndarray  # (n,) int
    prompt_tokens: np.ndarray  # (n,) float
    output_budget: np.ndarray  # (n,) float
    hit_budget: np.ndarray  # (n,) bool: cut by the output budget (censored for the survival loss)
    hidden: np.ndarray | None  # (n, H) float32, None when the traces lack hidden states
    #: (n,) int: output tokens written (the output-length baselines' target); None when not read
    output_tokens: np.ndarray | None = None
    #: (n, 3) the prompts' lexical features (LEXICAL_FEATURES); None when the prompts were
    #: redacted or not read
    lexical: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.total_rounds)

    @property
    def remaining(self) -> np.ndarray:
        return self.total_rounds - 1

    def admission_features(self, names: tuple[str, ...]) -> np.ndarray:
        """The admission features ``names`` of every row (an error naming the fix when they
        read prompts the traces redacted)."""
        return select_features(names, self.features, self.lexical)

    def subset(self, mask: np.ndarray) -> TraceArrays:
        return TraceArrays(
            self.request_id[mask],
            self.category[mask],
            self.features[mask],
            self.total_rounds[mask],
            self.prompt_tokens[mask],
            self.output_budget[mask],
            self.hit_budget[mask],
            None if self.hidden is None else self.hidden[mask],
            None if self.output_tokens is None else self.output_tokens[mask],
            None if self.lexical is None else self.lexical[mask],
        )


def trace_arrays(traces: str | Path | pa.Table, *, need_hidden: bool = False) -> TraceArrays:
    table = as_table(traces)
    if table.num_rows == 0:
        raise TrainingError("the traces hold no requests; trace some with `dwise-predict trace`")
    hidden = None
    col = table.column("first_round_hidden") if "first_round_hidden" in table.column_names else None
    if col is not None and col.null_count == 0:
        hidden = hidden_matrix(table)
    elif need_hidden:
        raise TraceError(
            "the traces have no first_round_hidden; re-trace with hidden-state capture on to train "
            "or evaluate the refinement predictor (or use --only admission)"
        )
    features = np.column_stack(
        [table.column(c).to_numpy().astype(np.float64) for c in FEATURE_NAMES]
    )
    return TraceArrays(
        request_id=np.asarray(table.column("request_id").to_pylist(), dtype=object),
        category=np.asarray(table.column("category").to_pylist(), dtype=object),
        features=features,
        total_rounds=table.column("total_rounds").to_numpy().astype(np.int64),
        prompt_tokens=table.column("prompt_tokens").to_numpy().astype(np.float64),
        output_budget=table.column("output_budget").to_numpy().astype(np.float64),
        hit_budget=np.asarray(
            pc.fill_null(table.column("hit_budget"), False).to_pylist(), dtype=bool
        ),
        hidden=hidden,
        output_tokens=table.column("output_tokens").to_numpy().astype(np.int64)
        if "output_tokens" in table.column_names
        else None,
        lexical=lexical_of_table(table),
    )


def category_counts(categories: np.ndarray) -> dict[str, int]:
    names, counts = np.unique(categories.astype(str), return_counts=True)
    return {str(k): int(v) for k, v in zip(names, counts)}
