"""The probes a run logs, registered by name: what each is called, whether it has a value per
layer, on which steps it is measured, and the heatmap the report draws of it (if any).

A probe is declared here once (`declare`, which returns it, kept under a constant such as
`COS_SIM`), and its function is attached in ablate/engine/probes.py with `@probe(COS_SIM)`: it receives the step's measurements (`ProbeInputs` there) and returns one
device tensor of its values, one a layer (per part) when `per_layer`. The training loop joins
every probe's tensor in one `torch.cat` and one copy to the host, in declaration order, and names the values from the registration, so a name and its value cannot drift apart.

The declarations (`PROBES`) are standard library only, so analysis/ reads them (which per-layer
probes get a heatmap) without importing torch; ablate/engine/probes.py attaches the functions
(`probe`), and a probe declared without one, or a function for an undeclared name, is refused
when it is imported (`check_attached`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ablate.core.registry import Registry

# When a probe is measured: every logged step; the steps whose weights were copied before the
# optimizer step (update ratios); the stability steps (every probe_every-th).
WHEN = ("logged", "update", "stability")
KINDS = ("attn", "mlp", "norm")  # a block's parameter groups, each with its gradient norm


@dataclass(frozen=True)
class Heatmap:
    """How the report's per-layer heatmaps draw a probe (analysis/plots.py)."""

    title: str
    label: str  # the colour bar's
    log: bool  # a log colour scale


@dataclass(frozen=True)
class Probe:
    name: str
    per_layer: bool  # values `name/layer_{i}` (`name/layer_{i}/{part}` with parts), else one `name`
    when: str
    parts: tuple[str, ...] = ()
    heatmap: Heatmap | None = None
    doc: str = ""

    @property
    def key(self) -> str:
        """The registry's key: the metric names' pattern (`grad_norm` and `grad_norm/layer_*` are two probes)."""
        if not self.per_layer:
            return self.name
        return f"{self.name}/layer_*" + (f"/{{{','.join(self.parts)}}}" if self.parts else "")

    def metric_names(self, n_layer: int) -> list[str]:
        if not self.per_layer:
            return [self.name]
        return [f"{self.name}/layer_{i}" + (f"/{p}" if p else "") for i in range(n_layer) for p in self.parts or ("",)]


def layer_keys(names: Iterable, metric: str) -> list[str]:
    """The names among `names` (a metrics row's keys, a frame's columns) that are a per-layer
    probe's whole-layer values, `metric/layer_{i}` without a part, in layer order."""
    pattern = re.compile(rf"^{re.escape(metric)}/layer_(\d+)$")
    found = [(int(m.group(1)), str(n)) for n in names if (m := pattern.match(str(n)))]
    return [n for _, n in sorted(found)]


PROBES: Registry[Probe] = Registry("probe")
FUNCTIONS: dict[str, Callable[[Any], Any]] = {}  # probe key -> its function (ablate/engine/probes.py)


def declare(name: str, *, per_layer: bool, when: str = "logged", parts: tuple[str, ...] = (),
            heatmap: Heatmap | None = None, doc: str = "") -> Probe:
    """Declare probe `name` (its values come in declaration order); a key taken twice is refused."""
    if when not in WHEN:
        raise ValueError(f"probe {name!r}: when={when!r}; valid: {', '.join(WHEN)}")
    declared = Probe(name, per_layer, when, tuple(parts), heatmap, doc)
    PROBES.register(declared.key, declared, origin="ablate.core.probe_registry")
    return declared


def probe(declared: Probe):
    """Attach the decorated function to a probe `declare` returned: one not declared (or declared
    otherwise) or attached twice is refused."""
    key = declared.key
    if PROBES.get(key) != declared:  # PROBES.get refuses an undeclared key, naming the declared ones
        raise PROBES.error(f"probe {key!r} is declared otherwise: {PROBES.get(key)}")

    def attach(fn: Callable) -> Callable:
        if key in FUNCTIONS:
            raise PROBES.error(f"probe {key!r} has two functions ({FUNCTIONS[key].__qualname__}, {fn.__qualname__})")
        FUNCTIONS[key] = fn
        return fn
    return attach


def check_attached() -> None:
    """Every declared probe has its function (ablate/engine/probes.py calls this once they are defined)."""
    missing = [key for key in PROBES if key not in FUNCTIONS]
    if missing:
        raise PROBES.error(f"probes declared without a function: {', '.join(missing)}")


def probes(when: str) -> list[Probe]:
    """The probes measured on `when` steps, in declaration order (the order of their values)."""
    return [p for p in PROBES.values() if p.when == when]


def layer_heatmaps() -> dict[str, Heatmap]:
    """Per-layer probe name -> its heatmap, for the probes that declare one."""
    return {p.name: p.heatmap for p in PROBES.values() if p.per_layer and p.heatmap is not None and not p.parts}


# The probes, in the order their values are logged. Gradient norms are taken before clipping;
# activation norms are RMS of the residual stream after each block.
GRAD_NORM = declare("grad_norm", per_layer=False, doc="L2 norm of every gradient")
GRAD_NORM_EMBED = declare("grad_norm/embed", per_layer=False,
                          doc="L2 norm of the token and position embeddings' gradients")
GRAD_NORM_LAYERS = declare("grad_norm", per_layer=True, doc="L2 norm of each block's gradients",
                           heatmap=Heatmap("gradient norm", "gradient norm (L2)", True))
GRAD_NORM_KINDS = declare("grad_norm", per_layer=True, parts=KINDS,
                          doc="L2 norm of each block's attention, MLP and norm gradients")
ACT_NORM = declare("act_norm", per_layer=True, doc="RMS of the residual stream after each block")
UPDATE_RATIO = declare("update_ratio", per_layer=True, when="update", doc="|update| / |weights before it|, per block")
ATTN_LOGIT_MAX = declare("attn_logit_max", per_layer=True, when="stability",
                         doc="largest q.k/sqrt(d_head) under the causal mask",
                         heatmap=Heatmap("attention logit max", "max q.k/sqrt(d_head)", False))
ATTN_ENTROPY = declare("attn_entropy", per_layer=True, when="stability", doc="mean attention entropy (nats)")
COS_SIM = declare("cos_sim", per_layer=True, when="stability",
                  doc="mean pairwise cosine of the token vectors (1 = rank collapse)",
                  heatmap=Heatmap("token cosine similarity", "mean pairwise cosine (1 = rank collapse)", False))
BLOCK_CHANGE = declare("block_change", per_layer=True, when="stability", doc="RMS(block output - input) / RMS(input)")
LOGIT_LSE = declare("logit_lse", per_layer=False, when="stability", doc="mean log-partition of the output logits")
LOGIT_MAX = declare("logit_max", per_layer=False, when="stability", doc="largest output logit")
