"""The bundle's model card: ``README.md`` with Hugging Face Hub metadata, rendered from the
manifest.

Why render it from the manifest (never edit it by hand): the card is what a person reads on the
Hub before trusting a bundle with their scheduler, so it must say exactly what the manifest
enforces: which dLLM and decoding setting the predictors belong to, what each estimate means,
what they were trained on and how well they ranked requests on held-out traces. Re-rendering on
every update (train, export, recorded evaluation) keeps the two from drifting apart.

The YAML front matter is written here without a YAML library (every string is JSON-quoted, which
is valid YAML): ``library_name``, ``license``, ``tags`` and, once an evaluation is recorded, a
``model-index`` in the Hub's format (task -> dataset -> metrics) so the Hub shows the metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from .format import migrate
from .modules import all_estimates, declared, registered

CARD_FILE = "README.md"
LIBRARY_NAME = "dwise-predict"
LICENSE = "apache-2.0"
BASE_TAGS = ("dllm", "diffusion-llm", "scheduling", "dwise-predict")
TASK_TYPE = "other"
TASK_NAME = "remaining-work prediction"
NOT_EVALUATED = "Not evaluated yet."


def render_card(manifest: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    """The model card for a bundle ``manifest``; ``plots`` are bundle-relative image paths
    (``plots/x.png``)."""
    manifest = migrate(dict(manifest))
    name = str(manifest.get("name") or "bundle")
    fp = dict(manifest.get("fingerprint") or {})
    metrics = dict(manifest.get("metrics") or {})
    parts = [
        _front_matter(name, fp, metrics),
        _intro(name, fp, manifest),
        _fingerprint_section(fp),
        _predictors_section(manifest),
        _training_section(dict(manifest.get("training") or {})),
        _evaluation_section(metrics, plots),
        _exports_section(dict(manifest.get("exports") or {})),
        _usage_section(fp),
    ]
    return "\n".join(p for p in parts if p).rstrip("\n") + "\n"


def evaluated_estimates(metrics: Mapping[str, Any]) -> list[str]:
    """The estimates an evaluation recorded, in the registered kinds' order."""
    return [n for n in all_estimates() if isinstance(metrics.get(n), Mapping)]


# -- front matter ---------------------------------------------------------------------------
def _yaml(value: Any) -> str:
    """One YAML scalar: JSON quoting for strings (valid YAML), plain numbers, null for
    non-finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _front_matter(name: str, fp: Mapping[str, Any], metrics: Mapping[str, Any]) -> str:
    tags = list(BASE_TAGS)
    if fp.get("model_id") and str(fp["model_id"]) not in tags:
        tags.append(str(fp["model_id"]))
    lines = ["---", f"library_name: {LIBRARY_NAME}", f"license: {LICENSE}", "tags:"]
    lines += [f"- {_yaml(t)}" for t in tags]
    results = _model_index_metrics(metrics)
    if results:
        traces = str(metrics.get("traces") or "evaluation traces")
        dataset_name = f"{fp.get('model_id', 'dLLM')} traces: {traces}"
        lines += [
            "model-index:",
            f"- name: {_yaml(name)}",
            "  results:",
            "  - task:",
            f"      type: {_yaml(TASK_TYPE)}",
            f"      name: {_yaml(TASK_NAME)}",
            "    dataset:",
            f"      type: {_yaml(traces)}",
            f"      name: {_yaml(dataset_name)}",
            "    metrics:",
        ]
        for mtype, value, label in results:
            lines += [
                f"    - type: {_yaml(mtype)}",
                f"      value: {_yaml(value)}",
                f"      name: {_yaml(label)}",
            ]
    lines.append("---")
    return "\n".join(lines) + "\n"


def _model_index_metrics(metrics: Mapping[str, Any]) -> list[tuple[str, float, str]]:
    """(type, value, display name) for every finite overall metric of every estimate."""
    out = []
    for est in evaluated_estimates(metrics):
        m = metrics[est]
        for key, label in (("spearman", "Spearman ρ"), ("median_ratio", "median predicted/actual")):
            v = _finite(m.get(key))
            if v is not None:
                out.append((key, round(v, 6), f"{label} ({est})"))
    return out


# -- sections -------------------------------------------------------------------------------
def _intro(name: str, fp: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
    lib = manifest.get("library") or {}
    model = fp.get("model_id", "an unknown dLLM")
    return (
        f"# {_md(name)}: remaining-work predictors for `{_md(model)}`\n\n"
        f"A dwise-predict bundle (format "
        f"v{manifest.get('format_version', '?')}, written by dwise-predict "
        f"{lib.get('version', '?')}, readable by dwise-predict{lib.get('requires', '')}). It "
        "estimates how much work each request to a block-diffusion LLM still has, so a scheduler "
        "can run shortest-remaining-work-first (DWISE): remaining work R = prompt blocks P + "
        "estimated denoising rounds r̂.\n\n"
        + "".join(
            f"- **{_md(kind)}** estimate: {_md(entry.get('estimate', '?'))};\n"
            for kind, entry in declared(manifest)
        )
        + "\nThe predictors are valid only for the dLLM and decoding setting below: "
        "another model, block size "
        "or confidence threshold denoises differently, and a bundle loaded into the wrong server "
        "would silently mis-rank every request. Loading checks this (see *Refusal* below).\n"
    )


def _fingerprint_section(fp: Mapping[str, Any]) -> str:
    rows = [
        [f"`{k}`", _md(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)]
        for k, v in fp.items()
        if v not in (None, {}, [])
    ]
    return "## The dLLM it belongs to\n\n" + _table(["field", "value"], rows)


def _predictors_section(manifest: Mapping[str, Any]) -> str:
    rows = []
    for kind, entry in declared(manifest):
        known = registered().get(kind)
        summary = (
            known.card_summary(entry, manifest)
            if known is not None
            else "a kind this dwise-predict does not know (written by a newer version)"
        )
        rows.append(
            [_md(kind), summary, _md(entry.get("estimate", "")), ", ".join(entry.get("files", []))]
        )
    if not rows:
        return ""
    return "## Predictors\n\n" + _table(["predictor", "model", "estimate", "files"], rows)


def _training_section(training: Mapping[str, Any]) -> str:
    if not training:
        return "## Training data\n\nNo training summary recorded.\n"
    facts = []
    if "n_requests" in training:
        facts.append(f"{training['n_requests']} traced requests")
    if "trace_schema_version" in training:
        facts.append(f"trace schema v{training['trace_schema_version']}")
    if "seed" in training:
        facts.append(f"seed {training['seed']}")
    rounds = training.get("total_rounds") or {}
    if rounds:
        facts.append(
            f"total rounds min {rounds.get('min')} / median "
            f"{rounds.get('median')} / max {rounds.get('max')}"
        )
    if training.get("hit_budget_fraction") is not None:
        facts.append(
            f"{100 * float(training['hit_budget_fraction']):.1f}% "
            "cut by the output budget (censored)"
        )
    out = "## Training data\n\n" + ("; ".join(facts) + ".\n" if facts else "")
    cats = training.get("categories") or {}
    if cats:
        out += "\n" + _table(["category", "traces"], [[_md(c), n] for c, n in sorted(cats.items())])
    return out


def _evaluation_section(metrics: Mapping[str, Any], plots: Sequence[str]) -> str:
    names = evaluated_estimates(metrics)
    if not names:
        return (
            "## Evaluation\n\n"
            + NOT_EVALUATED
            + " Record one on traces disjoint from the training traces "
            "with `dwise-predict eval --bundle THIS_FOLDER --traces EVAL_TRACES "
            "--out metrics.json --record`.\n"
        )
    where = f" on `{_md(metrics['traces'])}`" if metrics.get("traces") else ""
    out = (
        "## Evaluation\n\n"
        f"{metrics.get('n_requests', '?')} requests{where}. Spearman ρ ranks predicted against "
        "actual work (overall and within each category); the median ratio is the median of "
        "predicted / actual (1.0 = on scale).\n\n"
    )
    out += _table(
        ["estimate", "compared with", "ρ overall", "ρ within category (mean)", "median ratio", "n"],
        [
            [
                n,
                all_estimates()[n],
                _num(metrics[n].get("spearman")),
                _num(metrics[n].get("within_category_mean_spearman")),
                _num(metrics[n].get("median_ratio")),
                metrics[n].get("n", ""),
            ]
            for n in names
        ],
    )
    cats = sorted({c for n in names for c in (metrics[n].get("per_category") or {})})
    if cats:
        counts = metrics.get("categories") or {}
        rows = []
        for c in cats:
            per = [(metrics[n].get("per_category") or {}).get(c) or {} for n in names]
            rows.append(
                [
                    _md(c),
                    counts.get(c, next((p.get("n") for p in per if p.get("n") is not None), "")),
                    *(_num(p.get("spearman")) for p in per),
                    *(_num(p.get("median_ratio")) for p in per),
                ]
            )
        out += "\n### Per category\n\n" + _table(
            ["category", "n", *(f"ρ {n}" for n in names), *(f"median ratio {n}" for n in names)],
            rows,
        )
    held = metrics.get("holdout")
    if isinstance(held, Mapping) and held.get("category") is not None:
        hn = [n for n in names if isinstance(held.get(n), Mapping)]
        out += (
            f"\n### Held-out category `{_md(held['category'])}`\n\nRetrained without it "
            f"({held.get('n_train_without', '?')} training requests), evaluated on its "
            f"{held.get('n_eval', '?')} requests (DWISE Table 7).\n\n"
        )
        out += _table(
            [
                "estimate",
                "ρ in training",
                "ρ held out",
                "ρ overall (held out)",
                "median ratio held out",
            ],
            [
                [
                    n,
                    _num(held[n].get("in_training")),
                    _num(held[n].get("held_out")),
                    _num(held[n].get("overall_held_out")),
                    _num(held[n].get("median_ratio_held_out")),
                ]
                for n in hn
            ],
        )
    if plots:
        out += (
            "\n### Plots\n\n" + "\n\n".join(f"![{_md(_plot_title(p))}]({p})" for p in plots) + "\n"
        )
    return out


def _exports_section(exports: Mapping[str, Any]) -> str:
    if not exports:
        return ""
    rows = []
    for name, rec in sorted(exports.items()):
        parity = rec.get("parity") or {}
        rows.append(
            [
                f"`{_md(name)}`",
                rec.get("predictor", ""),
                rec.get("precision", ""),
                "yes" if rec.get("kept") else "no",
                _num(parity.get("max_abs_error"), ".2e"),
                _md(rec.get("reason", "")),
            ]
        )
    return (
        "## Exported files\n\n"
        "Each exported file is gated on parity with the native predictor; refused files are "
        "recorded with the reason.\n\n"
        + _table(["file", "predictor", "precision", "kept", "max abs error", "reason"], rows)
    )


def _usage_section(fp: Mapping[str, Any]) -> str:
    block = fp.get("block_size", "?")
    thr = fp.get("threshold", "?")
    model = fp.get("model_id", "MODEL")
    return f"""## Usage

```python
import dwise_predict

bundle = dwise_predict.load_bundle("hf://ORG/NAME@REV")  # this repository; REV = a tag or commit
bundle.check(server_fingerprint)              # refuses a server running another dLLM / setting
total = bundle.predict_admission(["Write a haiku about queues."])       # total denoising rounds
left = bundle.predict_refined(hidden, prompt_tokens, output_budget)    # rounds still to go
```

## Refusal

- `load_bundle` reads `manifest.json` first and refuses a newer bundle format or a \
dwise-predict version
  outside `library.requires` before opening anything else; then it checks the size and \
sha256 of every
  file listed in the manifest (this card and the plots included) and names the file that is missing,
  truncated or modified. Nothing in a bundle is ever unpickled.
- `bundle.check(fingerprint)` raises `FingerprintMismatchError` naming both sides when the server's
  model id, block size, decoding algorithm, threshold, mask id or hidden size differ from this
  bundle's (`{_md(model)}`, block {block}, threshold {thr}); `allow_mismatch=True` turns the \
refusal into a
  warning, for experts who know the difference is harmless.
"""


# -- formatting -----------------------------------------------------------------------------
def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _num(v: Any, fmt: str = ".3f") -> str:
    f = _finite(v)
    return "n/a" if f is None else format(f, fmt)


def _md(v: Any) -> str:
    """Text safe inside a Markdown table cell or heading."""
    return str(v).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _plot_title(path: str) -> str:
    return PurePosixPath(path).stem.replace("_", " ")
