"""The CPU kernels' forms the cells of a grid, a claim or a ladder computed with (config.json
`gelu_cpu`, `attention_cpu`; ablate/kernels/cpu_build.py). A form fixes its op's last bits, so
cells on different forms (a cached kernel that could not be built for some of them) differ by
more than their variant and seed: the reports say so. Standard library and pandas only."""
from __future__ import annotations

import pandas as pd

# config.json key -> the op it computes (ablate/engine/train.py CPU_KERNELS holds the kernels themselves).
FORM_KEYS = {"gelu_cpu": "GELU", "attention_cpu": "attention"}
NOT_RECORDED = "not recorded"  # a run made before that kernel existed: its torch form


def _counts(cells: pd.DataFrame, key: str) -> dict[str, int]:
    on_cpu = cells[cells["device"] == "cpu"] if "device" in cells else cells
    if key not in on_cpu:
        return {}
    values = on_cpu[key].where(on_cpu[key].notna(), NOT_RECORDED)
    return {str(k): int(v) for k, v in values.value_counts().sort_index().items()}


def forms_line(cells: pd.DataFrame) -> str | None:
    """`GELU poly-bias; attention blocked` (with counts where they mix), None without CPU cells."""
    parts = []
    for key, what in FORM_KEYS.items():
        counts = _counts(cells, key)
        if counts:
            parts.append(f"{what} " + ", ".join(f"{form} ({n} cells)" if len(counts) > 1 else form
                                                  for form, n in counts.items()))
    return "; ".join(parts) or None


def mix_note(cells: pd.DataFrame) -> str | None:
    """A sentence when the CPU cells did not all compute each op in one form, else None."""
    mixed = [key for key in FORM_KEYS if len(_counts(cells, key)) > 1]
    if not mixed:
        return None
    detail = "; ".join(f"{FORM_KEYS[k]}: " + ", ".join(f"{form} in {n}" for form, n in _counts(cells, k).items())
                       for k in mixed)
    return (f"The cells computed their CPU kernels in different forms ({detail} cells): a form fixes its op's "
            "last bits, so these cells differ by more than their variant and seed (a kernel that could not be "
            "built when some of them ran; see each cell's config.json).")
