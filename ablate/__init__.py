"""ablate: an ablation harness for GPT-style transformer block variants."""

__version__ = "0.1.0"
