"""The import direction ARCHITECTURE.md states, enforced: phase scripts and test_all.py -> synthesis/,
training/ -> evaluation/ -> rollouts/ -> environments/, clients/ -> sandbox/ -> utils/ -> config/,
nothing imports a phase script, the two leaf packages import nothing above them, and the only imports
against the direction are the exceptions ARCHITECTURE.md names."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

# lower number = higher layer; a module may import its own layer and any layer below it
LAYERS = {
    "synthesis": 1,
    "training": 1,
    "evaluation": 2,
    "rollouts": 3,
    "environments": 4,  # the code environments: over the sandbox pool, below every sampler that steps them
    "clients": 4,  # the OpenAI-compatible client: phase 2, teacher scoring and the vllm server backend
    "sandbox": 5,  # the trust boundary knows nothing of models or phases: it may import only utils
    "utils": 6,
    "config": 7,
}
# (importing module, imported module): each written down in ARCHITECTURE.md with its reason (none today)
EXCEPTIONS: set[tuple[str, str]] = set()
LIBRARY_FOLDERS = (
    "synthesis",
    "training",
    "evaluation",
    "rollouts",
    "environments",
    "clients",
    "sandbox",
    "utils",
)


def layer(module: str) -> int | None:
    top = module.split(".")[0]
    if top.startswith("phase") or top == "test_all":
        return 0
    return LAYERS.get(top)


def project_imports(path) -> list[str]:
    """Every module `path` imports, at module level or inside functions (lazy imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return [name for name in found if layer(name) is not None]


def library_modules():
    paths = [p for folder in ("config", *LIBRARY_FOLDERS) for p in sorted((ROOT / folder).rglob("*.py"))]
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts), p) for p in paths]


def test_imports_flow_one_way_except_the_named_exceptions():
    against = set()
    for module, path in library_modules():
        for imported in project_imports(path):
            if layer(imported) < layer(module):  # both are project modules: never None
                against.add((module, imported))
    assert against == EXCEPTIONS  # a new one fails here; a removed one must leave the list (and ARCHITECTURE.md)


def test_the_checker_sees_lazy_imports_and_phase_scripts(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef f():\n    from phase4_evaluate import cli\n    import training.losses\n")
    assert project_imports(probe) == ["phase4_evaluate", "training.losses"]
    assert layer("phase4_evaluate") == 0 < layer("training.losses") == 1 < layer("utils.jsonl")


def test_the_leaf_packages_import_only_the_ground():
    """clients/ and environments/ sit low so that every sampler and phase can import them downward: neither may
    import the other, nor anything above the sandbox."""
    for module, path in library_modules():
        if module.split(".")[0] in ("clients", "environments"):
            for imported in project_imports(path):
                assert imported.split(".")[0] in ("sandbox", "utils", "config"), (module, imported)
