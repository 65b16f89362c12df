"""Import contracts: which part of the code may import which (run by `make lint` and `make test`).

The feature folders install under the ``dwise_predict`` namespace, so a core module importing
``dwise_predict.tracing`` looks like an ordinary import; and nothing else stops a low module
from reaching up into a higher one. These contracts, checked on every import statement in the
source (module level, inside functions and under ``TYPE_CHECKING`` alike), keep the layering
real. A layer may import its own layer and any layer below it, never one above. The layers,
highest first:

====================  ===========================================================================
recipe                ``zoo/tiny_bd/recipe``: tiny-bd's training lab (in the repository, no wheel)
cli                   ``dwise_predict/cli``: composes everything below, features only lazily
features              ``tracing/`` > ``trainers/`` > ``export/``, in that order
zoo runtime           ``zoo/`` minus the recipe: the reference model's runtime
sglang                ``dwise_predict/sglang``: the SGLang plugin
vllm                  ``dwise_predict/vllm``: the vLLM scheduler classes
runtime               ``dwise_predict/runtime``: scheduler, policies, simulator
bundle                bundles, predictors, the cost model, the zoo index
records               traces (reader and writer), features, prompts, fingerprint, hub, ...
base                  errors, atomic writes, version
====================  ===========================================================================

(An equivalent of import-linter's layers contract: import-linter builds its graph by walking
one package folder, and ours is spread over four folders mapped into one namespace.)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: source folder -> the package it installs as
FOLDERS = {
    "dwise_predict": "dwise_predict",
    "tracing": "dwise_predict.tracing",
    "trainers": "dwise_predict.trainers",
    "export": "dwise_predict.export",
    "zoo": "dwise_predict.zoo",
}

#: highest first; a module belongs to the first layer with a matching prefix
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("recipe", ("dwise_predict.zoo.tiny_bd.recipe",)),
    ("cli", ("dwise_predict.cli", "dwise_predict.__main__")),
    ("tracing", ("dwise_predict.tracing",)),
    ("trainers", ("dwise_predict.trainers",)),
    ("export", ("dwise_predict.export",)),
    ("zoo runtime", ("dwise_predict.zoo",)),
    ("sglang", ("dwise_predict.sglang",)),
    ("vllm", ("dwise_predict.vllm",)),
    ("runtime", ("dwise_predict.runtime",)),
    (
        "bundle",
        (
            "dwise_predict.bundle",
            "dwise_predict.predictors",
            "dwise_predict.cost",
            "dwise_predict.cost_profiles",
            "dwise_predict.zoo_index",
        ),
    ),
    (
        "records",
        (
            "dwise_predict.traces",
            "dwise_predict.trace_writer",
            "dwise_predict.features",
            "dwise_predict.prompts",
            "dwise_predict.fingerprint",
            "dwise_predict.hub",
            "dwise_predict.ranking",
            "dwise_predict.rounds",
            "dwise_predict.signals",
            "dwise_predict.tables",
            "dwise_predict.engine_names",
            "dwise_predict.env_settings",
        ),
    ),
    ("base", ("dwise_predict.errors", "dwise_predict.atomic", "dwise_predict._version")),
]

#: the package's front door re-exports from every core layer; it is above them all but the CLI
FRONT_DOOR = "dwise_predict"
FEATURES = ("dwise_predict.tracing", "dwise_predict.trainers", "dwise_predict.export")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (or module.name for ``from x import name``)
    path: Path
    line: int
    in_function: bool  # inside a function or an ``if TYPE_CHECKING:`` block: not at import


def layer_of(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(REPO).with_suffix("")
    parts = [p for p in rel.parts[1:] if p != "__init__"]
    return ".".join([FOLDERS[rel.parts[0]], *parts]), path.name == "__init__.py"


def source_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        files += [p for p in (REPO / folder).rglob("*.py") if "bundles" not in p.parts]
    return sorted(files)


def imports(path: Path) -> list[Import]:
    module, is_package = _module_name(path)
    return parse_imports(path.read_text(encoding="utf-8"), module, is_package, path)


def parse_imports(source: str, module: str, is_package: bool, path: Path) -> list[Import]:
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            nested = nested or _is_type_checking(child)  # never runs: lazy too
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    stem = ".".join(base + ([child.module] if child.module else []))
                else:
                    stem = child.module or ""
                targets = [f"{stem}.{a.name}" for a in child.names] or [stem]
            for t in targets:
                if t.startswith("dwise_predict"):
                    found.append(Import(module, t, path, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def all_imports() -> list[Import]:
    return [i for p in source_files() for i in imports(p)]


def _where(i: Import) -> str:
    return f"{i.path.relative_to(REPO)}:{i.line} ({i.module}) imports {i.target}"


def test_no_layer_imports_a_layer_above_it():
    bad = []
    for i in all_imports():
        if i.module == FRONT_DOOR:
            continue  # re-exports; checked below
        src, dst = layer_of(i.module), layer_of(i.target)
        assert src is not None, f"{i.module} is in no layer: add it to LAYERS in {__file__}"
        if dst is not None and dst < src:
            bad.append(f"{_where(i)}: layer {LAYERS[src][0]!r} may not import {LAYERS[dst][0]!r}")
    assert not bad, "imports that break the layering:\n" + "\n".join(bad)


def test_the_core_imports_no_feature_folder():
    """The core (everything in dwise_predict/ but the CLI) never imports tracing, trainers,
    export or the zoo, not even lazily: a scheduler process has only the core."""
    core_layers = {"sglang", "vllm", "runtime", "bundle", "records", "base"}
    bad = [
        _where(i)
        for i in all_imports()
        if (i.module == FRONT_DOOR or LAYERS[layer_of(i.module) or 0][0] in core_layers)
        and i.target.startswith((*FEATURES, "dwise_predict.zoo."))
    ]
    assert not bad, "the core imports a feature folder:\n" + "\n".join(bad)


def test_cli_imports_features_only_inside_commands():
    """``dwise-predict --help`` and a scheduler importing the CLI module stay light: a feature
    folder is imported inside the subcommand that needs it (or for type checking only)."""
    bad = [
        _where(i)
        for i in all_imports()
        if i.module.startswith("dwise_predict.cli")
        and not i.in_function
        and i.target.startswith((*FEATURES, "dwise_predict.zoo"))
    ]
    assert not bad, "module-level feature imports in the CLI:\n" + "\n".join(bad)


def test_nothing_outside_the_recipe_imports_it():
    """The recipe ships in no wheel, so no installed module may need it."""
    recipe = LAYERS[0][1][0]
    bad = [
        _where(i)
        for i in all_imports()
        if i.target.startswith(recipe) and not i.module.startswith(recipe)
    ]
    assert not bad, "installed code imports the training recipe:\n" + "\n".join(bad)


def test_the_checker_sees_a_violation():
    """The contracts are only worth something if the checker reads every import form."""
    src = "from ..cli import main\nimport dwise_predict.tracing\ndef f():\n    from . import x\n"
    module = "dwise_predict.runtime.probe"
    found = parse_imports(src, module, False, REPO / "dwise_predict/runtime/probe.py")
    assert [(i.target, i.in_function) for i in found] == [
        ("dwise_predict.cli.main", False),
        ("dwise_predict.tracing", False),
        ("dwise_predict.runtime.x", True),
    ]
    assert layer_of("dwise_predict.cli.main") < layer_of(module)  # so it is reported
