"""Training options: one table of names, types and defaults shared by the command line,
config files and grid files, and the validation that turns them into a TrainConfig.

A cell is fully described by a TrainConfig; its id is the variant id plus the options
that vary in its grid plus the seed, e.g. `post.layernorm.gelu.dense.res__lr=0.003__seed=1`.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from ablate.errors import ConfigError
from ablate.kernels import CHOICES as KERNEL_CHOICES
from ablate.sizes import SIZES, ModelSize, get_size
from ablate.variants import AXES, VariantError, VariantSpec, make_variant
from ablate.variants.spec import parse_variant_given

SCHEDULES = ("constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class TrainConfig:
    variant: str = "gpt2"  # preset, id or axis=value,...; variant axes below override it
    model: str = "tiny"
    layers: int | None = None  # overrides the size's depth
    steps: int = 300
    lr: float = 1e-3
    warmup: int = 0
    schedule: str = "cosine"  # after warmup: constant, or cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    batch_size: int = 16
    seq_len: int | None = None  # defaults to the size's context
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.0  # 0 = off
    seed: int = 0
    data: str | None = None  # None = the embedded default corpus (the stdlib's sources)
    kernels: str = "auto"
    device: str = "auto"
    dtype: str = "auto"  # auto: bf16 autocast on GPUs, float32 on the CPU
    eval_every: int = 50
    eval_batches: int = 8
    log_every: int = 1
    probes: bool = True  # per-layer gradient/activation/update metrics
    checkpoint_every: int = 100
    diverge_factor: float = 2.0  # diverged when loss > factor * first loss (or non-finite)
    threads: int | None = None  # CPU threads; None = torch's default
    compile: bool = False  # torch.compile the model
    # Variant axes, when given, override the corresponding part of `variant`.
    norm: str | None = None
    norm_type: str | None = None
    act: str | None = None
    mlp: str | None = None
    residual: bool | None = None

    @property
    def spec(self) -> VariantSpec:
        return resolve_variant(self.variant, {k: getattr(self, k) for k in AXES})

    @property
    def size(self) -> ModelSize:
        return get_size(self.model).with_layers(self.layers)

    @property
    def context(self) -> int:
        return self.seq_len or self.size.context

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


OPTION_NAMES = tuple(f.name for f in fields(TrainConfig))
_TYPES = {f.name: f.type for f in fields(TrainConfig)}


def resolve_variant(variant: str, axes: Mapping[str, Any], strict: bool = False) -> VariantSpec:
    """The spec for `variant` with the per-axis options `axes` (None = not given) over it.

    Lenient by default: a grid crossing `act` with a gated MLP collapses rather than failing.
    `strict` refuses, as `--variant mlp=swiglu,act=relu` is refused, an axis that was asked
    for (in `axes`, or written out in `variant` as axis=value) but that the block would
    ignore. A preset's or an id's own values are only implied, so overriding them is fine:
    `--variant gpt2 --mlp swiglu` drops gpt2's act, `--variant llama --act relu` is refused.
    """
    base, written = parse_variant_given(variant)
    overrides = {k: v for k, v in axes.items() if v is not None}
    if not overrides:
        return base
    return make_variant(strict=strict, implied=base.axes(), **{**written, **overrides})


def coerce_option(key: str, value: Any) -> Any:
    kind = _TYPES[key]
    optional = "None" in kind
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} cannot be empty")
    # "none"/"null" mean "not set" for an optional option (`--seq-len none`: the size's
    # context), but for a variant axis "none" is a value (norm=none: no norms), so an axis
    # is left unset only by leaving it out.
    if optional and key not in AXES and isinstance(value, str) and value.strip().lower() in ("none", "null"):
        return None
    try:
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        if kind.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError
    except (TypeError, ValueError):
        want = kind.split(" ")[0]
        raise ConfigError(f"{key} {value!r} is not a valid {want}") from None
    return str(value)


def _check(cfg: TrainConfig, strict: bool) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    need(cfg.model in SIZES, f"unknown model {cfg.model!r}; valid: {', '.join(SIZES)}")
    need(cfg.layers is None or cfg.layers >= 1, f"layers {cfg.layers} must be at least 1")
    need(cfg.steps >= 1, f"steps {cfg.steps} must be at least 1")
    need(math.isfinite(cfg.lr) and cfg.lr > 0, f"lr {cfg.lr} must be a positive number")
    need(cfg.warmup >= 0, f"warmup {cfg.warmup} must be 0 or more")
    need(cfg.schedule in SCHEDULES, f"unknown schedule {cfg.schedule!r}; valid: {', '.join(SCHEDULES)}")
    need(0 <= cfg.min_lr_ratio <= 1, f"min_lr_ratio {cfg.min_lr_ratio} must be in [0, 1]")
    need(cfg.batch_size >= 1, f"batch_size {cfg.batch_size} must be at least 1")
    ctx = get_size(cfg.model).context
    need(cfg.seq_len is None or 1 <= cfg.seq_len <= ctx, f"seq_len {cfg.seq_len} must be in 1..{ctx} for model {cfg.model}")
    need(cfg.weight_decay >= 0, f"weight_decay {cfg.weight_decay} must be 0 or more")
    need(0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1, f"betas ({cfg.beta1}, {cfg.beta2}) must be in [0, 1)")
    need(cfg.grad_clip >= 0, f"grad_clip {cfg.grad_clip} must be 0 (off) or positive")
    need(cfg.seed >= 0, f"seed {cfg.seed} must be 0 or more")
    need(cfg.kernels in KERNEL_CHOICES, f"unknown kernels {cfg.kernels!r}; valid: {', '.join(KERNEL_CHOICES)}")
    need(cfg.device in DEVICES, f"unknown device {cfg.device!r}; valid: {', '.join(DEVICES)}")
    need(cfg.dtype in DTYPES, f"unknown dtype {cfg.dtype!r}; valid: {', '.join(DTYPES)}")
    for key in ("eval_every", "eval_batches", "log_every", "checkpoint_every"):
        need(getattr(cfg, key) >= 1, f"{key} {getattr(cfg, key)} must be at least 1")
    need(cfg.diverge_factor > 1, f"diverge_factor {cfg.diverge_factor} must be above 1")
    need(cfg.threads is None or cfg.threads >= 1, f"threads {cfg.threads} must be at least 1")
    need(cfg.data is None or os.path.exists(cfg.data), f"data path {cfg.data!r} does not exist; valid: a text file, a folder of text files, or an llm.c .bin shard")
    try:
        resolve_variant(cfg.variant, {k: getattr(cfg, k) for k in AXES}, strict=strict)
    except VariantError as e:
        raise ConfigError(str(e)) from None


def resolve(options: Mapping[str, Any], strict: bool = True) -> TrainConfig:
    """Validate a flat mapping of option names to values (strings allowed) into a config.

    The options describe one run, so by default a variant axis given but ignored by the
    block is refused (`strict`, see resolve_variant); a grid resolves its crossings with
    strict=False, where such an axis collapses the crossing into one cell instead."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; valid: {', '.join(OPTION_NAMES)}")
    cfg = TrainConfig(**{k: coerce_option(k, v) for k, v in options.items()})
    _check(cfg, strict)
    return cfg


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _is_default(cfg: TrainConfig, key: str) -> bool:
    """Whether option `key` has the value it would have had if left out: the size's
    context and depth for seq_len and layers, the TrainConfig default for the rest."""
    value = getattr(cfg, key)
    if key == "seq_len":
        return value is None or value == get_size(cfg.model).context
    if key == "layers":
        return value is None or value == get_size(cfg.model).n_layer
    return value == TrainConfig.__dataclass_fields__[key].default


def group_id(cfg: TrainConfig, id_keys: tuple[str, ...] | list[str] = (), keep_defaults: bool = False) -> str:
    """The cell id without its seed: the runs that statistics pool across seeds.

    An id key whose value is the one it would have had anyway is left out, so that
    `--seq-len 64` on tiny (context 64) names the same run as leaving it out and finds it
    finished. A grid passes keep_defaults: its cells are named by every option that varies
    across them, default value or not (`..__warmup=0__..` next to `..__warmup=100__..`).
    """
    parts = [cfg.spec.id]
    for key in sorted(set(id_keys) - set(AXES) - {"seed", "variant"}):
        if keep_defaults or not _is_default(cfg, key):
            parts.append(f"{key}={_fmt(getattr(cfg, key))}")
    return "__".join(parts)


def cell_id(cfg: TrainConfig, id_keys: tuple[str, ...] | list[str] = (), keep_defaults: bool = False) -> str:
    return f"{group_id(cfg, id_keys, keep_defaults)}__seed={cfg.seed}"
