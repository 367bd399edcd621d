"""Per-layer training metrics, computed on the device with fused foreach ops and brought
to the host in one copy per logged step.

Parameters are bucketed once at start-up: embeddings (token and position), and for each
block its attention, MLP and norm parameters. Gradient norms per bucket come from one
`_foreach_norm` over all gradients and one `index_add_`; update ratios from one foreach
copy before the optimizer step and one foreach subtraction after it.

The stability probes (attention logits, output logits, rank collapse; see `Stability`) look
at a few sequences of the batch on the steps the training loop asks for, and join the same
single copy.

Each probe is a function registered below with `@probe(COS_SIM)` (the probe declared under
that name in ablate/core/probe_registry.py): it takes the step's shared measurements (a namespace of device
tensors) and returns its values as one tensor; `measured` joins them with one `torch.cat`.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ablate.core import probe_registry as pr  # the declared probes: pr.COS_SIM, ...
from ablate.core.probe_registry import FUNCTIONS, KINDS, Probe, check_attached, probe, probes
from ablate.core.rundir import finite_or_none
from ablate.engine.model import GPT

# Sequences of the batch the stability probes look at: enough positions for a stable mean, few
# enough that their cost stays a small fraction of the batch's (and their T x T scores small).
PROBE_SEQUENCES = 2
# The attention probes form the T x T scores of several layers at once (fewer ops), at most this
# many floats (256 MiB) at a time: all 12 layers of `tiny`, one layer at a time at context 1024.
SCORES_PER_CHUNK = 2**26


def _bucket(name: str) -> tuple[int, str] | None:
    """(layer, kind) for a block parameter, (-1, 'embed') for embeddings, None otherwise."""
    if name.startswith(("wte.", "wpe.")):
        return -1, "embed"
    if name.startswith("blocks."):
        layer, sub = name.split(".")[1:3]
        return int(layer), sub if sub in ("attn", "mlp") else "norm"
    return None  # the final norm: counted in the total only


class Probes:
    def __init__(self, model: GPT, compiled: bool = False, autocast: tuple[str, torch.dtype | None] = ("cpu", None)):
        """`compiled`: the training forward is torch.compile'd (see `Stability`); `autocast`:
        the (device type, dtype) it runs under."""
        self.stability = Stability(model, compiled, autocast)
        self.n_layer = len(model.blocks)
        self.params = [p for p in model.parameters() if p.requires_grad]
        names = {id(p): n for n, p in model.named_parameters()}
        # Bucket index per parameter: 0 = embed, 1 + 3*layer + kind, last = unbucketed.
        n_buckets = 2 + 3 * self.n_layer
        index = []
        for p in self.params:
            b = _bucket(names[id(p)])
            if b is None:
                index.append(n_buckets - 1)
            elif b[1] == "embed":
                index.append(0)
            else:
                index.append(1 + 3 * b[0] + KINDS.index(b[1]))
        device = self.params[0].device
        self.bucket = torch.tensor(index, device=device)
        self.n_buckets = n_buckets
        # Update ratios: the block parameters and their layer, copied before each step.
        self.block_params = [p for p, i in zip(self.params, index) if 0 < i < n_buckets - 1]
        self.block_layer = torch.tensor([(i - 1) // 3 for i in index if 0 < i < n_buckets - 1], device=device)
        self._before: list[torch.Tensor] | None = None
        self._weight_sq: torch.Tensor | None = None
        self._copied = False  # before_step ran for the step being collected
        self.norms: list[torch.Tensor] | None = None  # grad_norms()'s per-parameter norms, last call
        # Whether those are the norms torch's clip_grad_norm_ would compute (one group: it
        # groups gradients by device and dtype, then takes one _foreach_norm per group).
        self.norms_clip = len({(p.device, p.dtype) for p in self.params}) == 1 and \
            len(self.params) == len(list(model.parameters()))
        self.names = metric_names("logged", self.n_layer)
        self.update_names = metric_names("update", self.n_layer)

    @torch.no_grad()
    def grad_norms(self) -> SimpleNamespace:
        """The gradients' squared norms (one `_foreach_norm`), per parameter (`grad_sq`), per
        bucket (`bucket_sq`) and per block and kind (`kinds_sq`, layers x KINDS): the logged
        probes' inputs, taken before clipping changes the gradients."""
        grads = [p.grad for p in self.params]
        self.norms = torch._foreach_norm(grads)
        sq = torch.stack(self.norms).float().square()
        per_bucket = torch.zeros(self.n_buckets, device=sq.device).index_add_(0, self.bucket, sq)
        return SimpleNamespace(grad_sq=sq, bucket_sq=per_bucket, kinds_sq=per_bucket[1:-1].view(self.n_layer, 3))

    @torch.no_grad()
    def before_step(self) -> None:
        """Remember the block weights (and their norms) before the optimizer moves them."""
        if self._before is None:
            self._before = [torch.empty_like(p) for p in self.block_params]
        torch._foreach_copy_(self._before, self.block_params)
        self._weight_sq = torch.stack(torch._foreach_norm(self._before)).float().square()
        self._copied = True

    @torch.no_grad()
    def update_inputs(self) -> SimpleNamespace:
        """The update probes' inputs: each block weight's squared update (`update_sq`) and squared
        norm before it (`weight_sq`), with its layer (`block_layer`)."""
        torch._foreach_sub_(self._before, self.block_params)  # in place: the buffer now holds -update
        d2 = torch.stack(torch._foreach_norm(self._before)).float().square()
        return SimpleNamespace(update_sq=d2, weight_sq=self._weight_sq, block_layer=self.block_layer,
                               n_layer=self.n_layer)

    def collect(self, loss: torch.Tensor, grad_norms: SimpleNamespace, act_norms: list[torch.Tensor],
                stream_elements: int, stability: torch.Tensor | None = None) -> tuple[float, dict]:
        """One device-to-host copy for everything logged this step. `act_norms` are the L2
        norms of the residual stream after each block; over `stream_elements` they are RMS.
        `stability`: this step's `Stability.measure`, on the steps that probe it. Update ratios
        come on the steps whose weights before_step copied (the probe steps: the copy of every
        block weight is the per-layer metrics' largest cost)."""
        logged = SimpleNamespace(**vars(grad_norms), act_rms=torch.stack(act_norms).float() * stream_elements**-0.5)
        parts = [loss.detach().float().view(1), *measured("logged", logged)]
        names = self.names
        if self._copied:
            parts.extend(measured("update", self.update_inputs()))
            names = names + self.update_names
            self._copied = False
        if stability is not None:
            parts.append(stability)
            names = names + self.stability.names
        values = torch.cat(parts).tolist()
        metrics = {name: finite_or_none(v) for name, v in zip(names, values[1:])}
        return values[0], metrics


class Stability:
    """The probes of the stability literature, on the first PROBE_SEQUENCES sequences of a
    batch: per block the largest attention logit and the mean attention entropy (Wortsman et
    al. 2023: logit growth precedes divergence), the mean pairwise cosine similarity of the
    residual stream's token vectors (Dong et al. 2021, Noci et al. 2022: 1.0 is rank collapse),
    and the output logits' mean log-partition and largest value.

    Where the inputs come from, by cost: forward hooks copy the slice of each block's
    query-key-value projection (`c_attn`'s output) and of its output as the training forward
    computes them (a small copy per hook; the hooks are attached only for the forwards the loop
    arms them for with `capture`, so other steps pay nothing, not even a hooked module call,
    and the whole batch's activations never outlive the backward), so a probed
    step adds only the slice's T x T scores, not a matmul: a separate no-grad forward of the
    slice alone measured about 7% of a step on `tiny` x 12 blocks (small models pay per op,
    and it repeats every op of the forward). Hooks inside a
    torch.compile'd forward would be traced into its graph (or, attached later, skipped), so
    there they are attached only around a no-grad eager forward of the slice, at the same
    weights and through the same kernel backend, and the compiled forward stays as it is. The
    output-logit probes read the training forward's own logits. Nothing here draws random
    numbers or writes to anything the training step reads."""

    def __init__(self, model: GPT, compiled: bool, autocast: tuple[str, torch.dtype | None]):
        self.model, self.compiled = model, compiled
        self.autocast = autocast
        n = len(model.blocks)
        self.qkv_out: list[torch.Tensor | None] = [None] * n  # each block's c_attn output
        self.stream_in: list[torch.Tensor | None] = [None]  # the first block's input (the embeddings)
        self.block_out: list[torch.Tensor | None] = [None] * n
        self._handles: list | None = None  # the capture hooks, while attached
        self.names = metric_names("stability", n)

    @property
    def capture(self) -> bool:
        """Set by the training loop before the forward of a step it will measure (the hooks are
        attached), and unset before the others (they are removed)."""
        return self._handles is not None

    @capture.setter
    def capture(self, on: bool) -> None:
        if on and self._handles is None:
            self._handles = self._attach()
        elif not on and self._handles is not None:
            for h in self._handles:
                h.remove()
            self._handles = None

    def _attach(self) -> list:
        def keep(store, i):
            def hook(module, inputs, output=None):
                if module.training:  # a probed step's forward, not validation
                    t = inputs[0] if output is None else output
                    store[i] = t[:PROBE_SEQUENCES].detach().clone()
            return hook

        handles = []
        for i, block in enumerate(self.model.blocks):
            handles.append(block.attn.c_attn.register_forward_hook(keep(self.qkv_out, i)))
            if i == 0:  # every later block's input is the block before's output, kept already
                handles.append(block.register_forward_pre_hook(keep(self.stream_in, 0)))
            handles.append(block.register_forward_hook(keep(self.block_out, i)))
        return handles

    def _autocast(self):
        device_type, dtype = self.autocast
        return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)

    @torch.no_grad()
    def _eager_forward(self, x: torch.Tensor) -> None:
        """Fill the captures with a forward of the slice (the compiled case), leaving the
        model's per-step records (act_norms) as the training forward left them."""
        model = self.model
        saved = model.record_act_norms, model.act_norms
        try:
            self.capture, model.record_act_norms = True, False
            with self._autocast():
                model(x[:PROBE_SEQUENCES])
        finally:
            self.capture = False
            model.record_act_norms, model.act_norms = saved

    @torch.no_grad()
    def measure(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The probes of the step whose training forward just ran on batch `x` and gave
        `logits`, as one device tensor in the order of `names`. Call it before the optimizer
        step: the attention logits are recomputed with the weights that forward used. Eager
        models need `capture` set before that forward; what it kept is used once."""
        if self.compiled:
            self._eager_forward(x)
        if any(h is None for h in self.qkv_out + self.stream_in + self.block_out):
            raise RuntimeError("Stability.measure: the training forward kept nothing to measure; "
                               "set capture = True before the forward of a probed step")
        with self._autocast():  # q and k as the training forward computed them
            qk = [block.attn.heads(h)[:2] for block, h in zip(self.model.blocks, self.qkv_out)]
        n, heads, T, _ = qk[0][0].shape
        chunk = max(1, SCORES_PER_CHUNK // (n * heads * T * T))  # layers whose scores are formed at once
        stats = [attention_logit_stats(torch.stack([q for q, _ in qk[i:i + chunk]]),
                                       torch.stack([k for _, k in qk[i:i + chunk]])) for i in range(0, len(qk), chunk)]
        inputs = SimpleNamespace(logit_max=torch.cat([m for m, _ in stats]), entropy=torch.cat([e for _, e in stats]),
                                 logits=logits[:PROBE_SEQUENCES].detach().float(), block_out=torch.stack(self.block_out),
                                 stream_in=torch.stack(self.stream_in + self.block_out[:-1]))
        for kept in (self.qkv_out, self.stream_in, self.block_out):  # in place: the hooks hold these lists
            kept[:] = [None] * len(kept)  # used once: an unarmed later step cannot measure this one's
        return torch.cat(measured("stability", inputs))


def attention_logit_stats(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(largest q.k/sqrt(d_head), mean attention entropy in nats) under the causal mask, per
    layer, for queries and keys of shape (layers, ..., T, d_head): the max over every head and
    allowed (query, key) pair, the entropy averaged over every head and query position. All
    layers at once: on small models the probes' cost is per op, not per element."""
    layers, (T, d) = q.shape[0], q.shape[-2:]
    q, k = q.float().reshape(-1, T, d), k.float().reshape(-1, T, d)
    future = torch.full((T, T), float("-inf"), device=q.device).triu(1)
    masked = torch.baddbmm(future, q, k.transpose(1, 2), alpha=d**-0.5)  # scale, product and mask in one op
    p = masked.softmax(dim=-1)
    row_max = masked.amax(-1)
    # Entropy = log Z - sum_j p_j s_j, with log Z = s_j - log p_j read at the likeliest key
    # (p_j >= 1/T there, so its log is safe): one log per query instead of per (query, key).
    # sum_j p_j s_j = q . (sum_j p_j k_j) / sqrt(d): T x d products instead of T x T, and the
    # future keys, whose p_j is 0, add nothing (no 0 * -inf).
    log_z = row_max - p.amax(-1).log()
    entropy = log_z - (torch.bmm(p, k) * q).sum(-1) * d**-0.5
    return row_max.view(layers, -1).amax(-1), entropy.view(layers, -1).mean(-1)


def mean_cosine_similarity(h: torch.Tensor) -> torch.Tensor:
    """Mean over the pairs i != j of token vectors of cos(h_i, h_j) within each sequence,
    averaged over sequences: h is (..., sequences, T, d), the result (...). For unit vectors
    u, sum_ij u_i.u_j = |sum_i u_i|^2, so it costs O(T d), not O(T^2 d)."""
    u = F.normalize(h.float(), dim=-1)
    T = u.shape[-2]
    all_pairs = torch.linalg.vector_norm(u.sum(-2), dim=-1).square()
    same = torch.linalg.vector_norm(u, dim=(-2, -1)).square()  # the i = j terms: T (fewer for zero vectors)
    return ((all_pairs - same) / (T * (T - 1))).mean(-1)


def relative_change(x_in: torch.Tensor, x_out: torch.Tensor) -> torch.Tensor:
    """RMS(out - in) / RMS(in) per layer, for (layers, ...) stacks: how far a block moves the
    residual stream (near 0: the block is close to the identity, as residual blocks are at init)."""
    x_in, x_out = x_in.float().flatten(1), x_out.float().flatten(1)
    return torch.linalg.vector_norm(x_out - x_in, dim=1) / torch.linalg.vector_norm(x_in, dim=1)


def output_log_partition(logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of log Z = logsumexp of the output logits (z-loss's quantity)."""
    return torch.logsumexp(logits.float(), dim=-1).mean()



def metric_names(when: str, n_layer: int) -> list[str]:
    """The names of the values `measured(when, ...)` returns, in their order."""
    return [name for p in probes(when) for name in p.metric_names(n_layer)]


def measured(when: str, inputs: SimpleNamespace) -> list[torch.Tensor]:
    """Every `when` probe's values, in declaration order: the caller joins them in one cat."""
    return [_checked(p, FUNCTIONS[p.key](inputs)) for p in probes(when)]


def _checked(p: Probe, values: torch.Tensor) -> torch.Tensor:
    if values.dim() != 1:  # a 0-d value would be joined as nothing: its name would take the next one's
        raise ValueError(f"probe {p.key!r} returned shape {tuple(values.shape)}; valid: one dimension")
    return values


# ------------------------------------------------------------------------------ the probes
# Each takes the namespace its `when` passes (see probe_registry.WHEN): `logged` has grad_sq,
# bucket_sq, kinds_sq (Probes.grad_norms) and act_rms; `update` has Probes.update_inputs;
# `stability` has Stability.measure's logit_max, entropy, logits, block_out and stream_in.

@probe(pr.GRAD_NORM)
def grad_norm_total(s) -> torch.Tensor:
    return s.grad_sq.sum().view(1).sqrt()


@probe(pr.GRAD_NORM_EMBED)
def grad_norm_embed(s) -> torch.Tensor:
    return s.bucket_sq[:1].sqrt()


@probe(pr.GRAD_NORM_LAYERS)
def grad_norm_per_layer(s) -> torch.Tensor:
    return s.kinds_sq.sum(1).sqrt()


@probe(pr.GRAD_NORM_KINDS)
def grad_norm_per_kind(s) -> torch.Tensor:
    return s.kinds_sq.flatten().sqrt()


@probe(pr.ACT_NORM)
def act_norm(s) -> torch.Tensor:
    return s.act_rms


@probe(pr.UPDATE_RATIO)
def update_ratio(s) -> torch.Tensor:
    zeros = torch.zeros(s.n_layer, device=s.update_sq.device)
    return (zeros.index_add(0, s.block_layer, s.update_sq) / zeros.index_add(0, s.block_layer, s.weight_sq)).sqrt()


@probe(pr.ATTN_LOGIT_MAX)
def attn_logit_max(s) -> torch.Tensor:
    return s.logit_max


@probe(pr.ATTN_ENTROPY)
def attn_entropy(s) -> torch.Tensor:
    return s.entropy


@probe(pr.COS_SIM)
def cos_sim(s) -> torch.Tensor:
    return mean_cosine_similarity(s.block_out)


@probe(pr.BLOCK_CHANGE)
def block_change(s) -> torch.Tensor:
    return relative_change(s.stream_in, s.block_out)


@probe(pr.LOGIT_LSE)
def logit_lse(s) -> torch.Tensor:
    return output_log_partition(s.logits).view(1)


@probe(pr.LOGIT_MAX)
def logit_max(s) -> torch.Tensor:
    return s.logits.amax().view(1)


check_attached()
