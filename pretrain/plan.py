"""The per-device memory plan of a training config: will one step fit, and with which strategy?

Pure arithmetic on the config (no accelerator, no process group): the parameter counts come from the
cost model (``RecurrentConfig.cost``), everything else from the shapes. ``python pretrain/launch.py
--config C --plan`` prints the table; this module has no I/O of its own.

What is counted (bytes per device; P = parameters, n = tokens of one micro-batch = b·T):

- weights float32 4P, gradients float32 4P, Adam m and v 8P. ``fsdp`` divides all three by the
  shard group (the whole world), ``hsdp`` by the GPUs of one node (replicated across nodes),
  ``bucketed`` divides only the optimizer state by the world (ZeRO-1; torch's
  ZeroRedundancyOptimizer hands out whole tensors, so one rank holds at least the largest tensor's
  moments), ``ddp`` divides nothing.
- working weights: under bf16 autocast torch caches a bf16 copy of every weight it casts (2P for
  ddp/bucketed). FSDP2 gathers float32 units (so the norms, e, s_0 and every s_i stay float32, as
  under DDP: pretrain/precision.py): the root (embedding, adapter, final norm: FSDP2 keeps the root
  gathered for the step), every core block (kept gathered across the recurrence) and two prelude/coda
  blocks (the one computing and the prefetched one), plus autocast's bf16 copies of those.
- activations, from the tensors autograd saves in this code (see ``block_activation_bytes``): the
  prelude and coda blocks, and for the k gradient-carrying core iterations either everything (no
  checkpointing) or e and each iteration's input state plus one iteration recomputed at a time.
- logits and loss: the loss is not chunked, so the float32 logits (B, T, V), the saved log-softmax and
  the two gradients of the same size are alive together at the start of the backward (4 × 4V·n).
- communication buffers: DDP's reducer keeps a float32 copy of every gradient in its buckets (4P); the
  recipe's bucketed all-reduce one 64 MiB bucket (plus one for the ZeRO-1 weight gather); FSDP the
  unsharded float32 gradients of the gathered core and a float32 reduce-scatter buffer of its largest
  unit.
- allocator margin on accelerators: 10 % of the rest for fragmentation plus 1 GiB for the context,
  the collective library's own buffers and the matmul workspace.

Rows are added as if all were alive at once (an upper bound: gradients grow while activations are
freed). Capacities are the vendors' figures read as GiB (one MI250X GCD: 64 GiB).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pretrain.config import TrainConfig
from pretrain.precision import Precision, resolve_precision
from pretrain.strategy import (
    Strategy,
    StrategyError,
    from_config,
    get_strategy,
    strategy_names,
)
from recurrent_model import RecurrentConfig

GIB = 2**30
ALLOCATOR_FRACTION = 0.10
CONTEXT_BYTES = 1 * GIB


class PlanError(ValueError):
    """A plan that cannot be made (unknown device, bad counts); the message names the problem."""


@dataclass(frozen=True)
class Device:
    """One accelerator (or the host) with the memory a single rank may use."""

    name: str
    label: str
    memory_gib: float
    accelerator: bool = True


DEVICES: dict[str, Device] = {
    "mi250x": Device("mi250x", "AMD MI250X (one GCD)", 64.0),
    "mi300x": Device("mi300x", "AMD MI300X", 192.0),
    "h100": Device("h100", "NVIDIA H100 80GB", 80.0),
    "h200": Device("h200", "NVIDIA H200", 141.0),
}


def host_device() -> Device:
    """The CPU as a device: the machine's physical memory."""
    import os

    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Device("cpu", "host CPU", pages / GIB, accelerator=False)


def resolve_device(name: str | None, memory_gib: float | None = None) -> Device:
    """A device from the table (case-insensitive; a CUDA device name like 'NVIDIA H200' works) or
    'cpu'; ``memory_gib`` overrides the capacity (and alone describes an unknown device)."""
    device: Device | None = None
    if name:
        key = name.lower().replace(" ", "").replace("-", "")
        if key == "cpu":
            device = host_device()
        else:
            for dev_key in sorted(DEVICES, key=len, reverse=True):
                if dev_key in key:
                    device = DEVICES[dev_key]
                    break
        if device is None and memory_gib is None:
            raise PlanError(
                f"unknown device {name!r}; known: {', '.join(DEVICES)}, cpu "
                "(or give its memory with --device-memory GiB)"
            )
    if device is None:
        if memory_gib is None:
            raise PlanError("no device given: pass --device NAME or --device-memory GiB")
        device = Device(name or "custom", name or "custom device", float(memory_gib))
    elif memory_gib is not None:
        device = dataclasses.replace(device, memory_gib=float(memory_gib))
    if device.memory_gib <= 0:
        raise PlanError(f"device memory must be > 0 GiB, got {device.memory_gib}")
    return device


# Parameter counts -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of the model by FSDP unit (tied embedding counted once)."""

    total: int
    largest_tensor: int  # the embedding: ZeRO-1 hands out whole tensors
    root: int  # embedding/lm_head, adapter, final norm
    prelude_blocks: tuple[int, ...]
    core_blocks: tuple[int, ...]
    coda_blocks: tuple[int, ...]

    @property
    def core(self) -> int:
        return sum(self.core_blocks)

    @property
    def largest_block(self) -> int:
        return max((*self.prelude_blocks, *self.core_blocks, *self.coda_blocks), default=0)


def count_parameters(config: RecurrentConfig) -> ParameterCounts:
    """Exact counts from the shape (``RecurrentConfig.cost``; tests/test_cost.py checks them
    against the built model)."""
    cost = config.cost
    blocks = tuple(
        (cost.block_params,) * n
        for n in (
            config.n_layers_in_prelude,
            config.n_layers_in_recurrent_block,
            config.n_layers_in_coda,
        )
    )
    root = cost.parameters - sum(sum(b) for b in blocks)
    tensors = [o * i for o, i in cost.weight_shapes().values()]
    return ParameterCounts(cost.parameters, max(tensors), root, *blocks)


# Activations ------------------------------------------------------------------------------------
def block_activation_bytes(config: RecurrentConfig, bf16: bool) -> int:
    """Bytes per token that autograd keeps for one sandwich block (its input included).

    Read off the tensors layers.SandwichBlock saves (tests/test_plan.py checks them): each RMSNorm
    keeps its float32 input, its float32 normalised value and one reciprocal RMS; each Linear its
    input (float32, or the bf16 copy autocast makes); attention the roped q and k, the fused qkv (v is
    a view of it), its output and one log-sum-exp per head; the MLP its fc output, the SiLU output and
    the gated product. The residual stream stays float32 under autocast (RMSNorm multiplies by its
    float32 weight). fp32: 64h + 16I, bf16: 48h + 8I, plus 16 + 4·heads bytes.
    """
    h, inter = config.n_embd, config.intermediate_size
    small = 4 * 4 + 4 * config.n_heads
    if bf16:
        return 48 * h + 8 * inter + small
    return 64 * h + 16 * inter + small


def iteration_activation_bytes(config: RecurrentConfig, bf16: bool) -> int:
    """Bytes per token of one gradient-carrying core iteration: the adapter input [s; e] (2h in the
    matmul dtype) and the core blocks."""
    a = 2 if bf16 else 4
    return 2 * config.n_embd * a + config.n_layers_in_recurrent_block * block_activation_bytes(
        config, bf16
    )


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch, with and without checkpointing the core iterations.

    ``saved`` is what the forward leaves for the backward; with checkpointing, the backward later
    recomputes one core iteration at a time (``recomputed``), after the logits and their gradients
    are gone, so only the larger of the two sits on top of ``saved``.
    """

    outer: int  # prelude and coda blocks, ln_f(s_r), the final norm and the lm_head input
    checkpointed_inputs: int  # e and the input state of each of the k iterations
    iteration: int  # every activation of one gradient-carrying iteration
    k: int

    def saved(self, checkpointing: bool) -> int:
        return self.outer + (self.checkpointed_inputs if checkpointing else self.k * self.iteration)

    def recomputed(self, checkpointing: bool) -> int:
        return self.iteration if checkpointing else 0


def activation_bytes(config: RecurrentConfig, tokens: int, k: int, bf16: bool) -> Activations:
    """Activations of a forward over ``tokens`` tokens with ``k`` gradient-carrying iterations."""
    h = config.n_embd
    block = block_activation_bytes(config, bf16)
    outer_blocks = config.n_layers_in_prelude + config.n_layers_in_coda
    # ln_f(s_r) keeps s_r and its normalised value; the final ln_f its input and normalised value;
    # lm_head its input (float32, or the bf16 copy); two reciprocal RMS per token.
    lm_input = 2 * h if bf16 else 4 * h
    outer = tokens * (outer_blocks * block + 16 * h + lm_input + 8)
    state = 4 * h  # float32: e, and the input state of each checkpointed iteration
    inputs = tokens * (k + 1) * state
    return Activations(outer, inputs, tokens * iteration_activation_bytes(config, bf16), k)


def logits_loss_bytes(config: RecurrentConfig, tokens: int) -> int:
    """float32 logits, the saved log-softmax and both of their gradients (the loss is not chunked)."""
    return 4 * 4 * config.vocab_size * tokens


# The plan -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    name: str
    bytes: int
    note: str = ""


@dataclass
class MemoryPlan:
    """Per-device memory of one training step under one strategy."""

    strategy: str
    device: Device
    nodes: int
    gpus_per_node: int
    parameters: int
    rows: list[Row]
    aside: list[Row] = field(default_factory=list)  # shown, not added (e.g. the other AC choice)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def capacity_bytes(self) -> int:
        return int(self.device.memory_gib * GIB)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def headroom(self) -> float:
        """Free fraction of the device after the step (negative when it does not fit)."""
        return 1.0 - self.total_bytes / self.capacity_bytes

    def row(self, name_start: str) -> Row:
        for r in self.rows:
            if r.name.startswith(name_start):
                return r
        raise KeyError(name_start)

    def largest_rows(self, n: int = 3) -> list[Row]:
        return sorted(self.rows, key=lambda r: r.bytes, reverse=True)[:n]


def shard_counts(
    strategy: str, nodes: int, gpus_per_node: int, shard_size: int = 0
) -> tuple[int, int]:
    """(ranks sharing the weights and gradients, ranks sharing the optimizer state) of a registered
    strategy (``Strategy.shard_counts``); hsdp shards over ``shard_size`` ranks (0: one node), as
    distributed.shard_size does."""
    try:
        return get_strategy(strategy, shard_size=shard_size).shard_counts(nodes, gpus_per_node)
    except StrategyError as exc:
        raise PlanError(str(exc)) from None


def plan_precision(config: TrainConfig, device: Device) -> Precision:
    """The run's precision as the trainer resolves it on this device (pretrain/precision.py)."""
    return resolve_precision(config.train.precision, "cuda" if device.accelerator else "cpu")


@dataclass(frozen=True)
class _Layout:
    """What every row of one plan reads: the strategy on the ranks, and the precision."""

    strategy: Strategy
    world: int
    shard: int  # ranks sharing weights and gradients
    opt_shard: int  # ranks sharing the Adam moments
    counts: ParameterCounts
    bf16: bool

    @property
    def fsdp_applied(self) -> bool:
        """FSDP2 is applied with more than one rank (one rank trains the plain model)."""
        return self.strategy.shards_model and self.world > 1


def _state_rows(layout: _Layout) -> list[Row]:
    """float32 weights, gradients and Adam moments, divided as the strategy shards them."""
    P, shard, opt_shard = layout.counts.total, layout.shard, layout.opt_shard
    sharded_note = f"/ {shard} ranks" if shard > 1 else "replicated"
    optimizer_bytes, optimizer_note = layout.strategy.optimizer_bytes(layout.counts, opt_shard)
    return [
        Row("weights (fp32)", -(-4 * P // shard), sharded_note),
        Row("gradients (fp32)", -(-4 * P // shard), sharded_note),
        Row("optimizer state (Adam m, v fp32)", optimizer_bytes, optimizer_note),
    ]


def _gathered_parameters(counts: ParameterCounts) -> int:
    """What FSDP2 keeps gathered: the root (kept for the step), every core block (kept across the
    recurrence) and two prelude/coda blocks (the one computing and the prefetched one)."""
    return counts.root + counts.core + 2 * counts.largest_block


def _working_weight_rows(layout: _Layout) -> list[Row]:
    """FSDP's gathered float32 units, and autocast's bf16 copy of every weight it casts."""
    rows = []
    cast = layout.counts.total
    if layout.fsdp_applied:
        gathered = _gathered_parameters(layout.counts)
        rows.append(
            Row(
                "gathered weights (fp32)",
                4 * gathered,
                "root + core blocks (kept across the recurrence) + 2 outer blocks",
            )
        )
        cast = gathered
    if layout.bf16:
        rows.append(Row("bf16 weight copies (autocast cache)", 2 * cast, "one per cast weight"))
    return rows


def _activation_rows(config: TrainConfig, layout: _Layout) -> tuple[list[Row], Row]:
    """Activations saved for the backward and the logits/loss (or one recomputed iteration), and
    the aside row: the same with the other activation-checkpointing choice."""
    model_cfg, t = config.model_config(), config.train
    tokens, k = t.micro_batch_size * config.data.block_size, config.backprop_depth
    acts = activation_bytes(model_cfg, tokens, k, layout.bf16)
    ckpt = t.activation_checkpointing
    rows = [
        Row(
            f"activations (k={k}, {'checkpointed' if ckpt else 'not checkpointed'})",
            acts.saved(ckpt),
            f"saved for the backward, {t.micro_batch_size} x {config.data.block_size} tokens",
        )
    ]
    logits = logits_loss_bytes(model_cfg, tokens)
    recomputed = acts.recomputed(ckpt)
    if recomputed:
        rows.append(
            Row(
                "logits and loss (fp32) / recompute",
                max(logits, recomputed),
                f"max of logits+loss {gib(logits)} (not chunked), "
                f"one recomputed iteration {gib(recomputed)}",
            )
        )
    else:
        rows.append(Row("logits and loss (fp32)", logits, "not chunked"))
    other = "not checkpointed" if ckpt else "checkpointed"
    aside = Row(
        f"(activations if {other})",
        acts.saved(not ckpt) + max(logits, acts.recomputed(not ckpt)),
        "with logits and loss, not added",
    )
    return rows, aside


def _communication_rows(config: TrainConfig, layout: _Layout) -> list[Row]:
    """The strategy's buffers (``Strategy.communication``): DDP's reducer buckets, the recipe's
    bucket (and ZeRO-1's gather), or FSDP's buffers; none on one rank."""
    buffers = layout.strategy.communication(layout.counts) if layout.world > 1 else None
    return [Row("communication buffers", *buffers)] if buffers else []


def plan_memory(
    config: TrainConfig,
    device: Device,
    nodes: int,
    gpus_per_node: int,
    strategy: str | None = None,
    counts: ParameterCounts | None = None,
) -> MemoryPlan:
    """The per-device memory of one training step of ``config`` (see the module docstring)."""
    if nodes < 1 or gpus_per_node < 1:
        raise PlanError(f"nodes and GPUs per node must be >= 1, got {nodes} x {gpus_per_node}")
    try:
        chosen = from_config(config.distributed, strategy)
        shard, opt_shard = chosen.shard_counts(nodes, gpus_per_node)
    except StrategyError as exc:
        raise PlanError(str(exc)) from None
    counts = counts or count_parameters(config.model_config())
    layout = _Layout(
        chosen,
        nodes * gpus_per_node,
        shard,
        opt_shard,
        counts,
        plan_precision(config, device).bf16,
    )
    activations, aside = _activation_rows(config, layout)
    rows = [
        *_state_rows(layout),
        *_working_weight_rows(layout),
        *activations,
        *_communication_rows(config, layout),
    ]
    if device.accelerator:
        margin = int(ALLOCATOR_FRACTION * sum(r.bytes for r in rows)) + CONTEXT_BYTES
        rows.append(Row("allocator margin", margin, "10% + 1 GiB context/workspace"))
    return MemoryPlan(chosen.name, device, nodes, gpus_per_node, counts.total, rows, [aside])


def plan_all(
    config: TrainConfig, device: Device, nodes: int, gpus_per_node: int
) -> dict[str, MemoryPlan]:
    """The plan of every strategy (one parameter count)."""
    counts = count_parameters(config.model_config())
    return {
        s: plan_memory(config, device, nodes, gpus_per_node, s, counts) for s in strategy_names()
    }


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def format_plan(plan: MemoryPlan, others: dict[str, MemoryPlan] | None = None) -> str:
    """The table for the terminal: rows, total vs capacity, and the other strategies' totals."""
    from tabulate import tabulate

    head = (
        f"memory plan: {plan.parameters:,} parameters, strategy {plan.strategy}, "
        f"{plan.nodes} node(s) x {plan.gpus_per_node} = {plan.world} ranks, "
        f"{plan.device.label} ({plan.device.memory_gib:.4g} GiB)"
    )
    table = [[r.name, gib(r.bytes), r.note] for r in plan.rows]
    table.append(["total", gib(plan.total_bytes), f"{100 * plan.headroom:+.0f}% headroom"])
    table.append(["capacity", gib(plan.capacity_bytes), plan.device.label])
    table += [[r.name, gib(r.bytes), r.note] for r in plan.aside]
    lines = [head, tabulate(table, headers=["per device", "GiB", ""], tablefmt="simple")]
    if others:
        summary = ", ".join(
            f"{s} {gib(p.total_bytes)} GiB ({'fits' if p.fits else 'does not fit'})"
            for s, p in others.items()
        )
        lines.append(f"all strategies: {summary}")
    return "\n".join(lines)


def verdict(plan: MemoryPlan, others: dict[str, MemoryPlan]) -> str:
    """One line: it fits (with headroom), or what does not fit and which strategy would."""
    total, cap = gib(plan.total_bytes), gib(plan.capacity_bytes)
    if plan.fits:
        return (
            f"fits: {plan.strategy} needs {total} of {cap} GiB per device "
            f"({100 * plan.headroom:.0f}% headroom)"
        )
    largest = ", ".join(f"{r.name} {gib(r.bytes)}" for r in plan.largest_rows(3))
    fitting = [
        f"{s} ({gib(p.total_bytes)} GiB)"
        for s, p in others.items()
        if p.fits and s != plan.strategy
    ]
    fix = (
        f"{' or '.join(fitting)} would fit"
        if fitting
        else "no strategy fits: add ranks, enable train.activation_checkpointing or shrink the "
        "micro-batch"
    )
    return (
        f"does not fit: {plan.strategy} needs {total} GiB per device but the "
        f"{plan.device.label} has {cap} GiB (largest: {largest}); {fix}"
    )
