"""Traces from routine serving: finished requests written in the project's trace schema.

With ``DWISE_SGLANG_TRACE_DIR`` set, every finished request becomes one trace row (the
current schema, the same columns ``dwise-predict trace`` writes): rounds per output block (r,
the trace convention), the first-round hidden state the plugin pooled for refinement, prompt
features, the server's bound S on steps per block, and the server's fingerprint. The prompt
text is stored only with ``DWISE_SGLANG_TRACE_PROMPT_TEXT=1``; by default only its sha256 is
kept.

The scheduler thread only copies what a row needs out of the finished request (its ids and
its track: a few list copies) and appends it under a lock; a writer thread swaps that list
out under the lock, then decodes, builds the rows and writes shards outside it. Shards are
written atomically by the project's trace writer. Only TP rank 0 of each replica writes
(every TP rank sees the same requests), into ``TRACE_DIR/dp<rank>/``, so replicas never share
a folder; ``dwise-predict train --traces TRACE_DIR/dp0`` reads them like offline traces.
Per-round wall times are not recorded (the scheduler does not time forwards per request);
the column is left empty.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..features import PromptFeaturizer, prompt_counts
from ..fingerprint import ModelFingerprint
from ..traces import TRACE_SCHEMA_VERSION
from . import seam
from .prompt import PromptDecoder, user_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Finished:
    """What one trace row needs, copied out of SGLang's request on the scheduler thread."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    end: str
    track: Any


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
        self.folder = Path(out_dir) / f"dp{int(dp_rank)}"
        self.fingerprint = fingerprint
        self.prompt_text = prompt_text
        self.decoder = None if tokenizer is None else PromptDecoder(tokenizer)
        self.featurizer = featurizer
        from ..trace_writer import TraceWriter  # pyarrow only; imported when traces are on

        self.writer = TraceWriter(self.folder, fingerprint, shard_size=shard_size, resume=True)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[_Finished] = []
        self._flush = False
        self._busy = False
        self._closed = False
        self.errors = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="dwise-traces")
        self._thread.start()

    # -- the scheduler thread ---------------------------------------------------------------------
    def add(self, rid: Any, req: Any, track: Any) -> None:
        """Queue a finished request (a few list copies; no decoding, no I/O here)."""
        item = _Finished(
            str(rid),
            list(seam.prompt_ids(req)),
            seam.output_ids(req),
            seam.end_kind(req),
            track,
        )
        with self._lock:
            self._queue.append(item)
            self._wake.notify()

    def flush_now(self) -> None:
        """Ask the writer thread to cut a shard of everything queued so far."""
        with self._lock:
            self._flush = True
            self._wake.notify()

    # -- the writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._flush and not self._closed:
                    self._wake.wait()
                items, self._queue = self._queue, []
                flush, self._flush = self._flush, False
                closed = self._closed
                self._busy = True
            try:
                for item in items:
                    self.writer.add(self.row(item))
                if flush or closed:
                    self.writer.flush()
            except Exception as e:  # logged: a failed write must not stop serving
                self.errors += 1
                log.error(
                    "dwise plugin: writing serving traces to %s failed: %s (serving goes on; "
                    "check the folder's space and permissions)",
                    self.folder,
                    e,
                )
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()
            if closed:
                return

    def drain(self) -> None:
        """Block until every queued request is written (a shard is cut)."""
        self.flush_now()
        with self._lock:
            while (self._queue or self._flush or self._busy) and self._thread.is_alive():
                self._wake.wait(0.05)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        self._thread.join()
        self.writer.close()

    def row(self, item: _Finished) -> dict[str, Any]:
        """One trace row (the current schema) for a finished request."""
        fp = self.fingerprint
        track = item.track
        text = user_prompt(item.prompt_ids, self.decoder, self.featurizer)
        rounds = [int(r) for r in track.rounds_per_block]
        hidden = None if track.hidden is None else np.asarray(track.hidden, np.float32).tolist()
        return {
            "schema_version": TRACE_SCHEMA_VERSION,
            "request_id": item.rid,
            "category": track.category,
            "source": "sglang",
            "prompt": text if self.prompt_text else None,
            "prompt_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "prompt_tokens": int(track.prompt_tokens),
            # counted even when the text is not kept, so these traces train the default features
            **prompt_counts(text),
            "prompt_blocks": int(track.prompt_tokens) // fp.block_size,
            "output_budget": int(track.output_budget),
            "block_size": fp.block_size,
            # S (schema v2): the server's bound on steps per block; for an algorithm the plugin
            # knows no bound for, the block size or the most this request took, if more
            "max_steps_per_block": int(fp.max_steps_per_block or max([fp.block_size, *rounds])),
            "decoding": fp.decoding,
            "threshold": fp.threshold,
            "seed": 0,
            "output_tokens": len(item.output_ids),
            "output_text": None,
            "output_blocks": len(rounds),
            "rounds_per_block": rounds,
            "total_rounds": int(sum(rounds)),
            "finished_eos": item.end == "eos",
            "hit_budget": item.end == "length",
            "first_round_hidden": hidden,
            "round_wall_ms": None,
            "model_id": fp.model_id,
            "model_revision": fp.revision,
            "model_dtype": fp.dtype,
            "mask_token_id": fp.mask_token_id,
            "hidden_size": fp.hidden_size,
        }
