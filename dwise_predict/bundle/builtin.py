"""The predictor kinds this library ships: one :func:`register` line per kind, in card order."""

from ..cost import CostProfile
from ..predictors.admission import AdmissionModel
from ..predictors.dws import DWSPredictor
from ..predictors.refinement import RefinementEnsemble
from .modules import register

register(AdmissionModel)
register(RefinementEnsemble)
register(CostProfile)
register(DWSPredictor)
