"""Start-up: vLLM's names, the loader, the settings and the bundle check, against vLLM 0.33.0."""

from __future__ import annotations

import subprocess
import sys

import pytest
from vllm_harness import DWISE_CLS, dwise_env, make_scheduler

from dwise_predict.errors import ConfigError, FingerprintMismatchError
from dwise_predict.vllm import seam


def test_every_name_of_the_seam_resolves_in_the_installed_vllm():
    assert seam.vllm_version() == seam.SUPPORTED_VLLM
    assert seam.missing_names() == []


def test_a_missing_name_refuses_to_start_and_names_the_dotted_path(monkeypatch):
    gone = seam.Name(f"{seam.SCHEDULER}.schedule_by_remaining_work", "call")
    assert seam.missing_names((gone,)) == [gone.path]
    monkeypatch.setattr(seam, "SURFACE", (*seam.SURFACE, gone))
    with pytest.raises(seam.VLLMIncompatibleError, match=r"Scheduler\.schedule_by_remaining"):
        seam.require(seam.SURFACE)
    with pytest.raises(seam.VLLMIncompatibleError, match=r"vllm\.v1\.nowhere\.Scheduler"):
        seam.resolve("vllm.v1.nowhere.Scheduler")
    # the live check: an attribute the scheduler object lacks
    with pytest.raises(seam.VLLMIncompatibleError, match=r"Scheduler\.waiting"):
        seam.check_scheduler(object())


def test_vllm_loads_the_class_by_qualified_name_and_it_extends_the_diffusion_scheduler(
    model_dir,
):
    from vllm.v1.core.sched.diffusion_scheduler import DiffusionScheduler

    sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env())
    assert isinstance(sched, DiffusionScheduler)
    assert type(sched).__name__ == "DWISEDiffusionScheduler"
    assert sched.dwise.policy.name == "dwise"
    fp = seam.server_fingerprint(sched)
    assert (fp.model_id, fp.block_size, fp.threshold, fp.max_steps_per_block) == (
        "tiny-bd",
        32,
        0.95,
        32,
    )
    assert (fp.hidden_size, fp.mask_token_id, fp.block_alignment) == (128, 1, "response")


def test_the_async_variant_extends_vllms_async_diffusion_scheduler():
    from vllm.v1.core.sched.diffusion_scheduler import DiffusionAsyncScheduler

    from dwise_predict.vllm import DWISEDiffusionAsyncScheduler

    assert issubclass(DWISEDiffusionAsyncScheduler, DiffusionAsyncScheduler)


def test_the_bundle_is_checked_against_the_served_fingerprint(model_dir):
    # tiny-bd's bundle was traced with absolute-position blocks; vLLM's canvas starts at the
    # prompt's end: refused, both layouts named, unless the operator allows the mismatch
    env = dwise_env()
    env["DWISE_VLLM_ALLOW_MISMATCH"] = None
    with pytest.raises(FingerprintMismatchError, match="block_alignment: 'absolute' vs 'response'"):
        make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=env)


def test_settings_that_cannot_serve_refuse_to_start(model_dir):
    with pytest.raises(ConfigError, match="DWISE_VLLM_BUNDLE"):
        make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(bundle=None))
    with pytest.raises(ConfigError, match="DWISE_VLLM_POLICY=sjf"):
        make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(policy="sjf"))
    with pytest.raises(ConfigError, match="--scheduling-policy priority"):
        make_scheduler(model_dir, scheduler_cls=DWISE_CLS, policy="priority", env=dwise_env())
    with pytest.raises(ConfigError, match="DWISE_VLLM_STARVATION_CAP"):
        make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(starvation_cap="x"))


def test_importing_the_package_pulls_in_neither_vllm_nor_torch():
    code = (
        "import sys, dwise_predict, dwise_predict.vllm, dwise_predict.vllm.config, "
        "dwise_predict.vllm.seam, dwise_predict.vllm.state; "
        "print(','.join(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_seam_lists_every_method_the_classes_override():
    from dwise_predict.vllm import scheduler as mod

    overridden = {n.path.rsplit(".", 1)[1] for n in seam.SURFACE if n.use == "override"}
    own = {k for k in vars(mod._DWISEOrder) if not k.startswith("__") or k == "__init__"}
    own -= {"dwise"}
    assert own == overridden
    bases = {n.path for n in seam.SURFACE if n.use == "subclass"}
    assert {f"{c.__module__}.{c.__qualname__}" for c in (mod._Sync, mod._Async)} == bases
