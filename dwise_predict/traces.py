"""The trace schema, and a validating reader.

A trace is one Parquet row per request: what the request was (prompt features), what the
dLLM did with it (rounds per output block, first-round hidden state, round wall times) and
which dLLM did it (the fingerprint). Every predictor trains on traces, the simulator
replays them, and the DWS cost model is fitted from their round times. The *writer*
lives in :mod:`dwise_predict.tracing` (it needs torch); the *reader* lives here so a
scheduler process can load traces with pyarrow alone.

The schema is versioned (``TRACE_SCHEMA_VERSION``): the version is stored both as a column
and in the Parquet key-value metadata, and :func:`read_traces` refuses files it does not
understand. ``docs/traces.md`` documents every column.

Version 2 added ``max_steps_per_block`` (``S``): the most denoising steps the decoder may
spend on one block. It equals ``block_size`` for LowConfidence, but an editing decoder
(JointThreshold) re-writes committed tokens and may spend ``block_size + 17`` steps, so the
bound on rounds per block and the width of the activity matrix come from ``S``, never from
``block_size``. Version-1 files still read: every decoder they could record was bounded by
the block size, so :func:`read_traces` fills ``S = block_size`` (:func:`migrate_table`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import TraceError
from .fingerprint import ABSOLUTE, RESPONSE, ModelFingerprint, check_block_alignment

TRACE_SCHEMA_VERSION = 3

#: Parquet key-value metadata keys.
META_SCHEMA_VERSION = b"dwise.schema_version"
META_FINGERPRINT = b"dwise.fingerprint"

#: columns read besides the requested ones, so repeated requests can always be dropped
_IDENTITY_COLUMNS = ("request_id", "prompt_sha256")

log = logging.getLogger(__name__)

#: The columns of schema version 3, in file order. Nullable columns may hold nulls;
#: ``prompt`` is null when the trace was written with prompts redacted (the hash stays), and
#: the prompt's lexical counts (v3) stay, so redacted traces still train the default features.
TRACE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        # -- what the request was
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("prompt", pa.string()),
        pa.field("prompt_sha256", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("word_count", pa.int32(), nullable=False),
        pa.field("newline_count", pa.int32(), nullable=False),
        pa.field("digit_permille", pa.int32()),
        pa.field("symbol_permille", pa.int32()),
        pa.field("question_marks", pa.int32()),
        pa.field("prompt_blocks", pa.int32(), nullable=False),
        pa.field("output_budget", pa.int32(), nullable=False),
        # -- how it was decoded
        pa.field("block_size", pa.int32(), nullable=False),
        pa.field("decoding", pa.string(), nullable=False),
        pa.field("threshold", pa.float32(), nullable=False),
        pa.field("max_steps_per_block", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        # -- what the dLLM did
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("output_text", pa.string()),
        pa.field("output_blocks", pa.int32(), nullable=False),
        pa.field("rounds_per_block", pa.list_(pa.int32()), nullable=False),
        pa.field("total_rounds", pa.int32(), nullable=False),
        pa.field("finished_eos", pa.bool_(), nullable=False),
        pa.field("hit_budget", pa.bool_(), nullable=False),
        pa.field("first_round_hidden", pa.list_(pa.float32())),
        pa.field("round_wall_ms", pa.list_(pa.float32())),
        # -- which dLLM did it (the full fingerprint is also in the file metadata)
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("model_revision", pa.string()),
        pa.field("model_dtype", pa.string()),
        pa.field("mask_token_id", pa.int64()),
        pa.field("hidden_size", pa.int32()),
    ]
)

REQUIRED_COLUMNS: tuple[str, ...] = tuple(f.name for f in TRACE_SCHEMA if not f.nullable)
#: columns a file of an older schema version may lack; :func:`migrate_table` derives them
_ADDED_IN: dict[str, int] = {
    "max_steps_per_block": 2,
    "digit_permille": 3,
    "symbol_permille": 3,
    "question_marks": 3,
}
#: the column on disk each derived column is computed from
_DERIVED_FROM: dict[str, str] = {
    "max_steps_per_block": "block_size",
    "digit_permille": "prompt",
    "symbol_permille": "prompt",
    "question_marks": "prompt",
}


def activity_matrix(
    rounds_per_block: Sequence[int], max_steps: int, n_blocks: int | None = None
) -> np.ndarray:
    """The activity matrix ``A[b, s] = 1`` iff output block ``b`` needed a step ``s``.

    Derived, never stored: block ``b`` ran ``rounds_per_block[b]`` denoising steps, so
    ``A[b, :r_b] = 1``. ``max_steps`` is ``S``, the decoder's most steps per block (a trace's
    ``max_steps_per_block``; larger than the block size for an editing decoder), and gives
    the matrix its width. ``n_blocks`` pads (with zero rows) or must cover all blocks.
    """
    rounds = np.asarray(rounds_per_block, dtype=np.int64)
    n = len(rounds) if n_blocks is None else n_blocks
    if n < len(rounds):
        raise TraceError(
            f"n_blocks={n} is smaller than the {len(rounds)} blocks traced; "
            f"pass n_blocks >= {len(rounds)}"
        )
    if np.any(rounds < 1) or np.any(rounds > max_steps):
        raise TraceError(
            f"rounds per block must lie in [1, {max_steps}] (the decoder's most "
            f"steps per block), got {rounds.tolist()}"
        )
    steps = np.arange(max_steps)
    out = np.zeros((n, max_steps), dtype=np.uint8)
    out[: len(rounds)] = steps[None, :] < rounds[:, None]
    return out


def shard_files(folder: str | Path) -> list[Path]:
    """The visible ``*.parquet`` files of a trace folder, sorted by name: the shards of every
    writer. Files still being written have hidden names ending in ``.tmp``, so neither this
    reader nor a ``*.parquet`` glob (pandas, polars, duckdb) ever counts them."""
    p = Path(folder)
    if not p.is_dir():
        return []
    return sorted(q for q in p.glob("*.parquet") if not q.name.startswith("."))


def trace_files(path: str | Path) -> list[Path]:
    """The Parquet files a trace path stands for: the file itself, or a directory's shards,
    sorted."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = shard_files(p)
        if not files:
            raise TraceError(
                f"no trace files (*.parquet) in {p}; run `dwise-predict trace --out {p}` first"
            )
        return files
    raise TraceError(
        f"trace path {p} does not exist; pass a trace "
        "file or the folder `dwise-predict trace` wrote"
    )


def check_schema(schema: pa.Schema, where: Path) -> int:
    """Refuse a file this reader cannot understand; return its schema version."""
    meta = schema.metadata or {}
    raw = meta.get(META_SCHEMA_VERSION)
    if raw is None:
        raise TraceError(
            f"{where} is not a dwise-predict trace (no {META_SCHEMA_VERSION.decode()} "
            "metadata); write it with `dwise-predict trace`"
        )
    try:
        version = int(raw)
    except ValueError as e:
        raise TraceError(f"{where} has a malformed schema version {raw!r}") from e
    if version > TRACE_SCHEMA_VERSION:
        raise TraceError(
            f"{where} uses trace schema v{version} but this dwise-predict reads up to "
            f"v{TRACE_SCHEMA_VERSION}; upgrade dwise-predict"
        )
    if version < 1:
        raise TraceError(f"{where} has an invalid trace schema version {version}")
    missing = [
        c for c in REQUIRED_COLUMNS if c not in schema.names and _ADDED_IN.get(c, 0) <= version
    ]
    if missing:
        raise TraceError(
            f"{where} lacks required trace columns {missing}; re-trace with `dwise-predict trace`"
        )
    return version


def migrate_table(table: pa.Table) -> pa.Table:
    """Bring a table of an older schema version up to the current one, in place of columns.

    v1 -> v2: ``max_steps_per_block = block_size``. Every decoder a v1 trace could record
    (LowConfidence, DiffusionGemma with at most ``canvas_length`` steps) was bounded by the
    block size, which is exactly what the v1 reader enforced.

    v2 -> v3: the prompt's lexical counts, counted from ``prompt`` (null where it was redacted).
    """
    from .features import LEXICAL_FEATURES, lexical_features

    names = table.column_names
    if "max_steps_per_block" not in names and "block_size" in names:  # v1 -> v2
        at = names.index("threshold") + 1 if "threshold" in names else len(names)
        table = table.add_column(
            at,
            TRACE_SCHEMA.field("max_steps_per_block"),
            table.column("block_size").cast(pa.int32()),
        )
    names = table.column_names
    if "prompt" in names and not any(c in names for c in LEXICAL_FEATURES):  # v2 -> v3
        counted = [
            None if p is None else lexical_features(p) for p in table.column("prompt").to_pylist()
        ]
        at = names.index("newline_count") + 1 if "newline_count" in names else len(names)
        for j, c in enumerate(LEXICAL_FEATURES):
            values = pa.array([None if v is None else v[j] for v in counted], pa.int32())
            table = table.add_column(at + j, TRACE_SCHEMA.field(c), values)
    if "schema_version" in table.column_names:
        i = table.column_names.index("schema_version")
        version = pa.array(np.full(table.num_rows, TRACE_SCHEMA_VERSION, dtype=np.int16))
        table = table.set_column(i, TRACE_SCHEMA.field("schema_version"), version)
    return table


def lexical_of_table(table: pa.Table) -> np.ndarray | None:
    """``(n, 3)`` lexical features of a trace table's prompts (``LEXICAL_FEATURES`` order):
    the recorded columns (schema v3, kept when the prompt text is redacted), else counted from
    the ``prompt`` column (older traces); None when neither is there for every row."""
    from .features import LEXICAL_FEATURES, lexical_matrix

    names = table.column_names
    if all(c in names and table.column(c).null_count == 0 for c in LEXICAL_FEATURES):
        return np.column_stack(
            [table.column(c).to_numpy().astype(np.float64) for c in LEXICAL_FEATURES]
        )
    if "prompt" in names:
        return lexical_matrix(table.column("prompt").to_pylist())
    return None


def derived_helpers(columns: Sequence[str], on_disk: Sequence[str]) -> list[str]:
    """The columns on disk to read besides ``columns`` so that :func:`migrate_table` can
    derive those of ``columns`` a file of an older schema lacks."""
    wanted = [c for c in columns if c not in on_disk and c in _DERIVED_FROM]
    helpers = dict.fromkeys(_DERIVED_FROM[c] for c in wanted)
    return [h for h in helpers if h in on_disk and h not in columns]


def read_trace_fingerprint(path: str | Path) -> ModelFingerprint:
    """The fingerprint stored in a trace file's metadata (first shard of a folder)."""
    f = trace_files(path)[0]
    schema = pq.read_schema(f)
    check_schema(schema, f)
    raw = (schema.metadata or {}).get(META_FINGERPRINT)
    if raw is None:
        raise TraceError(f"{f} has no model fingerprint metadata")
    return ModelFingerprint.from_dict(json.loads(raw))


def _read_one(f: Path, columns: list[str] | None, schema: pa.Schema) -> pa.Table:
    """One shard, migrated to the current schema; ``columns`` may name derived columns."""
    if columns is None:
        return migrate_table(pq.read_table(f))
    on_disk = [c for c in columns if c in schema.names]
    helpers = derived_helpers(columns, schema.names)
    table = migrate_table(pq.read_table(f, columns=on_disk + helpers))
    return table.select([c for c in columns if c in table.column_names])


def read_traces(
    path: str | Path, columns: Iterable[str] | None = None, *, validate: bool = True
) -> pa.Table:
    """Read a trace file or a folder of shards into one Arrow table, validating the schema.

    Files of an older schema version are migrated on read (:func:`migrate_table`), so the
    table always has the current columns. Raises :class:`TraceError` naming the file and
    the fix when a file is not a trace, was written by a newer schema, lacks required
    columns, or shards disagree on the model fingerprint. A request traced by two writers
    sharing the folder is kept once (its first copy in shard-name order, see
    :func:`first_copies`), with a warning.
    """
    files = trace_files(path)
    cols = list(columns) if columns is not None else None
    read_cols = None if cols is None else list(dict.fromkeys([*cols, *_IDENTITY_COLUMNS]))
    tables = []
    fingerprint: bytes | None = None
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (OSError, pa.ArrowInvalid) as e:
            raise TraceError(
                f"cannot read trace file {f}: {e}; the file is corrupt or not Parquet"
            ) from e
        check_schema(schema, f)
        fp = (schema.metadata or {}).get(META_FINGERPRINT)
        if fingerprint is None:
            fingerprint = fp
        elif fp != fingerprint:
            raise TraceError(
                f"trace shards in {path} come from different models or decoding settings "
                f"({files[0].name} vs {f.name}); keep one model's traces per folder"
            )
        tables.append(_read_one(f, read_cols, schema))
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    table, dropped = first_copies(table, where=str(path))
    if dropped:
        log.warning(
            "%s: %d request(s) were traced by more than one writer; kept the first copy "
            "in shard-name order (`dwise-predict traces compact %s` drops the others)",
            path,
            dropped,
            path,
        )
    if cols is not None:
        table = table.select(cols)
    if validate:
        validate_table(table, str(path))
    meta = dict(table.schema.metadata or {})
    meta[META_SCHEMA_VERSION] = str(TRACE_SCHEMA_VERSION).encode()
    if fingerprint is not None:
        meta[META_FINGERPRINT] = fingerprint
    return table.replace_schema_metadata(meta)


def first_copies(
    table: pa.Table, seen: dict[str, str] | None = None, where: str = "traces"
) -> tuple[pa.Table, int]:
    """Drop repeated requests: keep each request id's first row, in table order.

    Several writers may share a trace folder, and two of them can trace the same request
    concurrently. A request's trace is a function of the model, the settings (both in the
    fingerprint), the prompt and the seed, so the copies agree on everything except the
    measured ``round_wall_ms`` and float noise in ``first_round_hidden``; keeping the first
    loses nothing. Copies whose ``prompt_sha256`` differ are not copies: two workloads reused
    an id for different prompts, which is refused. ``seen`` (request id -> prompt sha256)
    carries the ids of earlier tables, when a folder is read in pieces; it is updated.
    Returns the table and how many rows were dropped.
    """
    if "request_id" not in table.column_names:
        return table, 0
    ids = table.column("request_id")
    if not seen and pc.count_distinct(ids).as_py() == len(ids):
        if seen is not None:
            seen.update(zip(ids.to_pylist(), _prompt_hashes(table)))
        return table, 0
    seen = {} if seen is None else seen
    keep = np.zeros(table.num_rows, dtype=bool)
    for i, (rid, sha) in enumerate(zip(ids.to_pylist(), _prompt_hashes(table))):
        if rid not in seen:
            seen[rid] = sha
            keep[i] = True
        elif sha and seen[rid] and seen[rid] != sha:
            raise TraceError(
                f"{where}: request id {rid!r} was traced for two different prompts; request "
                "ids must be unique across every workload written into one folder. Trace the "
                "other workload into its own --out folder"
            )
    dropped = int(table.num_rows - keep.sum())
    return (table.filter(pa.array(keep)) if dropped else table), dropped


def _prompt_hashes(table: pa.Table) -> list[str]:
    """Each row's prompt sha256 ("" when the column was not read)."""
    if "prompt_sha256" in table.column_names:
        return [h or "" for h in table.column("prompt_sha256").to_pylist()]
    return [""] * table.num_rows


def validate_table(table: pa.Table, where: str = "traces") -> None:
    """Value checks a predictor or the simulator relies on: ids unique, rounds consistent, no NaN.

    Column-wise (numpy over the flattened lists), never a Python loop over rows: a trace set
    of a million requests is normal and validates in about a second (docs/traces.md).
    """
    if table.num_rows == 0:
        raise TraceError(f"{where} holds no requests")
    names = set(table.column_names)
    if "request_id" in names and len(pc.unique(table.column("request_id"))) != table.num_rows:
        raise TraceError(f"{where} repeats request ids; each request must be traced once")
    bound = names & {"max_steps_per_block", "block_size"}
    if {"rounds_per_block", "total_rounds"} <= names and bound:
        _check_rounds(table, where)
    if "first_round_hidden" in names:
        col = table.column("first_round_hidden")
        flat = pc.list_flatten(col) if col.null_count < len(col) else None
        if flat is not None and len(flat):
            arr = flat.to_numpy(zero_copy_only=False)
            if not np.all(np.isfinite(arr)):
                raise TraceError(
                    f"{where} has NaN/inf in first_round_hidden; the model diverged "
                    "— re-trace in float32"
                )


def _check_rounds(table: pa.Table, where: str) -> None:
    """Every request has >= 1 block, each block 1..S rounds, and the rounds sum to the total."""
    rpb = table.column("rounds_per_block")
    lengths = pc.fill_null(pc.list_value_length(rpb), 0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(rpb).to_numpy(zero_copy_only=False).astype(np.int64)
    bound = "max_steps_per_block" if "max_steps_per_block" in table.column_names else "block_size"
    limit = table.column(bound).to_numpy().astype(np.int64)
    total = table.column("total_rounds").to_numpy().astype(np.int64)
    ends = np.cumsum(lengths)
    csum = np.concatenate([[0], np.cumsum(flat)])
    sums = csum[ends] - csum[ends - lengths]
    out_of_range = (flat < 1) | (flat > np.repeat(limit, lengths))
    bad_rows = np.repeat(np.arange(len(lengths)), lengths)[out_of_range]
    bad = (lengths == 0) | (sums != total)
    bad[bad_rows] = True
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(
            f"{where}: request #{i} has inconsistent rounds "
            f"(rounds_per_block={rpb[i].as_py()}, total_rounds={int(total[i])}, "
            f"{bound}={int(limit[i])}); each block takes 1..{bound} rounds and they sum to "
            "total_rounds"
        )


def hidden_matrix(table: pa.Table) -> np.ndarray:
    """The ``first_round_hidden`` column as a dense ``(n, hidden_size)`` float32 array."""
    col = table.column("first_round_hidden")
    if col.null_count:
        raise TraceError(
            "some traces have no first_round_hidden; re-trace with hidden-state capture on"
        )
    lengths = pc.list_value_length(col).to_numpy()
    if len(set(lengths.tolist())) != 1:
        raise TraceError(
            f"first_round_hidden has mixed sizes {sorted(set(lengths.tolist()))}; traces mix models"
        )
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float32)
    return flat.reshape(len(lengths), int(lengths[0]))


@overload
def prompt_blocks(prompt_tokens: int, block_size: int, alignment: str = ...) -> int: ...
@overload
def prompt_blocks(
    prompt_tokens: np.ndarray, block_size: int, alignment: str = ...
) -> np.ndarray: ...
def prompt_blocks(
    prompt_tokens: int | np.ndarray, block_size: int, alignment: str = RESPONSE
) -> int | np.ndarray:
    """Prompt blocks a prompt of ``prompt_tokens`` tokens is prefilled in (prefill rounds when
    run block by block), in a block layout (:data:`~dwise_predict.fingerprint.BLOCK_ALIGNMENTS`).

    ``response`` (the layout of every trace written before ``block_alignment`` was recorded):
    ``max(1, ceil(L / block))``, the prompt's last block may be short. ``absolute`` (SGLang's
    dLLM loop): ``floor(L / block)``, possibly 0; the prompt's tail of ``L mod block`` tokens
    rides in the first output block (:func:`first_block_masks`), so it is no prefill round.
    Works on a scalar or elementwise on an integer array.
    """
    check_block_alignment(alignment)
    if isinstance(prompt_tokens, np.ndarray):
        t = prompt_tokens.astype(np.int64)
        if alignment == ABSOLUTE:
            return t // block_size
        return np.maximum(1, -(-t // block_size))
    if alignment == ABSOLUTE:
        return int(prompt_tokens) // block_size
    return max(1, math.ceil(prompt_tokens / block_size))


def first_block_masks(prompt_tokens: int, block_size: int, alignment: str = RESPONSE) -> int:
    """Masked positions of a request's first output block before the budget cuts it.

    ``response``: a whole block. ``absolute``: ``block - (L mod block)``, the rest of the block
    holds the prompt's tail (a whole block when ``L`` is a multiple of the block size).
    """
    check_block_alignment(alignment)
    if alignment == ABSOLUTE:
        return block_size - int(prompt_tokens) % block_size
    return block_size
