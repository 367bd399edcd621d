"""`ablate variants [--model SIZE]`: the registry, with parameter counts at a size."""
from __future__ import annotations

from ablate.core.variant_axes import DECLARED_AXES
from ablate.engine import plugins
from ablate.engine.inspect_model import param_breakdown
from ablate.engine.model import build_model
from ablate.engine.sizes import get_size
from ablate.variants import INITS, OPTIMIZERS, PRESETS, SCHEDULES, all_variants
from ablate.variants.tables import AXIS_VALUES

# (name, registry, values valid besides the registered ones): each variant axis with registered
# values (ablate/core/variant_axes.py), then what trains the block
REGISTRIES = (*((a.name, AXIS_VALUES[a.registry], a.extra_values) for a in DECLARED_AXES if a.registry),
              ("init", INITS, ()), ("optimizer", OPTIMIZERS, ()), ("schedule", SCHEDULES, ()))


def registered_values() -> list[str]:
    """One line per registry: its values, a plugin's marked with the module that registered it."""
    files = {r["module"]: r["file"] for r in plugins.records() if r.get("file")}
    lines = []
    for axis, registry, extra_values in REGISTRIES:
        values = list(extra_values)
        for name in registry:
            origin = registry.origin(name)
            values.append(name if origin.startswith("ablate.") else f"{name} (from {files.get(origin, origin)})")
        lines.append(f"  {axis:<11}{', '.join(values)}")
    return lines


def add_arguments(p) -> None:
    p.add_argument("--model", default="andrea-120m", help="size to count parameters at (default andrea-120m)")


def run(args) -> int:
    size = get_size(args.model)
    presets = {}
    for name in PRESETS:
        presets.setdefault(PRESETS.get(name).id, []).append(name)
    default = build_model(PRESETS.get("gpt2"), size, device="meta")  # meta: counts, no memory
    b = param_breakdown(default)
    print(f"model {size.name}: {size.n_layer} blocks, d_model {size.d_model}, {size.n_head} heads, "
          f"MLP {size.mlp_hidden}, vocab {size.vocab_size}, context {size.context}")
    print(f"default block ({PRESETS.get('gpt2').id}) parameters:")
    for key, label in [("embeddings", "embeddings (token + position, tied output)"),
                       ("attention_per_block", "attention per block"), ("mlp_per_block", "MLP per block"),
                       ("norms_per_block", "norms per block"), ("per_block", "per block"),
                       ("blocks", f"all {size.n_layer} blocks"), ("final_norm", "final norm"),
                       ("total", "total")]:
        print(f"  {label:<44}{b[key]:>14,}")
    print()
    print("registered values (axes of a block, and what trains it):")
    print("\n".join(registered_values()))
    print()
    specs = list(all_variants())
    print(f"{len(specs)} registered variants (parameters at {size.name}):")
    print(f"  {'id':<48}{'parameters':>14}  {'vs default':>10}  presets")
    for spec in specs:
        n = param_breakdown(build_model(spec, size, device="meta"))["total"]
        print(f"  {spec.id:<48}{n:>14,}  {n / b['total'] - 1:>+10.2%}  {', '.join(presets.get(spec.id, []))}")
    return 0
