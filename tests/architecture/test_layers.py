"""The subpackages form a strict stack: each imports only the layers below; the tensor core loads no Lightning."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_hydro

PACKAGE = Path(lightning_hydro.__file__).parent

# What each subpackage may import from the others (docs/architecture.md draws this stack).
ALLOWED = {
    "stacking": set(),
    "stopping": set(),
    "scaling": set(),
    "demos": set(),
    "backends": {"stacking"},
    "optim": {"stacking"},
    "fused": {"stacking", "backends", "optim", "scaling", "stopping"},
    "callbacks": {"stacking", "backends", "optim", "scaling", "fused", "stopping"},
    "sweeper": {"stacking", "backends", "optim", "scaling", "fused", "stopping", "callbacks", "demos"},
    # Deprecated old paths (removed in the next minor release): stubs that forward to `stopping`; no layer may
    # import them (no other entry names them).
    "schedulers": {"stopping"},
}

# Top-level modules every layer may import: pure Python that imports nothing of ours (checked below).
FLOOR_MODULES = {"_deprecation"}

# Importing these must not load Lightning, Hydra or torchmetrics (`backends.hfta_backend`, the Lightning
# adapter of the fused-operator library, is loaded only when the hfta backend is chosen).
LIGHTNING_FREE = [
    "lightning_hydro.stacking",
    "lightning_hydro.stopping",
    "lightning_hydro.backends",
    "lightning_hydro.backends.hfta",
    "lightning_hydro.optim",
    "lightning_hydro.scaling",
]


def imported_subpackages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lightning_hydro" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("subpackage", sorted(ALLOWED))
def test_subpackage_imports_only_layers_below(subpackage):
    violations = {
        f"{path.relative_to(PACKAGE)} imports lightning_hydro.{other}"
        for path in (PACKAGE / subpackage).rglob("*.py")
        for other in imported_subpackages(path) - ALLOWED[subpackage] - FLOOR_MODULES - {subpackage}
    }
    assert not violations, sorted(violations)


@pytest.mark.parametrize("module", sorted(FLOOR_MODULES))
def test_floor_modules_import_nothing_of_ours(module):
    assert imported_subpackages(PACKAGE / f"{module}.py") == set()


def test_every_subpackage_has_a_layer():
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(ALLOWED)


def test_the_tensor_core_loads_no_lightning():
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in LIGHTNING_FREE)
        + "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'hydra', "
        "'omegaconf', 'torchmetrics'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
