"""The import contract: sim/ is layered, and every module imports only from its layer or below.

Layers, lowest first: ``core`` (values, state, errors) → ``cost``, ``kv``, ``workload``,
``metrics`` → ``engine`` → ``cluster`` → ``experiments`` → ``report`` → the API façade
(``sim/__init__.py``, ``sim/api.py``) and ``cli``. ``policies`` and ``routers`` are plugin
packages: they import only ``sim.core``, and only the engine layer and above import them.
No module imports another module's private (underscore) names. Function-level and
``TYPE_CHECKING`` imports count too: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Each layer's rank; a module may import from layers of equal or lower rank.
LAYERS = {"core": 0, "cost": 1, "kv": 2, "workload": 3, "metrics": 4, "engine": 5,
          "cluster": 6, "experiments": 7, "report": 8, "api": 9, "cli": 10}
#: What the plugin packages may import from ``sim``.
POLICIES_MAY_IMPORT = ("sim.core",)
#: Top-level plugin packages (each imports only ``POLICIES_MAY_IMPORT`` and itself).
PLUGINS = ("policies", "routers")
PACKAGES = ("sim", *PLUGINS)


def layer_of(module: str) -> str | None:
    """The layer of a ``sim`` module name (``sim.engine.replica`` → ``engine``)."""
    parts = module.split(".")
    if parts[0] != "sim":
        return None
    if len(parts) == 1 or parts[1] == "api":
        return "api"
    return parts[1] if parts[1] in LAYERS else None


def imports_of(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """``(line, imported module, imported names)`` for every import in the file at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((node.lineno, mod, [a.name for a in node.names]))
    return found


def module_name(path: Path, root: Path) -> str:
    """Dotted module name of ``path`` relative to ``root``."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def violations(root: Path) -> list[str]:
    """Every breach of the import contract in the ``sim`` and plugin trees under ``root``."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            mod = module_name(path, root)
            package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
            own = layer_of(mod)
            where = f"{path.relative_to(root)}"
            for line, target, names in imports_of(path, package):
                if target.split(".")[0] not in PACKAGES:
                    continue
                # Private names of another module, or another module's private submodule.
                if target != mod:
                    private = [n for n in names if n.startswith("_") and n != "__version__"]
                    private += [p for p in target.split(".") if p.startswith("_")]
                    if private:
                        out.append(f"{where}:{line}: imports private {private} from {target}")
                if pkg in PLUGINS:
                    top = target.split(".")[0]
                    if top == "sim" and not any(
                            target == p or target.startswith(p + ".")
                            for p in POLICIES_MAY_IMPORT):
                        out.append(f"{where}:{line}: {pkg} may import only sim.core, "
                                   f"not {target}")
                    elif top in PLUGINS and top != pkg:
                        out.append(f"{where}:{line}: plugin package {pkg} imports {top}")
                    continue
                if target.split(".")[0] in PLUGINS:
                    if own is not None and LAYERS[own] < LAYERS["engine"]:
                        out.append(f"{where}:{line}: layer {own!r} imports plugin package "
                                   f"{target} (only engine and above may)")
                    continue
                theirs = layer_of(target if names == [] or target != "sim" else
                                  f"sim.{names[0]}")
                if own is None:
                    out.append(f"{where}: module outside every layer (add it to LAYERS)")
                    break
                if theirs is None:
                    out.append(f"{where}:{line}: imports {target}, which is in no layer")
                elif LAYERS[theirs] > LAYERS[own]:
                    out.append(f"{where}:{line}: layer {own!r} imports higher layer "
                               f"{theirs!r} ({target})")
    return out


def test_sim_and_policies_keep_the_import_contract() -> None:
    assert violations(REPO) == []


@pytest.mark.parametrize(("path", "source", "expect"), [
    ("sim/core/types.py", "from sim.engine.replica import Replica\n", "higher layer"),
    ("sim/cost/base.py", "def f():\n    from sim.experiments import config\n", "higher layer"),
    ("sim/kv/cache.py", "import sim.metrics.summary\n", "higher layer"),
    ("sim/engine/replica.py", "from sim.cost.base import _Private\n", "private"),
    ("policies/static.py", "from sim.engine.replica import Replica\n", "only sim.core"),
    ("routers/balance.py", "from sim.kv.cache import BlockPool\n", "only sim.core"),
    ("routers/base.py", "from policies import make_policy\n", "plugin package routers"),
    ("sim/kv/cache.py", "from routers import make_router\n", "plugin package"),
    ("sim/metrics/summary.py", "from policies import make_policy\n", "plugin package"),
    ("sim/newlayer/x.py", "from sim.core.types import Request\n", "outside every layer"),
])
def test_planted_violations_are_caught(tmp_path: Path, path: str, source: str,
                                       expect: str) -> None:
    """Each kind of breach, planted in a scratch tree, is reported."""
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    (tmp_path / "sim").mkdir(exist_ok=True)
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "routers").mkdir(exist_ok=True)
    target.write_text(source)
    found = violations(tmp_path)
    assert any(expect in v for v in found), found


def test_importing_policies_first_works() -> None:
    """A custom policy module starts with ``import policies``: no import cycle with ``sim``."""
    import subprocess
    import sys

    code = "import policies; import sim; print(sorted(policies.registered()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "continuous" in done.stdout
