"""dwise-predict: predict how much work a diffusion-LLM request still has, and schedule by it.

The core package is light on purpose: a scheduler process imports it to load a bundle, run
the predictors and drive the scheduler runtime with numpy, lightgbm and onnxruntime only.
Tracing, training and export (which need torch) live in the feature packages
``dwise_predict.tracing``, ``dwise_predict.trainers``, ``dwise_predict.export`` and
``dwise_predict.zoo``, which depend on this core and never the reverse.
"""

from ._version import __version__
from .bundle import Bundle, load_bundle, save_bundle
from .errors import (
    BundleError,
    BundleIntegrityError,
    BundleVersionError,
    ConfigError,
    DwisePredictError,
    FingerprintMismatchError,
    MissingDependencyError,
    ModelError,
    PredictorInputError,
    SchedulerError,
    TraceError,
    TrainingError,
    WorkloadError,
)
from .features import PromptFeaturizer
from .fingerprint import ModelFingerprint
from .hub import pull_bundle
from .runtime import Scheduler, compare_policies, synthetic_workload
from .traces import TRACE_SCHEMA_VERSION, activity_matrix, read_traces

__all__ = [
    "__version__",
    "Bundle",
    "PromptFeaturizer",
    "Scheduler",
    "compare_policies",
    "load_bundle",
    "pull_bundle",
    "save_bundle",
    "synthetic_workload",
    "TRACE_SCHEMA_VERSION",
    "BundleError",
    "BundleIntegrityError",
    "BundleVersionError",
    "ConfigError",
    "DwisePredictError",
    "FingerprintMismatchError",
    "MissingDependencyError",
    "ModelError",
    "ModelFingerprint",
    "PredictorInputError",
    "SchedulerError",
    "TraceError",
    "TrainingError",
    "WorkloadError",
    "activity_matrix",
    "read_traces",
]
