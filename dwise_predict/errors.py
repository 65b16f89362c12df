"""The library's own exceptions.

Every error a user can cause (bad input, a wrong bundle, a missing package) is raised as a
subclass of :class:`DwisePredictError`, with a message that names the problem *and the fix*.
The CLI prints that message as one line and exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import signal


class DwisePredictError(Exception):
    """Base class of every error raised on purpose by dwise-predict."""

    #: process exit code the CLI uses for this kind of error
    exit_code: int = 1


class ConfigError(DwisePredictError, ValueError):
    """An argument or configuration value is invalid (out of range, wrong type, unknown name)."""


class MissingDependencyError(DwisePredictError, ImportError):
    """An optional package is needed for this feature; the message says what to install."""


class WorkloadError(DwisePredictError):
    """A workload file or prompt source cannot be read or cannot give what was asked."""


class TraceError(DwisePredictError):
    """A trace file is missing, unreadable, or does not follow the trace schema."""


class ModelError(DwisePredictError):
    """A dLLM cannot be found, loaded or run by the tracer."""


class PredictorError(DwisePredictError, ValueError):
    """A predictor's model is malformed or unsupported (LightGBM text, weight shapes, isotonic
    map)."""


class PredictorInputError(DwisePredictError, ValueError):
    """Inputs given to a predictor are malformed (NaN, wrong shape, wrong hidden size...)."""


class TrainingError(DwisePredictError):
    """Training data cannot produce a predictor (too few samples, one category...)."""


class BundleError(DwisePredictError):
    """A predictor bundle cannot be loaded or written."""


class BundleIntegrityError(BundleError):
    """A bundle file is missing, truncated or does not match its recorded sha256."""


class BundleVersionError(BundleError):
    """A bundle needs a newer format reader or another library version."""


class FingerprintMismatchError(BundleError):
    """A bundle was trained for a different dLLM / block size / decoding setting."""


class SchedulerError(DwisePredictError):
    """The scheduler runtime was driven with inconsistent requests or results."""


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by a signal (SIGTERM: Slurm, Kubernetes, systemd).

    A subclass of ``KeyboardInterrupt`` on purpose: every clean-up path written for Ctrl-C
    (flushing finished traces, closing files) runs for a scheduler's stop request too, and
    ``except Exception`` blocks do not swallow it. ``exit_code`` follows the shell convention
    128 + signal number (143 for SIGTERM), so a job scheduler sees why the job ended.
    """

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}")
        self.signum = signum
        self.signal_name = name
        self.exit_code = 128 + signum
