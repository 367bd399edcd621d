"""What a run records about the software that produced it."""
from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

import ablate


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The harness's commit (with `+dirty` for local changes), or None outside git."""
    root = Path(ablate.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    return {"ablate": ablate.__version__, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__}
