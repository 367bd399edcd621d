"""Every option a run takes, declared once: name, type, default, help, valid values, and its
role. The command line's flags, `--set`, config and grid files, the cell id, the check that
refuses a run directory holding other settings, and config.json's `identity_keys` (which
analysis reads as "the same settings") all derive from the declarations in `TrainConfig`.

Options a registered component reads (an optimizer's beta1, a schedule's decay_fraction) are
declared by the component itself, at registration (ablate/core/registry.py `ComponentOption`): the
schema adds them after the option that picks the component, with the flag, the validation and
"applies to" derived from the declarations, so a plugin optimizer's options work like the
built-ins' without touching the engine. Likewise one option per variant axis follows `variant`,
from the axes' declarations (ablate/core/variant_axes.py).

Roles:
  experiment   defines the run: changes its numbers. Named in the cell id when given (or when it
               varies in a grid), compared before a run directory is reused, and listed in
               config.json `identity_keys`, so analysis pairs only cells equal in all of them.
  observation  changes what is logged, not the numbers (log_every, probes, ...): compared before
               a run directory is reused (its metrics must stay uniform), never in an id.
  execution    how a run executes (threads, device, kernels, compile, flush_denormal,
               checkpointing): never in an id; device, kernels and compile are compared as resolved
               because they change the last bits, threads and flush_denormal have their own rule
               (ablate.engine.train: a run keeps what it started with), checkpoint_every none.

A cell id is the variant id plus the experiment options that vary in its grid (or that an
`ablate train` was given away from their defaults) plus the seed, e.g.
`post.layernorm.gelu.dense.res__lr=0.003__seed=1`.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Callable, Mapping

from ablate.core.checks import (above_one as _above_one, at_least as _at_least, non_negative as _non_negative,
                                positive as _positive, unit as _unit, within as _within)
from ablate.core.errors import ConfigError
from ablate.core.registry import ComponentOption, Registry
from ablate.core.variant_axes import AXES, DECLARED_AXES
from ablate.engine.sizes import ModelSize, SIZES, get_size
from ablate.kernels import BACKENDS as KERNEL_BACKENDS, kernel_choices
from ablate.variants import INITS, OPTIMIZERS, SCHEDULES, VariantError, VariantSpec, make_variant
from ablate.variants.inits import default_init
from ablate.variants.spec import axis_values, parse_variant_given

EXPERIMENT, OBSERVATION, EXECUTION = "experiment", "observation", "execution"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")
MAX_SEED = 2**63 - 1  # torch.manual_seed and numpy's generators take 64-bit seeds
MAX_TOKENS_PER_STEP = 2**24  # far beyond one device's step; a larger batch is a typo, not a plan
# The ceilings of the other counts, as far beyond a real run (refused before anything is built):
MAX_STEPS = 10**7  # steps, and every interval counted in steps
MAX_LAYERS, MAX_WIDTH = 1024, 1 << 16
MAX_BATCHES, MAX_THREADS = 100_000, 1024  # evaluation batches; CPU threads


@dataclass(frozen=True)
class Option:
    """One option's declaration (see the module docstring for the roles)."""

    name: str
    kind: type  # int, float, str or bool
    optional: bool  # None is a value ("not set": the size's context, the placement's init, ...)
    default: Any
    help: str
    role: str
    choices: Callable[[], list[str]] | None  # the valid values, from a registry where there is one
    check: Callable[[Any], str | None] | None  # a range check: an error (what is valid) or None
    applies: tuple[str, tuple[str, ...]] | None  # (option, values) this one is specific to
    in_id: bool  # an experiment option that names the run directory when given

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _opt(default, help: str, role: str = EXPERIMENT, choices=None, check=None, in_id=True, components=None):
    """An option's declaration. `components`: the registry whose names it takes (an optimizer):
    its valid values, and the components' own options join the schema after it."""
    if components is not None:
        choices = components.names
    return field(default=default, metadata={"help": help, "role": role, "choices": choices, "check": check,
                                            "in_id": in_id, "components": components})


# Range checks (ablate/core/checks.py holds those a component may declare too).
def _seed(v):
    return None if 0 <= v <= MAX_SEED else f"must be in 0..{MAX_SEED} (2^63 - 1)"


@dataclass(frozen=True)
class TrainConfig:
    # -- the block: a preset, id or axis=value list, and per-axis overrides of it
    # (after it in the schema: an option per variant axis, declared in ablate/core/variant_axes.py)
    variant: str = _opt("gpt2", "preset, id or axis=value,... (see `ablate variants`)")
    # -- the model
    model: str = _opt("tiny", "size: " + ", ".join(SIZES), choices=lambda: list(SIZES))
    layers: int | None = _opt(None, "number of blocks (default: the size's)", check=_within(1, MAX_LAYERS))
    width: int | None = _opt(None, "d_model (default: the size's); heads grow with it at the size's head dimension",
                             check=_within(1, MAX_WIDTH))
    mlp_ratio: float = _opt(4.0, "dense MLP width / d_model (gated MLPs: 2/3 of it, parameter-matched)",
                            check=_positive)
    init: str | None = _opt(None, "weight init (default: the placement's own, gpt2 but deepnet for deepnorm)",
                            components=INITS)
    # -- the optimizer (and, after it in the schema, the options the optimizers declare: beta1, ...)
    optimizer: str = _opt("adamw", "optimizer", components=OPTIMIZERS)
    lr: float = _opt(1e-3, "peak learning rate", check=_positive)
    weight_decay: float = _opt(0.1, "weight decay on matrices", check=_non_negative)
    grad_clip: float = _opt(0.0, "clip the gradient norm (0 = off)", check=_non_negative)
    z_loss: float = _opt(0.0, "coefficient of mean(logsumexp(logits)^2) added to the loss (PaLM: 1e-4)",
                         check=_non_negative)
    # -- the schedule
    steps: int = _opt(300, "training steps", check=_within(1, MAX_STEPS))
    warmup: int = _opt(0, "linear warmup steps", check=_within(0, MAX_STEPS))
    schedule: str = _opt("cosine", "after warmup: constant, cosine or wsd", components=SCHEDULES)
    min_lr_ratio: float = _opt(0.1, "final lr / peak lr (cosine, wsd)", check=_unit)
    # -- the data and the batches
    seed: int = _opt(0, "initial weights and batch order", check=_seed)
    data: str | None = _opt(None, "text file, folder of text files, or llm.c .bin shard(s); default: the stdlib's sources",
                            in_id=False)
    batch_size: int = _opt(16, "sequences per step", check=_at_least(1))
    seq_len: int | None = _opt(None, "context length (default: the size's)", check=_at_least(1))
    dtype: str = _opt("auto", "auto (bf16 autocast on GPUs, float32 on the CPU), float32, bfloat16",
                      choices=lambda: list(DTYPES), in_id=False)
    diverge_factor: float = _opt(2.0, "diverged when loss > factor x first loss (or non-finite)", check=_above_one)
    stop_dead: int = _opt(0, "stop a run once it has been dead (on the plateau, first block's gradient 6 decades "
                             "under the top's: ablate/core/collapse.py) for N steps (0 = never)",
                          check=_within(0, MAX_STEPS))
    eval_batches: int = _opt(8, "validation batches at each evaluation", check=_within(1, MAX_BATCHES),
                             in_id=False)
    final_eval_batches: int = _opt(32, "validation batches of the final evaluation (summary's final_val_loss)",
                                   check=_within(1, MAX_BATCHES), in_id=False)
    # -- what is logged
    eval_every: int = _opt(50, "evaluate every N steps", OBSERVATION, check=_within(1, MAX_STEPS))
    log_every: int = _opt(1, "log metrics every N steps", OBSERVATION, check=_within(1, MAX_STEPS))
    probes: bool = _opt(True, "log per-layer metrics (true/false)", OBSERVATION)
    probe_every: int = _opt(10, "stability probes (attention logits, output logits, rank collapse) every N steps",
                            OBSERVATION, check=_within(1, MAX_STEPS))
    # -- how it executes
    kernels: str = _opt("auto", "kernel backend: " + ", ".join((*KERNEL_BACKENDS, "auto")), EXECUTION,
                        choices=kernel_choices)
    device: str = _opt("auto", "auto, cpu or cuda", EXECUTION, choices=lambda: list(DEVICES))
    threads: int | None = _opt(None, "CPU threads (default: torch's)", EXECUTION, check=_within(1, MAX_THREADS))
    compile: bool = _opt(False, "torch.compile the model", EXECUTION)
    flush_denormal: bool = _opt(True, "flush subnormal floats (below ~1.2e-38) to zero on the CPU, as GPUs' fast "
                                      "paths do (unstable cells run up to 4x faster); a run keeps the value it "
                                      "started with (one without it recorded: false)", EXECUTION)
    checkpoint_every: int = _opt(100, "checkpoint every N steps", EXECUTION, check=_within(1, MAX_STEPS))
    # -- the options declared elsewhere (the variant axes, the components' own: beta1, a plugin's):
    # (name, value) for each given away from its default. Read as attributes (cfg.norm, cfg.beta1),
    # listed by as_dict with the rest.
    extra_options: tuple = field(default=(), metadata={"extra_options": True})

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name that is not a field: an option declared elsewhere, or nothing.
        settings = vars(self).get("extra_options")
        if settings is None or name.startswith("__") or name not in OPTIONS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return dict(settings).get(name, OPTIONS[name].default)

    @cached_property
    def spec(self) -> VariantSpec:
        return resolve_variant(self.variant, {k: getattr(self, k) for k in AXES})

    @cached_property
    def size(self) -> ModelSize:
        return get_size(self.model).with_layers(self.layers).with_width(self.width).with_mlp_ratio(self.mlp_ratio)

    @property
    def context(self) -> int:
        return self.seq_len or self.size.context

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (to a worker, a Ray task, a SLURM job) as its fields only: the cached spec and
        # size may hold a plugin's classes, which the receiving process imports only later
        # (ablate.engine.cell.run_cell loads the cell's plugins first), and are rebuilt there on use.
        return {f: vars(self)[f] for f in _FIELDS}

    @property
    def init_name(self) -> str:
        """The init the model is built with (the placement's own unless one is named)."""
        return self.init or default_init(self.spec)

    def as_dict(self) -> dict[str, Any]:
        """Every option's value (the components' options too), as config.json records them."""
        return {name: getattr(self, name) for name in OPTIONS}


def _declare() -> dict[str, Option]:
    """The options TrainConfig declares itself, in its order."""
    out = {}
    for f in fields(TrainConfig):
        m = f.metadata
        if m.get("extra_options"):
            continue
        kind_text = str(f.type)
        kind = next(t for name, t in (("bool", bool), ("int", int), ("float", float), ("str", str)) if kind_text.startswith(name))
        out[f.name] = Option(f.name, kind, "None" in kind_text, f.default, m["help"], m["role"], m["choices"],
                             m["check"], None, m["in_id"])
    return out


_OWN_OPTIONS = _declare()
# option -> the registry of the components it picks (optimizer -> OPTIMIZERS), whose options follow it
_COMPONENT_REGISTRIES = {f.name: f.metadata["components"] for f in fields(TrainConfig)
                         if f.metadata.get("components") is not None}


def _fmt_default(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _component_option(owner: str, name: str, declared: list[tuple[str, ComponentOption]]) -> Option:
    """One option declared by one or more components of `registry` (beta1: adamw, adam, muon).
    Declared with one default, that is the option's; with several, the option's default is
    None, "each component's own", which `Registry.settings` fills in."""
    first = declared[0][1]
    defaults = {repr(o.default) for _, o in declared}
    if len(defaults) == 1:
        default, help_text = first.default, first.help
    else:
        default = None
        help_text = f"{first.help} (default " + ", ".join(
            f"{_fmt_default(o.default)} for {component}" for component, o in declared) + ")"
    return Option(name, first.kind, default is None, default, help_text, EXPERIMENT, None, first.check,
                  (owner, tuple(component for component, _ in declared)), True)


def _axis_option(axis) -> Option:
    """A per-axis override of `variant`; checked by the variant rules (which know residual's spellings)."""
    choices = None if axis.kind is bool else (lambda: axis_values(axis))
    return Option(axis.name, axis.kind, True, None, axis.help, EXPERIMENT, choices, None, None, True)


def _build_schema() -> dict[str, Option]:
    out: dict[str, Option] = {}
    for name, option in _OWN_OPTIONS.items():
        out[name] = option
        if name == "variant":
            out.update((axis.name, _axis_option(axis)) for axis in DECLARED_AXES)
        registry = _COMPONENT_REGISTRIES.get(name)
        for option_name, declared in (registry.declared_options().items() if registry else ()):
            if option_name in _OWN_OPTIONS or option_name in out or option_name in AXES:
                taken = "the engine's own" if option_name in _OWN_OPTIONS else f"{out[option_name].applies[0]}'s too"
                raise ConfigError(f"{registry.axis} {declared[0][0]!r} declares option {option_name!r}, which is "
                                  f"{taken}; valid: another name for it")
            out[option_name] = _component_option(name, option_name, declared)
    return out


class _Schema(Mapping):
    """OPTIONS: name -> Option, the declared options and the components' own. Follows the
    registries, so that a plugin imported after this module (`--import`, a grid's imports, a
    worker loading a cell's plugins) adds its components' options everywhere they are read."""

    def __init__(self):
        self._cache: tuple[int, dict[str, Option]] = (-1, {})

    def _current(self) -> dict[str, Option]:
        changes = Registry.changes  # read first: a registration while building means build again next time
        if self._cache[0] != changes:
            self._cache = (changes, _build_schema())
        return self._cache[1]

    def __getitem__(self, name: str) -> Option:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


class _Names(Sequence):
    """A tuple of option names derived from OPTIONS, and kept derived as plugins register."""

    def __init__(self, keep: Callable[[str, Option], bool]):
        self._keep = keep
        self._cache: tuple[int, tuple[str, ...]] = (-1, ())

    def _names(self) -> tuple[str, ...]:
        changes = Registry.changes
        if self._cache[0] != changes:
            self._cache = (changes, tuple(n for n, o in OPTIONS.items() if self._keep(n, o)))
        return self._cache[1]

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __add__(self, other) -> tuple:
        return self._names() + tuple(other)

    def __radd__(self, other) -> tuple:
        return tuple(other) + self._names()

    def __eq__(self, other) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


OPTIONS: Mapping[str, Option] = _Schema()
OPTION_NAMES = _Names(lambda name, o: True)
# Derived from the roles, so they can never disagree:
IDENTITY_KEYS = _Names(lambda name, o: o.role == EXPERIMENT)  # config.json identity_keys
EXECUTION_KEYS = tuple(n for n, o in _OWN_OPTIONS.items() if o.role == EXECUTION)  # a component's are experiments
# Compared before a run directory is reused: everything but the execution options that leave the
# bits alone and those with a rule of their own in ablate.engine.train (threads and flush_denormal: a
# run keeps the value it started with, and asking for another one explicitly is refused).
NOT_COMPARED = ("threads", "flush_denormal", "checkpoint_every")
# Named in an `ablate train` cell id when given away from its default.
TRAIN_ID_OPTIONS = _Names(lambda n, o: o.role == EXPERIMENT and o.in_id and n not in AXES + ("variant", "seed"))


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
    """`value` (a string from the command line, or a TOML value) as option `key`'s type, with
    its range and valid values checked: ConfigError naming the value and what is valid."""
    o = OPTIONS[key]
    if value is None:
        if o.optional:
            return None
        raise ConfigError(f"{key} cannot be empty")
    # "none"/"null" mean "not set" for an optional option (`--seq-len none`: the size's
    # context), but for a variant axis "none" is a value (norm=none: no norms), so an axis
    # is left unset only by leaving it out.
    if o.optional and key not in AXES and isinstance(value, str) and value.strip().lower() in ("none", "null"):
        return None
    try:
        if o.kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            value = int(value) if not isinstance(value, str) else int(value.strip())
        elif o.kind is float:
            if isinstance(value, bool):
                raise ValueError
            value = float(value)
        elif o.kind is bool:
            if not isinstance(value, bool):
                text = str(value).strip().lower()
                if text not in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                    raise ValueError
                value = text in ("true", "1", "yes", "on")
        else:
            value = str(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} {value!r} is not a valid {o.kind.__name__}") from None
    if o.kind is float and not math.isfinite(value):  # config.json (JSON) cannot hold it; no option means it
        raise ConfigError(f"{key} {value} is not a finite number; valid: a finite number")
    if o.check is not None and (problem := o.check(value)):
        raise ConfigError(f"{key} {value!r} {problem}")
    # Variant axes are checked by the variant rules (which know residual's spellings, ...).
    if o.choices is not None and key not in AXES and value not in (valid := o.choices()):
        raise ConfigError(f"unknown {key} {value!r}; valid: {', '.join(valid)}")
    return value


def _check(cfg: TrainConfig, given: set[str], strict: bool) -> None:
    """The checks that need more than one option (single values were checked by coerce_option)."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    ctx = get_size(cfg.model).context
    cfg.size  # noqa: B018 -- the width must divide into the size's heads: refused here, not at model build
    need(cfg.seq_len is None or cfg.seq_len <= ctx, f"seq_len {cfg.seq_len} must be in 1..{ctx} for model {cfg.model}")
    tokens = cfg.batch_size * cfg.context
    need(tokens <= MAX_TOKENS_PER_STEP,
         f"batch_size {cfg.batch_size} x seq_len {cfg.context} = {tokens:,} tokens per step; valid: batch_size "
         f"1..{MAX_TOKENS_PER_STEP // cfg.context:,} at seq_len {cfg.context}")
    need(not cfg.stop_dead or cfg.probes, f"stop_dead {cfg.stop_dead} reads the per-layer gradient norms; valid: "
         "probes true, or stop_dead 0")
    need(cfg.data is None or os.path.exists(cfg.data), f"data path {cfg.data!r} does not exist; valid: a text file, a folder of text files, or an llm.c .bin shard")
    # An option specific to some optimizers or schedules, given for another, would be ignored.
    for key in sorted(given):
        applies = OPTIONS[key].applies
        if applies and getattr(cfg, key) is not None and getattr(cfg, applies[0]) not in applies[1]:
            owner, values = applies
            raise ConfigError(f"{key} does not apply to {owner}={getattr(cfg, owner)}; valid: leave {key} out, or "
                              f"{owner} {' / '.join(values)}")
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
    cfg = _config(**{k: coerce_option(k, v) for k, v in options.items()})
    _check(cfg, set(options), strict)
    return cfg


def _config(**values: Any) -> TrainConfig:
    """A TrainConfig from checked values: the options declared elsewhere go into its extra_options,
    those at their default left out, so that equal settings make equal configs."""
    own = {k: v for k, v in values.items() if k in _OWN_OPTIONS}
    extra = tuple(sorted((k, v) for k, v in values.items() if k not in own and v != OPTIONS[k].default))
    return TrainConfig(**own, extra_options=extra)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def is_default(cfg: TrainConfig, key: str) -> bool:
    """Whether option `key` has the value it would have had if left out: the size's context and
    depth for seq_len and layers, the placement's init for init, the declared default else."""
    value = getattr(cfg, key)
    if key == "seq_len":
        return value is None or value == get_size(cfg.model).context
    if key == "layers":
        return value is None or value == get_size(cfg.model).n_layer
    if key == "width":
        return value is None or value == get_size(cfg.model).d_model
    if key == "init":
        return value is None or value == default_init(cfg.spec)
    return value == OPTIONS[key].default


def group_id(cfg: TrainConfig, id_keys: tuple[str, ...] | list[str] = (), keep_defaults: bool = False) -> str:
    """The cell id without its seed: the runs that statistics pool across seeds.

    An id key whose value is the one it would have had anyway is left out, so that
    `--seq-len 64` on tiny (context 64) names the same run as leaving it out and finds it
    finished. A grid passes keep_defaults: its cells are named by every option that varies
    across them, default value or not (`..__warmup=0__..` next to `..__warmup=100__..`).
    """
    parts = [cfg.spec.id]
    for key in sorted(set(id_keys) - set(AXES) - {"seed", "variant"}):
        if keep_defaults or not is_default(cfg, key):
            parts.append(f"{key}={_fmt(getattr(cfg, key))}")
    return "__".join(parts)


def cell_id(cfg: TrainConfig, id_keys: tuple[str, ...] | list[str] = (), keep_defaults: bool = False) -> str:
    return seeded_id(group_id(cfg, id_keys, keep_defaults), cfg.seed)


def seeded_id(group: str, seed: int) -> str:
    """A cell's id: its group id (group_id) and its seed."""
    return f"{group}__seed={seed}"


_FIELDS = tuple(f.name for f in fields(TrainConfig))


def with_seed(cfg: TrainConfig, seed: int) -> TrainConfig:
    """`cfg` with another seed. The variant spec and model size (cached on the config) do not
    depend on the seed, so the copy keeps them instead of resolving them again."""
    if seed == cfg.seed:
        return cfg
    # A field-for-field copy (dataclasses.replace costs ~80 us on a config of this size).
    copy = object.__new__(type(cfg))
    state = vars(copy)
    state.update(vars(cfg))
    for cached in set(state) - set(_FIELDS) - {"spec", "size"}:  # any other cached value: recomputed
        del state[cached]
    state["seed"] = seed  # checked when it was read (coerce_option)
    return copy
