"""Where the harness keeps what it may rebuild: the token cache, compiled kernels, measured
speeds. One folder, $ABLATE_CACHE (default ~/.cache/ablate), private to its user (docs/kernels.md)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("ABLATE_CACHE", Path.home() / ".cache" / "ablate"))
