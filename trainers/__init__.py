"""dwise_predict.trainers: train the admission and refinement predictors (torch, Lightning,
sklearn).

* :func:`~dwise_predict.trainers.admission.train_admission` ->
  :class:`~dwise_predict.predictors.AdmissionModel`
* :func:`~dwise_predict.trainers.refinement.train_refinement` ->
  :class:`~dwise_predict.predictors.RefinementEnsemble`
* :func:`~dwise_predict.trainers.pipeline.train_bundle`: traces -> bundle folder
* :mod:`dwise_predict.trainers.evaluate`: metrics, held-out categories, plots

Import the submodules directly; this package imports nothing heavy on its own.
"""
