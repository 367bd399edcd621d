"""The layers of the house, lowest first. A module may import its own layer and those below it,
never one above: tests/ablate/test_layers.py parses every import (those inside functions too) and
holds the code to this table, and docs/architecture.md draws it (`python -m ablate.layers`).

Data flows the same way: a grid file becomes cells (grid), each trained by the engine into a
run directory (core's contract), which analysis reads; claims judge what analysis measures.
"""
from __future__ import annotations

import sys
from typing import NamedTuple


class Layer(NamedTuple):
    name: str
    packages: tuple[str, ...]  # dotted packages (or modules) the layer holds
    what: str


LAYERS = (
    Layer("core", ("ablate.core", "ablate.layers", "ablate"),
          "what every layer shares, standard library first: the registry, errors, the run folder's "
          "contract, atomic files, bounded reads, provenance, the variant axes and probe names, the cache"),
    Layer("variants", ("ablate.variants",),
          "the registries of block variants (placements, norms, activations, MLPs), inits, optimizers, schedules"),
    Layer("kernels", ("ablate.kernels",),
          "the kernel interface and its backends (reference, cpu, Triton, CUDA), parity, `--kernels auto`"),
    Layer("engine", ("ablate.engine",),
          "options, the model, probes, data, training one cell, packs of stacked cells, plugins"),
    Layer("grid", ("ablate.grid", "ablate.backends"),
          "grid files and their cells, running a grid on a backend (local workers, Ray, SLURM), progress"),
    Layer("bench", ("ablate.bench",),
          "measured speed: the time estimates and dry runs, the benchmarks, whole-step kernel tuning"),
    Layer("analysis", ("ablate.analysis",),
          "reads run directories: loading, stability metrics, outcomes, statistics, plots, reports, export"),
    Layer("claims", ("ablate.claims", "ablate.ladder"),
          "a claim from its file to its verdict (claims/), and across model sizes (ladder/)"),
    Layer("commands", ("ablate.commands", "ablate.cli", "ablate.__main__"),
          "the command line: each command parses its arguments and calls the library"),
)


def layer_of(module: str) -> Layer | None:
    """The layer holding a dotted module name: its longest matching package."""
    best = None
    for layer in LAYERS:
        for package in layer.packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (layer, package)
    return best[0] if best else None


def rank(layer: Layer) -> int:
    return LAYERS.index(layer)


def markdown() -> str:
    """The table docs/architecture.md shows, lowest layer at the bottom."""
    rows = ["| layer | packages | what it holds |", "|---|---|---|"]
    for layer in reversed(LAYERS):
        packages = ", ".join(f"`{p}`" for p in layer.packages if p != "ablate")
        rows.append(f"| {rank(layer)}. {layer.name} | {packages} | {layer.what} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
