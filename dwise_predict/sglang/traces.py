"""Traces from routine serving: finished requests written in the project's trace schema.

With ``DWISE_SGLANG_TRACE_DIR`` set, every finished request becomes one trace row (the
current schema, the same columns ``dwise-predict trace`` writes): rounds per output block (r,
the trace convention), the first-round hidden state the plugin pooled for refinement, prompt
features, the server's bound S on steps per block, and the server's fingerprint. The prompt
text is stored only with ``DWISE_SGLANG_TRACE_PROMPT_TEXT=1``; by default only its sha256 is
kept.

Shards are written atomically by the project's trace writer. Only TP rank 0 of each replica
writes (every TP rank sees the same requests), into ``TRACE_DIR/dp<rank>/``, so replicas never
share a folder; ``dwise-predict train --traces TRACE_DIR/dp0`` (one folder per replica, or a
folder of their shards merged) reads them like offline traces. Per-round wall times are not
recorded (the scheduler does not time forwards per request); the column is left empty.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ..features import PromptFeaturizer, newline_count, word_count
from ..fingerprint import ModelFingerprint
from ..traces import TRACE_SCHEMA_VERSION
from .prompt import served_prompt


class ServingTraceSink:
    """Turns the plugin's finished-request records into trace rows and writes them."""

    def __init__(
        self,
        out_dir: str | Path,
        fingerprint: ModelFingerprint,
        *,
        dp_rank: int = 0,
        prompt_text: bool = False,
        shard_size: int = 1000,
        tokenizer: Any = None,
        featurizer: PromptFeaturizer | None = None,
    ) -> None:
        from ..tracing.writer import TraceWriter  # pyarrow only; imported when traces are on

        self.folder = Path(out_dir) / f"dp{int(dp_rank)}"
        self.fingerprint = fingerprint
        self.prompt_text = prompt_text
        self.tokenizer = tokenizer
        self.featurizer = featurizer
        self.writer = TraceWriter(self.folder, fingerprint, shard_size=shard_size, resume=True)

    def row(self, rid: Any, req: Any, track: Any) -> dict[str, Any]:
        """One trace row (the current schema) for a finished request."""
        fp = self.fingerprint
        text = served_prompt(req, self.tokenizer, self.featurizer)
        out_ids = list(req.output_ids)
        rounds = [int(r) for r in track.rounds_per_block]
        hidden = None if track.hidden is None else np.asarray(track.hidden, np.float32).tolist()
        finished_reason = type(getattr(req, "finished_reason", None)).__name__
        return {
            "schema_version": TRACE_SCHEMA_VERSION,
            "request_id": str(rid),
            "category": "serving",
            "source": "sglang",
            "prompt": text if self.prompt_text else None,
            "prompt_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "prompt_tokens": int(track.prompt_tokens),
            "word_count": word_count(text),
            "newline_count": newline_count(text),
            "prompt_blocks": int(track.prompt_tokens) // fp.block_size,
            "output_budget": int(track.output_budget),
            "block_size": fp.block_size,
            # S (schema v2): the server's bound on steps per block; for an algorithm the plugin
            # knows no bound for, the block size or the most this request took, if more
            "max_steps_per_block": int(fp.max_steps_per_block or max([fp.block_size, *rounds])),
            "decoding": fp.decoding,
            "threshold": fp.threshold,
            "seed": 0,
            "output_tokens": len(out_ids),
            "output_text": None,
            "output_blocks": len(rounds),
            "rounds_per_block": rounds,
            "total_rounds": int(sum(rounds)),
            "finished_eos": finished_reason == "FINISH_MATCHED_TOKEN",
            "hit_budget": finished_reason == "FINISH_LENGTH",
            "first_round_hidden": hidden,
            "round_wall_ms": None,
            "model_id": fp.model_id,
            "model_revision": fp.revision,
            "model_dtype": fp.dtype,
            "mask_token_id": fp.mask_token_id,
            "hidden_size": fp.hidden_size,
        }

    def add(self, rid: Any, req: Any, track: Any) -> None:
        self.writer.add(self.row(rid, req, track))

    def flush(self) -> Path | None:
        return self.writer.flush()
