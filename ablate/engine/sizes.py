"""Named model sizes. All share the ANDREA shape rules (MLP 4x unless `mlp_ratio` says otherwise, head dim d/heads, learned
positions, tied embeddings); only the numbers change. CPU sizes use byte tokens."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ablate.core.errors import ConfigError


@dataclass(frozen=True)
class ModelSize:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    vocab_size: int
    context: int
    tokenizer: str  # "bytes" (vocab 256) or "bpe" (trained to vocab_size on the corpus)
    mlp_ratio: float = 4.0  # the dense MLP's width / d_model (the `mlp_ratio` option)

    @property
    def mlp_hidden(self) -> int:
        return round(self.mlp_ratio * self.d_model)

    def with_layers(self, n_layer: int | None) -> "ModelSize":
        if n_layer is None or n_layer == self.n_layer:
            return self
        if n_layer < 1:
            raise ConfigError(f"layers {n_layer} must be at least 1")
        return replace(self, n_layer=n_layer)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def with_width(self, width: int | None) -> "ModelSize":
        """The same shape at another d_model: the head dimension stays the size's (tiny: 16) and the
        heads grow with the width, as GPT-2's and most ladders' sizes do (ablate ladder scales this)."""
        if width is None or width == self.d_model:
            return self
        if width < 1 or width % self.head_dim:
            raise ConfigError(f"width {width} must be a positive multiple of the head dimension {self.head_dim} "
                              f"of model {self.name}; valid: {', '.join(str(self.head_dim * k) for k in (1, 2, 4, 8))}, ...")
        return replace(self, d_model=width, n_head=width // self.head_dim)

    def with_mlp_ratio(self, ratio: float) -> "ModelSize":
        return self if ratio == self.mlp_ratio else replace(self, mlp_ratio=ratio)

    def as_dict(self) -> dict:
        return {**asdict(self), "mlp_hidden": self.mlp_hidden}


SIZES = {
    s.name: s
    for s in (
        ModelSize("tiny", n_layer=4, d_model=64, n_head=4, vocab_size=256, context=64, tokenizer="bytes"),
        ModelSize("small", n_layer=6, d_model=128, n_head=4, vocab_size=256, context=128, tokenizer="bytes"),
        ModelSize("medium", n_layer=12, d_model=384, n_head=6, vocab_size=8449, context=256, tokenizer="bpe"),
        ModelSize("andrea-120m", n_layer=12, d_model=768, n_head=12, vocab_size=8449, context=1024, tokenizer="bpe"),
    )
}


def get_size(name: str) -> ModelSize:
    try:
        return SIZES[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; valid: {', '.join(SIZES)}") from None
