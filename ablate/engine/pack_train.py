"""Train a pack: cells that differ only in seed (and lr, warmup) as one model whose parameters
carry a leading member dimension (torch.func.vmap over ablate/engine/pack_optim.py's flat tensor).

Each member is what its cell is alone: built and resumed by ablate/engine/train.py's own code (its seed
fixes its weights, its (seed, step) its batches), its own rates, optimizer state, divergence stop,
probes, metrics rows, checkpoint and summary in its own run folder, in today's format. What
differs from a lone run is float32 reordering only: the batched matmuls, the per-parameter norms
(a norm per parameter over all members instead of one _foreach_norm) and the optimizer's arithmetic round differently, so
a member agrees with its lone run to about 1e-5 relative after 50 steps, not bit for bit (tested:
tests/ablate/engine/test_pack_train.py). A pack is bitwise repeatable itself.

The step reads nothing back to the host: losses, probes, evaluations and divergence stay on the
device, and the host reads them in one copy every READBACK_EVERY steps (and at evaluations,
checkpoints and the end), through `readback`, which counts its calls. Divergence is decided on the
device at the step it happens: a diverged member is frozen there (the optimizer leaves its weights
as they were), and its rows and summary say so when they are read back.
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.func import functional_call, vmap

from ablate.core.rundir import CHECKPOINT, COMPLETED, DIVERGED, METRICS, finite_or_none
from ablate.engine import fpmode
from ablate.engine.lr import lr_at
from ablate.engine.model import build_model
from ablate.engine.pack import MEMBER_OPTIONS, pack_key
from ablate.engine.pack_graphs import CapturedSteps, syncs_flagged
from ablate.engine.pack_optim import FlatParams, PackRefused, STACKED_OPTIMIZERS, StackedAdamW, member_state_dict
from ablate.engine.probes import PROBE_SEQUENCES, Probes, Stability, measured
from ablate.engine.train import (CPU_KERNELS, FINAL_LOSS_WINDOW, Interrupted, RunState, build_run, cpu_forms_for,
                                 finish_run, graceful_signals, open_metrics, resume_run, save_checkpoint, z_loss_term)

# N: the host reads a pack's losses, probes and divergence back every N steps (and at each
# evaluation, checkpoint and the last step). docs/performance.md states it.
READBACK_EVERY = 10
# Whether a pack on a CUDA device replays its steps captured in CUDA graphs (ablate/engine/pack_graphs.py).
# Off until the device check has compared a captured pack with an eager one (docs/performance.md).
CAPTURE_ON_CUDA = False
READBACKS = [0]  # host reads so far, in this process (tests count the step's syncs with it)
# On a CPU, vmap runs scaled_dot_product_attention member by member (torch has no batching rule
# for its CPU kernel) and warns once a process; the numbers are right, only not batched there.
warnings.filterwarnings("ignore", message=".*batching rule for aten::_scaled_dot_product", category=UserWarning)


def capture_enabled(device: torch.device) -> bool:
    """Whether a pack on `device` replays captured steps."""
    return device.type == "cuda" and CAPTURE_ON_CUDA


def readback(t: torch.Tensor) -> list:
    """The one place a pack copies device values to the host."""
    READBACKS[0] += 1
    return t.tolist()


def refusal(plans: list) -> str | None:
    """Why these planned cells cannot train as one pack (one line), or None."""
    lead = plans[0]
    checks = [
        (lead.ops.name != "reference", f"kernels {lead.ops.name!r} (a pack runs `reference`, under vmap)"),
        (lead.cfg.compile, "compile=true (a pack captures its step instead)"),
        (lead.cfg.optimizer not in STACKED_OPTIMIZERS,
         f"optimizer {lead.cfg.optimizer!r} (stacked: {', '.join(STACKED_OPTIMIZERS)})"),
    ]
    for p in plans[1:]:
        checks.append(((p.device, p.amp, p.threads, p.flush, p.ops.name) !=
                       (lead.device, lead.amp, lead.threads, lead.flush, lead.ops.name),
                       "members on different devices, precisions, threads or kernels"))
    return next((why for bad, why in checks if bad), None)


def train_pack(cells: list, plans: list) -> list[dict]:
    """Train (or resume) `cells` as one pack, each into its plan's run folder; their summaries.
    PackRefused (nothing trained) when they cannot share one; the caller trains them alone."""
    if len({pack_key(c) for c in cells}) > 1:
        raise PackRefused(f"members that differ in more than {', '.join(MEMBER_OPTIONS)}")
    why = refusal(plans)
    if why is not None:
        raise PackRefused(why)
    forms = [cpu_forms_for(p.recorded, p.run_dir, p.device, p.ops.name) for p in plans]
    if any(f != forms[0] for f in forms):
        raise PackRefused("members computing different CPU kernel forms")
    outer_threads, outer_flush = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(plans[0].threads)
    fpmode.apply(plans[0].flush)
    try:
        with contextlib.ExitStack() as stack:
            for key, (kernel, _) in CPU_KERNELS.items():
                stack.enter_context(kernel.using(forms[0][key]))
            members = [build_member(c, p, forms[0]) for c, p in zip(cells, plans)]
            by_start: dict[int, list[Member]] = {}
            for m in members:  # a kill between two members' checkpoints leaves them a step apart
                by_start.setdefault(m.state.start, []).append(m)
            for group in by_start.values():
                PackRun(group).train()
            return [m.summary for m in members]
    finally:
        torch.set_num_threads(outer_threads)
        fpmode.set_flush_denormal(outer_flush)


@dataclass
class Member:
    cell: Any
    plan: Any
    model: Any
    opt: Any  # its lone torch optimizer: the format its checkpoint's state takes
    state: RunState
    rng: torch.Tensor  # the torch RNG state its lone run would checkpoint
    stability: Stability | None = None
    log: Any = None
    clock0: float = 0.0
    done: bool = False
    summary: dict | None = None


@dataclass
class StepRecord:
    """One step's device values, kept until the next readback."""

    step: int
    loss: torch.Tensor  # (K,)
    parts: torch.Tensor | None = None  # (K, M) the logged probes' values, M = len(names)
    names: list[str] = field(default_factory=list)
    val: torch.Tensor | None = None  # (K,) float64
    time: float = 0.0  # when the host had queued it (the step's end, on a CPU)
    dt: float = 0.0  # the host's time for it


def build_member(cell, plan, forms) -> Member:
    """A member built and resumed exactly as its lone run (ablate.engine.train.build_run, resume_run)."""
    model, opt = build_run(cell, plan, forms)
    state = resume_run(plan, model, opt)
    return Member(cell, plan, model, opt, state, torch.get_rng_state())


class PackRun:
    """Members at one step, trained as one model to their end."""

    def __init__(self, members: list[Member]):
        plan = members[0].plan
        self.cfg, self.device, self.amp = plan.cfg, plan.device, plan.amp
        self.members = members
        self.start = members[0].state.start
        models = [m.model for m in self.members]
        self.flat = FlatParams(models, [m.opt for m in self.members], self.device)
        self.opt = StackedAdamW(self.flat, [m.opt for m in self.members], self.device)
        self.buffers = {n: torch.stack([dict(m.named_buffers())[n] for m in models])
                        for n, _ in models[0].named_buffers()}
        for k, m in enumerate(self.members):
            self.flat.rebind(m.model, k)
        cfg = self.cfg
        self.skeleton = build_model(cfg.spec, plan.size, plan.ops, "meta", init=cfg.init_name)
        self._probe_layout(models[0])
        K = len(self.members)
        first = [m.state.first_loss if m.state.first_loss is not None else math.nan for m in self.members]
        self.first = torch.tensor(first, dtype=torch.float64, device=self.device)
        self.active = torch.ones(K, dtype=torch.bool, device=self.device)
        self.diverged_at = torch.full((K,), -1, dtype=torch.int64, device=self.device)
        self.lr_table = torch.tensor([[lr_at(s, m.plan.cfg) for m in self.members] for s in range(self.start, cfg.steps)],
                                     dtype=torch.float32, device=self.device).view(-1, K)
        self.lr_now = torch.zeros(K, device=self.device)
        self.step_index = torch.zeros((), dtype=torch.int64, device=self.device)
        self.capturing = False
        self.graphs = CapturedSteps(self) if capture_enabled(self.device) else None

    def _probe_layout(self, model) -> None:
        """The lone Probes' layout (parameter order, buckets, block weights) for the flat tensor."""
        cfg = self.cfg
        self.probes = Probes(model) if cfg.probes else None
        self.vmap_probes = True
        if self.probes is None:
            return
        order = [n for n, p in model.named_parameters() if p.requires_grad]
        where = {n: i for i, n in enumerate(self.flat.names)}
        self.to_model_order = torch.tensor([where[n] for n in order], device=self.device)
        nb = self.probes.n_buckets
        names = {id(p): n for n, p in model.named_parameters()}
        block = [names[id(p)] for p in self.probes.block_params]  # the weights Probes copies, in its order
        self.block_index = torch.tensor([where[n] for n in block], device=self.device)
        self.n_buckets = nb
        autocast = (self.device.type, self.amp)
        for m in self.members:  # the compiled form: an eager no-grad forward of the probed slice
            m.stability = Stability(m.model, True, autocast)

    # ------------------------------------------------------------------ the step (no host reads)

    def _forward_fn(self, record: bool, keep_logits: bool):
        skeleton, cfg = self.skeleton, self.cfg

        def member(params, buffers, x, y):
            skeleton.record_act_norms = record
            logits, loss = functional_call(skeleton, {**params, **buffers}, (x, y))
            acts = torch.stack(skeleton.act_norms) if record else loss.new_zeros(0)
            skeleton.act_norms = []  # the batched values must not outlive the transform
            objective = loss + cfg.z_loss * z_loss_term(logits) if cfg.z_loss > 0 else loss
            kept = logits[:PROBE_SEQUENCES].detach().float() if keep_logits else loss.new_zeros(0)
            return loss, objective, acts, kept
        return member

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepRecord:
        """One optimizer step of every member on its batch x[k], y[k] (K, B, T): captured and
        replayed on CUDA where ablate.engine.pack_graphs can (a probing step runs eagerly)."""
        logged = self.probes is not None and step % self.cfg.log_every == 0
        probing = logged and step % self.cfg.probe_every == 0
        with syncs_flagged(self.device):
            self.step_index.fill_(step)  # the step's values on the device: the body reads only these
            self.lr_now.copy_(self.lr_table[step - self.start])
            if self.graphs is not None and not probing:
                return self.graphs.replay_step(step, logged, x, y)
            return self.body(step, logged, probing, x, y)

    def body(self, step: int, logged: bool, probing: bool, x: torch.Tensor, y: torch.Tensor) -> StepRecord:
        """The step's work, all on the device: forward, backward, divergence, probes, clipping,
        the optimizer. Reads the step and its rates from step_index and lr_now (CUDA graphs replay it)."""
        cfg = self.cfg
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None,
                            cache_enabled=not self.capturing):  # a cast cached in a capture would go stale
            loss, objective, acts, logits = vmap(self._forward_fn(logged, probing))(
                self.flat.views(), self.buffers, x, y)
        objective.sum().backward()  # d sum / d member k = member k's own gradient
        grad = self.flat.flat.grad
        self._check_divergence(loss.detach())
        norms_sq = self.flat.param_norms_sq(grad) if logged or cfg.grad_clip > 0 else None
        rec = StepRecord(step, loss.detach().float())
        parts = [self._logged_parts(norms_sq, acts, x[0].numel())] if logged else []
        if probing:
            before = self.flat.flat.detach().clone()
            stability = torch.stack([m.stability.measure(x[k], logits[k]) for k, m in enumerate(self.members)])
        if cfg.grad_clip > 0:
            total = norms_sq.sum(1).sqrt()  # as torch's clip_grad_norm_, per member
            grad.mul_((cfg.grad_clip / (total + 1e-6)).clamp(max=1.0).view(-1, 1))
        self.opt.step(grad, self.lr_now, self.active)
        self.flat.flat.grad = None
        if logged:
            rec.names = list(self.probes.names)
        if probing:
            parts += [self._update_parts(before), stability]
            rec.names += self.probes.update_names + self.members[0].stability.names
        if parts:
            rec.parts = torch.cat(parts, dim=1)
        return rec

    def _check_divergence(self, loss: torch.Tensor) -> None:
        """On the device, as the lone loop decides it on the host (in float64 there too); in
        place, so a captured step updates the same tensors."""
        loss = loss.double()
        self.first.copy_(torch.where(self.first.isnan(), loss, self.first))
        now = self.active & (~loss.isfinite() | (loss > self.cfg.diverge_factor * self.first))
        self.diverged_at.copy_(torch.where(now, self.step_index, self.diverged_at))
        self.active &= ~now

    def _logged_parts(self, norms_sq: torch.Tensor, acts: torch.Tensor, tokens: int) -> torch.Tensor:
        """(K, M) the `logged` probes of every member, as ablate.engine.probes.Probes computes them."""
        K, nl = len(self.members), self.probes.n_layer
        sq = norms_sq[:, self.to_model_order]
        per_bucket = torch.zeros(K, self.n_buckets, device=sq.device).index_add_(1, self.probes.bucket, sq)
        act_rms = acts.float() * (tokens * self.skeleton.size.d_model) ** -0.5

        def member(grad_sq, bucket_sq, rms):  # a registered probe sees one member's inputs, as in a lone run
            return torch.cat(measured("logged", SimpleNamespace(grad_sq=grad_sq, bucket_sq=bucket_sq,
                                                                kinds_sq=bucket_sq[1:-1].view(nl, 3), act_rms=rms)))
        return self._per_member(member, sq, per_bucket, act_rms)

    def _update_parts(self, before: torch.Tensor) -> torch.Tensor:
        """(K, L) update ratios: |update| / |weights before it| per block, per member."""
        weight_sq = self.flat.param_norms_sq(before)[:, self.block_index]
        update_sq = self.flat.param_norms_sq(before - self.flat.flat.detach())[:, self.block_index]

        def member(u, w):
            return torch.cat(measured("update", SimpleNamespace(update_sq=u, weight_sq=w, n_layer=self.probes.n_layer,
                                                                block_layer=self.probes.block_layer)))
        return self._per_member(member, update_sq, weight_sq)

    def _per_member(self, fn, *inputs: torch.Tensor) -> torch.Tensor:
        """fn over the members' rows of `inputs`, stacked: under vmap (a few ops for the whole
        pack), or member by member once a registered probe turns out not to run under vmap (a
        plugin's; decided at the first logged step, so a resumed run decides alike)."""
        if self.vmap_probes:
            try:
                return vmap(fn)(*inputs)
            except Exception:  # noqa: BLE001  (whatever a plugin's probe raises under vmap)
                self.vmap_probes = False
        return torch.stack([fn(*(t[k] for t in inputs)) for k in range(len(self.members))])

    @torch.no_grad()
    def evaluate(self, batches: int) -> torch.Tensor:
        """(K,) float64 mean validation loss of every member on the fixed batches (seed 0), summed
        in float64 in batch order as the lone loop sums its floats."""
        cfg = self.cfg
        self.skeleton.eval()
        params = self.flat.views(self.flat.flat.detach())

        def member(p, b, x, y):
            return functional_call(self.skeleton, {**p, **b}, (x, y))[1]
        total = torch.zeros(len(self.members), dtype=torch.float64, device=self.device)
        for i in range(batches):
            x, y = self.members[0].plan.data.batch("val", i, 0, cfg.batch_size, cfg.context, self.device)
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                total = total + vmap(member, in_dims=(0, 0, None, None))(params, self.buffers, x, y).double()
        self.skeleton.train()
        return total / batches

    def batches(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's batch of `step` (its own seed), stacked (K, B, T), copied without a sync."""
        cfg = self.cfg
        pairs = [m.plan.data.batch("train", step, m.plan.cfg.seed, cfg.batch_size, cfg.context) for m in self.members]
        xy = torch.stack([torch.stack(p) for p in pairs])  # (K, 2, B, T) on the host
        if self.device.type == "cuda":
            xy = xy.pin_memory().to(self.device, non_blocking=True)
        return xy[:, 0], xy[:, 1]

    # ------------------------------------------------------------------ the loop

    def train(self) -> list[dict]:
        cfg = self.cfg
        pending: list[StepRecord] = []
        now = time.perf_counter()
        for m in self.members:
            m.clock0 = now - m.state.elapsed
        first_step, previous = True, now
        with contextlib.ExitStack() as stack:
            for m in self.members:
                m.log = stack.enter_context(open_metrics(m.plan.run_dir / METRICS))
            signals = stack.enter_context(graceful_signals())
            for step in range(self.start, cfg.steps):
                x, y = self.batches(step)
                try:
                    rec = self.step(step, x, y)
                except Exception as e:  # noqa: BLE001  (the model does not run under vmap: train alone)
                    if not first_step:
                        raise
                    raise PackRefused(f"{type(e).__name__} under torch.func.vmap: {' '.join(str(e).split())[:120]}") from e
                first_step = False
                last = step == cfg.steps - 1
                if last or (step + 1) % cfg.eval_every == 0:
                    rec.val = self.evaluate(cfg.final_eval_batches if last else cfg.eval_batches)
                rec.time = time.perf_counter()
                rec.dt, previous = rec.time - previous, rec.time
                pending.append(rec)
                checkpoint = (step + 1) % cfg.checkpoint_every == 0
                if last or signals or checkpoint or rec.val is not None or (step + 1) % READBACK_EVERY == 0:
                    self.flush(pending)
                    pending = []
                    if all(m.done for m in self.members):
                        break
                    if not last and (checkpoint or signals):
                        self.checkpoint(step + 1)
                    if signals:
                        raise Interrupted(f"interrupted by {signal.Signals(signals[0]).name} after step {step}; "
                                          "the pack checkpointed its members: rerun the same command to resume")
        return self.finish()

    def flush(self, pending: list[StepRecord]) -> None:
        """Read the pending steps back in one copy; write every member's rows, and finish the
        members that diverged."""
        K = len(self.members)
        tensors = [self.diverged_at, self.first] + [t for r in pending for t in (r.loss, r.parts, r.val) if t is not None]
        values = readback(torch.cat([t.double().reshape(-1) for t in tensors]))
        diverged_at, first = values[:K], values[K:2 * K]
        at = 2 * K
        read = []
        for r in pending:
            loss, at = values[at:at + K], at + K
            parts = None
            if r.parts is not None:
                M = r.parts.shape[1]
                parts, at = [values[at + k * M:at + (k + 1) * M] for k in range(K)], at + K * M
            val = None
            if r.val is not None:
                val, at = values[at:at + K], at + K
            read.append((r, loss, parts, val))
        for k, m in enumerate(self.members):
            if not m.done:
                m.state.first_loss = first[k] if math.isfinite(first[k]) else m.state.first_loss
                self._write_rows(k, m, read, int(diverged_at[k]))

    def _write_rows(self, k: int, m: Member, read: list, diverged_at: int) -> None:
        cfg, tokens = m.plan.cfg, self.cfg.batch_size * self.cfg.context
        for r, loss, parts, val in read:
            s = r.step
            if 0 <= diverged_at < s:
                break
            diverged = s == diverged_at
            metrics = dict(zip(r.names, map(finite_or_none, parts[k]))) if parts is not None else {}
            if val is not None and not diverged:
                m.state.val_loss = val[k]
                metrics["val_loss"] = finite_or_none(val[k])
            if s % cfg.log_every == 0 or s == cfg.steps - 1 or diverged:
                m.log.write({"step": s, "tokens": (s + 1) * tokens, "loss": finite_or_none(loss[k]),
                             "lr": lr_at(s, cfg), **metrics, "time_s": r.time - m.clock0,
                             "tokens_per_s": tokens / r.dt})
                m.state.recent = (m.state.recent + [loss[k]])[-FINAL_LOSS_WINDOW:]
            if diverged:
                m.done = True
                m.summary = finish_run(m.plan.run_dir, m.state, DIVERGED, s, time.perf_counter() - m.clock0)
                return

    def checkpoint(self, step: int) -> None:
        """Every running member's checkpoint, in its lone run's format (ablate.engine.train._save_checkpoint)."""
        saved_rng = torch.get_rng_state()
        try:
            for k, m in enumerate(self.members):
                if m.done:
                    continue
                m.state.elapsed = time.perf_counter() - m.clock0
                torch.set_rng_state(m.rng)  # the state its lone run would checkpoint
                save_checkpoint(m.plan.run_dir / CHECKPOINT, _Saved(member_state_dict(m.model)),
                                 _Saved(self.opt.member_state(m.opt, k)), step,
                                 {"first_loss": m.state.first_loss, "elapsed": m.state.elapsed})
        finally:
            torch.set_rng_state(saved_rng)

    def finish(self) -> list[dict]:
        for m in self.members:
            if not m.done:
                m.done = True
                m.summary = finish_run(m.plan.run_dir, m.state, COMPLETED, self.cfg.steps - 1,
                                    time.perf_counter() - m.clock0)
        return [m.summary for m in self.members]


class _Saved:
    """A state dict already made, for _save_checkpoint's model.state_dict() / opt.state_dict()."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state
