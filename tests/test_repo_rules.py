"""Rules that hold across the whole repository, not of one module: the layering of the three
folders (analysis/ reads run folders and never imports torch or the engine; the declarations it
shares with the engine need only the standard library), no module importing another's
private names, and tests that mirror the source tree."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.repo import REPO

PACKAGE = REPO / "ablate"

# What analysis may import of the engine: the run folder's contract (ablate/core/rundir.py, standard
# library only) and the error type it raises.
RUN_FOLDER_MODULES = ("ablate.core", "ablate.core.rundir", "ablate.core.errors", "ablate.core.safe_files")
# The declarations analysis shares with the engine, standard library only by their own rule
# (ablate/core/registry.py: the one Registry; ablate/core/variant_axes.py: the variant axes, declared once;
# ablate/core/cores.py: the cores this process may use; ablate/core/probe_registry.py: the probes, declared once;
# ablate/core/bounded_read.py: the one reader of JSON and TOML files, and its size caps;
# ablate/core/collapse.py: the rule that calls a run dead, read by the outcome and the early stop).
SHARED_DECLARATIONS = ("ablate.core.registry", "ablate.core.variant_axes", "ablate.core.cores",
                       "ablate.core.probe_registry", "ablate.core.bounded_read", "ablate.core.collapse")
# Judging a claim reads run folders as analysis does (ablate/claims/: the tests, the verdict, the
# looks' decisions, the reports and plots): the same rule holds for those modules.
CLAIM_JUDGING = ("best_rate_bounds", "claim_file", "claim_checks", "claim_measures", "claim_plots", "claim_report",
                 "decide", "decision_report", "design_checks", "rate_choice", "selection", "sequential", "spending", "verdict")
# Each folder of tests/ that mirrors a source folder: tests/ablate/grid/test_runner.py tests
# ablate/grid/runner.py. (The tests of several modules at once sit at the top of tests/.)
MIRRORED = {"ablate": REPO / "ablate", "analysis": REPO / "analysis", "variants": REPO / "variants",
            "helpers": REPO / "tests" / "helpers"}
STANDARD_LIBRARY_ONLY = (r"^(?:from|import) (?!__future__|dataclasses|typing|collections|os\b|ablate\.core\.registry\b"
                         r"|ablate\.core\.probe_registry\b"
                         r"|ablate\.core\.errors\b|errno\b|json\b|math\b|re\b|stat\b|sys\b|tomllib\b|pathlib\b)")


def private_imports(root: Path) -> list[str]:
    """`file: module.name` for each `from ablate... import _name` under root."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ablate"):
                offenders += [f"{path.relative_to(root)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and a.name != "__version__"]
    return offenders


def unmirrored_tests(tests: Path, mirrored: dict[str, Path]) -> list[str]:
    """Each test file in a mirroring folder of `tests` without the module its name says it tests."""
    offenders = []
    for folder, source in mirrored.items():
        for path in sorted((tests / folder).rglob("test_*.py")):
            module = source / path.parent.relative_to(tests / folder) / path.name.removeprefix("test_")
            if not module.is_file():
                offenders.append(f"{path.relative_to(tests)}: no {module.relative_to(source.parent)}")
    return offenders


def test_no_module_imports_another_modules_private_names():
    assert private_imports(PACKAGE) == []


def test_analysis_never_imports_torch_or_the_engine():
    judging = tuple(f"ablate.claims.{m}" for m in CLAIM_JUDGING)
    code = ("import sys, ablate.analysis.load, ablate.analysis.metrics, ablate.analysis.stats, "
            f"ablate.analysis.plots, ablate.analysis.report, {', '.join(judging)}; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or "
            f"(m.startswith('ablate.') and not m.startswith('ablate.analysis') and "
            f"m not in {RUN_FOLDER_MODULES + SHARED_DECLARATIONS + judging + ('ablate.claims',)!r})]; "
            "print(json.dumps(bad))").replace("import sys,", "import json, sys,")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    shared = "|".join(m.removeprefix("ablate.").replace(".", r"\.")
                      for m in RUN_FOLDER_MODULES + SHARED_DECLARATIONS)
    judged = "|".join(CLAIM_JUDGING)
    sources = [*(REPO / "analysis").glob("*.py"), *(REPO / "ablate" / "claims" / f"{m}.py" for m in CLAIM_JUDGING)]
    for source in sources:
        text = source.read_text()
        engine = re.findall(rf"(?:from|import) ablate\.(?!analysis\b|claims(?:\.(?:{judged})\b| import (?:{judged})\b)|(?:{shared})\b)", text)
        assert "import torch" not in text and not engine, source
    for module in SHARED_DECLARATIONS:  # what they import themselves: the standard library only
        text = (REPO / module.replace(".", "/")).with_suffix(".py").read_text()
        assert not re.findall(STANDARD_LIBRARY_ONLY, text, re.M), module


def test_the_registry_and_the_axes_import_without_torch():
    code = ("import sys; import ablate.core.registry, ablate.core.variant_axes, ablate.analysis.load; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_run_folder_module_needs_nothing_but_the_standard_library():
    code = ("import sys, ablate.core.rundir; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'pandas') or "
            "(m.startswith('ablate.') and m not in ('ablate.core', 'ablate.core.rundir', 'ablate.core.errors', "
            "'ablate.core.safe_files', 'ablate.core.bounded_read'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_each_test_file_in_a_mirroring_folder_names_a_module_that_exists():
    assert unmirrored_tests(REPO / "tests", MIRRORED) == []


def test_the_rules_catch_what_they_forbid(tmp_path):
    (tmp_path / "src" / "grid").mkdir(parents=True)
    (tmp_path / "src" / "grid" / "runner.py").touch()
    (tmp_path / "tests" / "src" / "grid").mkdir(parents=True)
    for name in ("test_runner.py", "test_runer.py", "helper.py"):
        (tmp_path / "tests" / "src" / "grid" / name).touch()
    assert unmirrored_tests(tmp_path / "tests", {"src": tmp_path / "src"}) == \
        ["src/grid/test_runer.py: no src/grid/runer.py"]
    (tmp_path / "a.py").write_text("from ablate.engine.train import _secret, public\nfrom os import _exit\n")
    assert private_imports(tmp_path) == ["a.py: ablate.engine.train._secret"]
    assert re.findall(STANDARD_LIBRARY_ONLY, "import numpy as np\nimport os\nfrom typing import Any\n", re.M) == ["import "]
