"""DWISE scheduling inside SGLang's dLLM server, as an SGLang plugin.

SGLang loads :func:`dwise_predict.sglang.plugin.register` through the entry point
``sglang.srt.plugins = dwise`` in every process it spawns. Nothing here imports SGLang, torch
or the bundle until a scheduler process actually starts with ``DWISE_SGLANG_BUNDLE`` set, so
``import dwise_predict`` stays light and an unconfigured server runs exactly as stock.

* :mod:`.config`: the plugin's settings, read from environment variables and/or a JSON file;
* :mod:`.server`: what the plugin reads from SGLang (fingerprint, hook targets, pool sizes);
* :mod:`.serving`: the per-scheduler state that turns SGLang's queues into the core
  :class:`~dwise_predict.runtime.Scheduler`'s plan and folds the results back;
* :mod:`.monitor`: the online quality monitor (predicted vs actual rounds);
* :mod:`.watcher` and :mod:`.lifecycle`: hot swap of a new bundle revision (shadow, promote,
  roll back; docs/refresh.md);
* :mod:`.plugin`: the hooks themselves.

See docs/sglang.md.
"""
