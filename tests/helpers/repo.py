"""The repository's root, for tests that read its files (docs, sources, pyproject.toml)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
