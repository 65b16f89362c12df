"""The plugin's one seam to SGLang: every SGLang name it touches is on the verified list.

Runs without SGLang: it reads the plugin's source. Outside :mod:`dwise_predict.sglang.seam`,
no plugin module imports SGLang, names an SGLang dotted path, or looks inside an SGLang object
(the variables that hold one have fixed names). Inside the seam, every attribute read off an
SGLang object and every SGLang import is an entry of ``seam.SURFACE``, which the plugin
resolves at start-up (``tests/sglang_plugin`` checks that against the installed SGLang). So a
new SGLang release is one file to re-check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dwise_predict.sglang import seam

PLUGIN = Path(seam.__file__).parent
SURFACE = {n.path for n in seam.SURFACE}

#: the names the plugin gives variables holding SGLang objects, and their classes
VAR_TYPES = {
    "sched": seam.SCHEDULER,
    "scheduler": seam.SCHEDULER,
    "req": seam.REQ,
    "adder": seam.ADDER,
    "batch": seam.BATCH,
    "result": seam.RESULT,
    "recv_req": seam.ABORT,
    "logits_output": seam.LOGITS_OUT,
    "out": seam.LOGITS_OUT,
    "processor": seam.LOGITS,
    "running_batch": seam.BATCH,
    "dc": seam.DLLM_CONFIG,
    "sa": seam.SERVER_ARGS,
    "reporter": seam.REPORTER,
    "parallel": seam.PARALLEL_CTX,
    "controller": seam.DP_CONTROLLER,
    "tokenized": seam.TOKENIZED,
    "writer": f"{seam.SNAPSHOTS}.ShmLoadSnapshotWriter",
    "load": f"{seam.SNAPSHOTS}.LoadSnapshot",
}
#: an attribute's class, where the seam reads further into it
ATTR_TYPES = {
    (seam.SCHEDULER, "dllm_config"): seam.DLLM_CONFIG,
    (seam.SCHEDULER, "dllm_manager"): seam.MANAGER,
    (seam.SCHEDULER, "server_args"): seam.SERVER_ARGS,
    (seam.SCHEDULER, "model_config"): seam.MODEL_CONFIG,
    (seam.SCHEDULER, "metrics_reporter"): seam.REPORTER,
    (seam.SCHEDULER, "token_to_kv_pool_allocator"): seam.ALLOCATOR,
    (seam.SCHEDULER, "req_to_token_pool"): seam.REQ_POOL,
    (seam.REPORTER, "metrics_collector"): seam.COLLECTOR,
    (seam.REQ, "sampling_params"): seam.SAMPLING,
    (seam.RESULT, "logits_output"): seam.LOGITS_OUT,
    (seam.DP_CONTROLLER, "port_args"): seam.PORT_ARGS,
}
#: the plugin's own attribute on the scheduler (its state), not an SGLang name
OWN = {"dwise_serving"}


def _modules() -> list[Path]:
    return sorted(PLUGIN.glob("*.py"))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the chain is not rooted at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _outermost_chains(tree: ast.AST) -> list[list[str]]:
    inner = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            sub = node.value
            while isinstance(sub, ast.Attribute):
                inner.add(id(sub))
                sub = sub.value
            chain = _chain(node)
            if chain:
                out.append(chain)
    return out


def _typed_paths(chain: list[str], imported: dict[str, str]) -> list[str]:
    """The SGLang dotted paths a chain reads, one per step into an SGLang object."""
    root, attrs = chain[0], chain[1:]
    if root in imported:
        return [".".join([imported[root], *attrs[:1]])] if attrs else []
    owner = VAR_TYPES.get(root)
    paths = []
    for attr in attrs:
        if owner is None:
            break
        paths.append(f"{owner}.{attr}")
        owner = ATTR_TYPES.get((owner, attr))
    return paths


def _known(path: str) -> bool:
    if path in SURFACE:
        return True
    # Scheduler inherits the dLLM mixin's methods
    return path.replace(seam.SCHEDULER + ".", seam.MIXIN + ".") in SURFACE


def _reflects_on_sglang(node: ast.AST) -> bool:
    """``getattr(sched, "x")`` and the like on an SGLang object (the plugin's own state aside)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    if node.func.id not in ("getattr", "setattr", "hasattr") or len(node.args) < 2:
        return False
    obj, name = node.args[0], node.args[1]
    own = isinstance(name, ast.Name) and name.id == "STATE_ATTR"
    return isinstance(obj, ast.Name) and obj.id in VAR_TYPES and not own


def test_no_plugin_module_but_the_seam_touches_sglang():
    offences = []
    for path in _modules():
        if path.name == "seam.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (mod or "").split(".")[0] == "sglang":
                    offences.append(f"{path.name}:{node.lineno} imports {mod}")
            elif isinstance(node, ast.Constant) and str(node.value).startswith("sglang."):
                offences.append(f"{path.name}:{node.lineno} names {node.value}")
            elif _reflects_on_sglang(node):
                offences.append(f"{path.name}:{node.lineno} getattr/setattr/hasattr")
        for chain in _outermost_chains(tree):
            if chain[0] in VAR_TYPES and len(chain) > 1:
                offences.append(f"{path.name}: reads {'.'.join(chain)}")
    assert not offences, "SGLang touched outside the seam:\n" + "\n".join(offences)


def test_every_sglang_name_the_seam_uses_is_verified():
    tree = ast.parse((PLUGIN / "seam.py").read_text(encoding="utf-8"))
    imported: dict[str, str] = {}
    unverified = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                imported[alias.asname or alias.name] = full
                if not any(p == full or p.startswith(full + ".") for p in SURFACE):
                    unverified.append(f"import {full}")
    for chain in _outermost_chains(tree):
        unverified += [p for p in _typed_paths(chain, imported) if not _known(p)]
    # bare uses of an imported SGLang name (a call, an isinstance) are listed too
    for node in ast.walk(tree):
        full = imported.get(node.id) if isinstance(node, ast.Name) else None
        if full and full not in SURFACE and not any(p.startswith(full + ".") for p in SURFACE):
            unverified.append(full)
    assert not unverified, f"SGLang names used but not in seam.SURFACE: {sorted(set(unverified))}"


def test_the_surface_lists_only_names_the_seam_uses():
    """A stale entry would make start-up refuse an SGLang for a name nobody reads."""
    import re

    source = (PLUGIN / "seam.py").read_text(encoding="utf-8")
    body = source[source.index("SCHEDULER_ATTRS =") :]  # the code after the list itself
    plugin_src = (PLUGIN / "plugin.py").read_text(encoding="utf-8")
    unused = []
    for n in seam.SURFACE:
        last = n.path.rsplit(".", 1)[1]
        where = plugin_src if n.use == "hook" else body
        if not re.search(rf"\b{re.escape(last)}\b", where):
            unused.append(n.path)
    assert not unused, f"seam.SURFACE entries no code uses: {unused}"


@pytest.mark.parametrize("kind", ["hook", "call", "read", "write", "value"])
def test_every_kind_of_use_is_listed(kind):
    assert any(n.use == kind for n in seam.SURFACE)
