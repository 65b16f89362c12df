"""tiny-bd's training recipe: data, training stages, the report, the probe and the rebuild.

It lives in the repository and in no wheel: the ``dwise-predict-zoo`` distribution ships the
model's runtime (config, model, tokenizer, loading, generation) and its weights, and the
reference model is rebuilt from a checkout (``make install`` installs the zoo editable, so
``python -m dwise_predict.zoo.tiny_bd.recipe.rebuild`` works there). See
docs/reference-model.md.
"""
