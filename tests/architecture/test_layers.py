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


def imported_modules(path: Path, *, runtime_only: bool = False) -> set[str]:
    """The absolute module names ``path`` imports (``runtime_only``: outside ``if TYPE_CHECKING:`` blocks)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if runtime_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def parts_imported(path: Path, package: str, *, runtime_only: bool = False) -> set[str]:
    """The direct parts of ``package`` (e.g. ``lightning_hydro.sweeper``) that ``path`` imports."""
    prefix = package.split(".")
    return {
        name.split(".")[len(prefix)]
        for name in imported_modules(path, runtime_only=runtime_only)
        if name.split(".")[: len(prefix)] == prefix and len(name.split(".")) > len(prefix)
    }


def imported_subpackages(path: Path) -> set[str]:
    return parts_imported(path, "lightning_hydro")


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


# The sweeper's two sides (docs/architecture.md): `planning/` runs in the sweeper's process and imports nothing of
# `job/`, which runs inside a launched group job and may use the planning side's pure helpers (search space, device
# plan, fusion limit). The contract and the modules both sides read sit at `sweeper/`'s top and import neither side.
SWEEPER = PACKAGE / "sweeper"
SWEEPER_SHARED = {"group_spec", "json_files", "app_config"}
SWEEPER_SIDES = {"planning": {"planning"}, "job": {"job", "planning"}}
# What else sits at sweeper/'s top: the package, the sweeper class (the entry the Hydra shim imports), and the old
# module paths kept for one release (stubs that import nothing but the deprecation helper).
SWEEPER_ENTRY = {"__init__", "_impl"}


def imported_sweeper_parts(path: Path) -> set[str]:
    """The parts of `lightning_hydro.sweeper` a file imports: a side (`planning`, `job`) or a top-level module."""
    return parts_imported(path, "lightning_hydro.sweeper")


@pytest.mark.parametrize("side", sorted(SWEEPER_SIDES))
def test_each_side_of_the_sweeper_imports_only_what_it_may(side):
    allowed = SWEEPER_SIDES[side] | SWEEPER_SHARED
    violations = {
        f"{path.relative_to(PACKAGE)} imports lightning_hydro.sweeper.{part}"
        for path in (SWEEPER / side).rglob("*.py")
        for part in imported_sweeper_parts(path) - allowed
    }
    assert not violations, sorted(violations)


def test_the_sweepers_contract_imports_neither_side():
    violations = {
        f"sweeper/{name}.py imports lightning_hydro.sweeper.{part}"
        for name in SWEEPER_SHARED
        for part in imported_sweeper_parts(SWEEPER / f"{name}.py") - SWEEPER_SHARED
    }
    assert not violations, sorted(violations)


def test_the_sweepers_top_holds_the_entry_the_contract_and_old_paths_only():
    for path in SWEEPER.glob("*.py"):
        if path.stem in SWEEPER_ENTRY | SWEEPER_SHARED:
            continue
        imports = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [None])
        }
        assert imports == {"lightning_hydro._deprecation"}, f"sweeper/{path.name} is neither shared nor an old path"


def test_only_the_sweepers_settings_read_the_hydra_plugins_config_node():
    # The Hydra plugin's config node is where each hydra.sweeper default is written; the settings read their
    # defaults from it, and nothing else of ours imports the plugin (which forwards to the sweeper, above it).
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.split(".")[0] == "hydra_plugins":
                    found.setdefault(str(path.relative_to(PACKAGE)), set()).add(name)
    assert found == {"sweeper/planning/settings.py": {"hydra_plugins.lightning_hydro_sweeper.config"}}


# Inside fused/: what each part may import of the others at run time (imports under TYPE_CHECKING aside: they are
# type annotations). The trials' state (group/) and verification (verify/) import nothing else of fused/; the steady
# step (step/) knows nothing of the Lightning-facing pieces (lightning/), evaluation or the module; module.py, the
# LightningModule face, ties them together and nothing below imports it. A top-level module not listed (an old path
# kept for one release) may import nothing of fused/.
FUSED_PARTS = {
    "group": set(),
    "verify": set(),
    "logging": {"group"},
    "step": {"group", "logging", "verify", "rank_sync"},
    "rank_sync": {"logging", "step"},
    "optimization": {"group", "step"},
    "lightning": {"group", "logging", "step"},
    "evaluation": {"group", "lightning", "step"},
    "roster": {"evaluation", "lightning", "logging", "optimization", "step"},
    "arguments": set(),
    "module": {
        "arguments",
        "evaluation",
        "group",
        "lightning",
        "logging",
        "optimization",
        "rank_sync",
        "roster",
        "step",
    },
    "__init__": {"module", "verify"},
}


def runtime_fused_parts(path: Path) -> set[str]:
    """The parts of fused/ that ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    return parts_imported(path, "lightning_hydro.fused", runtime_only=True)


def fused_part(path: Path) -> str:
    relative = path.relative_to(PACKAGE / "fused")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_the_parts_of_fused_import_only_what_their_rule_allows():
    violations = sorted(
        f"{path.relative_to(PACKAGE)} imports lightning_hydro.fused.{other}"
        for path in (PACKAGE / "fused").rglob("*.py")
        for other in runtime_fused_parts(path) - FUSED_PARTS.get(fused_part(path), set()) - {fused_part(path)}
    )
    assert not violations, violations


def test_every_folder_of_fused_has_a_rule():
    folders = {path.parent.name for path in (PACKAGE / "fused").glob("*/__init__.py")}
    assert folders <= set(FUSED_PARTS), sorted(folders - set(FUSED_PARTS))
