"""Inference for the remaining-work predictors (numpy + compiled LightGBM trees; no torch).

* :class:`AdmissionModel`: prompt features -> estimated TOTAL denoising rounds.
* :class:`RefinementEnsemble`: first-round hidden state -> denoising rounds STILL TO GO after
  the first denoising round (raw restricted mean, or isotonic-calibrated).

Training is in :mod:`dwise_predict.trainers`; both models save to plain files (LightGBM text,
safetensors, JSON) and load without pickle.
"""

from .admission import AdmissionModel
from .calibration import IsotonicMap
from .refinement import MLPWeights, RefinementEnsemble
from .trees import CompiledForest

__all__ = ["AdmissionModel", "CompiledForest", "IsotonicMap", "MLPWeights", "RefinementEnsemble"]
