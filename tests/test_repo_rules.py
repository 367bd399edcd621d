"""Rules that hold across the whole repository, not of one module: the layering of the three
folders (analysis/ reads run folders and never imports torch or the engine; the declarations it
shares with the engine need only the standard library), and no module importing another's
private names."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.repo import REPO

PACKAGE = REPO / "ablate"

# What analysis may import of the engine: the run folder's contract (ablate/rundir.py, standard
# library only) and the error type it raises.
RUN_FOLDER_MODULES = ("ablate.rundir", "ablate.errors")
# The declarations analysis shares with the engine, standard library only by their own rule
# (ablate/registry.py: the one Registry; ablate/variant_axes.py: the variant axes, declared once;
# ablate/cores.py: the cores this process may use; ablate/probe_registry.py: the probes, declared once).
SHARED_DECLARATIONS = ("ablate.registry", "ablate.variant_axes", "ablate.cores", "ablate.probe_registry")
STANDARD_LIBRARY_ONLY = r"^(?:from|import) (?!__future__|dataclasses|typing|collections|os\b|ablate\.registry\b)"


def private_imports(root: Path) -> list[str]:
    """`file: module.name` for each `from ablate... import _name` under root."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ablate"):
                offenders += [f"{path.relative_to(root)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and a.name != "__version__"]
    return offenders


def test_no_module_imports_another_modules_private_names():
    assert private_imports(PACKAGE) == []


def test_analysis_never_imports_torch_or_the_engine():
    code = ("import sys, ablate.analysis.load, ablate.analysis.metrics, ablate.analysis.stats, "
            "ablate.analysis.plots, ablate.analysis.report, ablate.analysis.claim_plots; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or "
            f"(m.startswith('ablate.') and not m.startswith('ablate.analysis') and m not in {RUN_FOLDER_MODULES + SHARED_DECLARATIONS!r})]; "
            "print(json.dumps(bad))").replace("import sys,", "import json, sys,")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    shared = "|".join(m.removeprefix("ablate.") for m in SHARED_DECLARATIONS)
    for source in (REPO / "analysis").glob("*.py"):
        text = source.read_text()
        engine = re.findall(rf"(?:from|import) ablate\.(?!analysis\b|rundir\b|(?:{shared})\b)", text)
        assert "import torch" not in text and not engine, source
    for module in SHARED_DECLARATIONS:  # what they import themselves: the standard library only
        text = (REPO / module.replace(".", "/")).with_suffix(".py").read_text()
        assert not re.findall(STANDARD_LIBRARY_ONLY, text, re.M), module


def test_the_registry_and_the_axes_import_without_torch():
    code = ("import sys; import ablate.registry, ablate.variant_axes, ablate.analysis.load; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_run_folder_module_needs_nothing_but_the_standard_library():
    code = ("import sys, ablate.rundir; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'pandas') or "
            "(m.startswith('ablate.') and m not in ('ablate.rundir', 'ablate.errors', 'ablate.analysis', "
            "'ablate.analysis.safe_files'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_rules_catch_what_they_forbid(tmp_path):
    (tmp_path / "a.py").write_text("from ablate.train import _secret, public\nfrom os import _exit\n")
    assert private_imports(tmp_path) == ["a.py: ablate.train._secret"]
    assert re.findall(STANDARD_LIBRARY_ONLY, "import numpy as np\nimport os\nfrom typing import Any\n", re.M) == ["import "]
