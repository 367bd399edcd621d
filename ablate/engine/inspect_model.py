"""Parameter counts of a built model, broken down the way papers report them."""
from __future__ import annotations

from ablate.engine.model import GPT


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def param_breakdown(model: GPT) -> dict[str, int]:
    """Tied weights are counted once (nn.Module.parameters() deduplicates them)."""
    block = model.blocks[0]
    attn, mlp, block_total = _count(block.attn), _count(block.mlp), _count(block)
    return {
        "embeddings": _count(model.wte) + _count(model.wpe),
        "attention_per_block": attn,
        "mlp_per_block": mlp,
        "norms_per_block": block_total - attn - mlp,
        "per_block": block_total,
        "blocks": block_total * len(model.blocks),
        "final_norm": _count(model.norm_f),
        "total": _count(model),
    }
