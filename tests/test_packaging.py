"""The install (pyproject.toml): nothing named variants or analysis lands in site-packages."""
import shutil
import subprocess
import sys
import zipfile

from tests.helpers.repo import REPO


def test_a_normal_install_puts_nothing_named_variants_or_analysis_in_site_packages(tmp_path):
    # Built from a copy without the checkout's build leftovers: an egg-info's file list would add
    # files the package data does not name, as a clean checkout (CI's, a user's) would not.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns("*.egg-info", "build", ".git", "runs", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("ablate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ablate", next(n.split("/")[0] for n in names if ".dist-info" in n)}
    for folder, package in (("variants", "ablate/variants"), ("analysis", "ablate/analysis"), ("ablate", "ablate")):
        for source in (REPO / folder).rglob("*.py"):
            assert f"{package}/{source.relative_to(REPO / folder).as_posix()}" in names, source
    assert "ablate/variants/grids/prenorm-wins.toml" in names
    # The kernels' sources, headers included: an installed package builds its kernels from them.
    for source in (REPO / "ablate" / "kernels").glob("*/*"):
        if source.suffix in (".c", ".h", ".cu", ".cpp"):
            assert f"ablate/{source.relative_to(REPO / 'ablate').as_posix()}" in names, source
