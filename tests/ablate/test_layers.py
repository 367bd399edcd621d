"""The layers (ablate/layers.py): every import in the package, those inside functions too, goes
to its own layer or one below; every module belongs to a layer; the architecture page shows the
same table."""
import ast
from pathlib import Path

from ablate.layers import LAYERS, layer_of, markdown, rank
from tests.helpers.repo import REPO

# Where each dotted package's files are (analysis/ and variants/ install as ablate.analysis and
# ablate.variants).
ROOTS = {"ablate": REPO / "ablate", "ablate.analysis": REPO / "analysis", "ablate.variants": REPO / "variants"}


def modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the roots."""
    out = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if package == "ablate" and parts[0] in ("analysis", "variants"):
                continue
            out[".".join([package, *(p for p in parts if p != "__init__")])] = path
    return out


def imported(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of `package` in a module, at any depth."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == package:
            # `from ablate import x` names a module of the package itself: judge x
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == package else [node.module]
            out += [(node.lineno, name) for name in names]
    return out


def upward_imports(roots: dict[str, Path], layer_of=layer_of, rank=rank) -> list[str]:
    """`file:line: layer -> higher layer (module)` for each import that runs upward, and
    `file: no layer` for a module the table does not place."""
    offenders = []
    for name, path in modules(roots).items():
        mine = layer_of(name)
        where = path.relative_to(path.parents[len(name.split(".")) - 1 + (path.name == "__init__.py")])
        if mine is None:
            offenders.append(f"{where}: no layer")
            continue
        for line, target in imported(ast.parse(path.read_text()), "ablate"):
            theirs = layer_of(target)
            if theirs is not None and rank(theirs) > rank(mine):
                offenders.append(f"{where}:{line}: {mine.name} -> {theirs.name} ({target})")
    return offenders


def test_no_import_runs_up_a_layer():
    assert upward_imports(ROOTS) == []


def test_each_folder_of_the_package_is_one_layers():
    packages = [p for layer in LAYERS for p in layer.packages]
    assert len(packages) == len(set(packages))
    for folder in sorted(p for p in (REPO / "ablate").iterdir() if (p / "__init__.py").is_file()):
        assert layer_of(f"ablate.{folder.name}") is not None, folder


def test_the_architecture_page_draws_this_table():
    assert markdown() in (REPO / "docs" / "architecture.md").read_text()


def test_the_check_finds_an_upward_import_inside_a_function(tmp_path):
    (tmp_path / "ablate" / "core").mkdir(parents=True)
    (tmp_path / "ablate" / "engine").mkdir()
    (tmp_path / "ablate" / "core" / "a.py").write_text("import os\n\ndef f():\n    from ablate.engine import b\n")
    (tmp_path / "ablate" / "engine" / "b.py").write_text("from ablate.core.a import f\nfrom ablate import layers\n")
    (tmp_path / "ablate" / "stray.py").write_text("")
    found = upward_imports({"ablate": tmp_path / "ablate"},
                           layer_of=lambda m: None if m == "ablate.stray" else layer_of(m))
    assert found == ["ablate/core/a.py:4: core -> engine (ablate.engine)", "ablate/stray.py: no layer"]
