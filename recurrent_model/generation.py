"""Autoregressive generation with the KV cache and the paper's inference features.

``generate(model, input_ids, max_new_tokens, num_steps=None, **options)``: greedy or sampled decoding of
(left-padded) batches with stop tokens and streaming, per-token adaptive exit, KV-cache sharing,
continuous-compute warm starts, self-speculative decoding and a compiled fixed-depth decode. The
options are the fields of :class:`GenerationConfig`; see :func:`generate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import torch

from .cached_forward import ChunkRunner
from .compiled import CompiledDecode, compile_mode, compile_state
from .kv_cache import KVCache
from .options import Streamer, check_int, check_prompt, replace_options, stop_tokens_for
from .sampling import ExitCriterion, Sampler
from .stack import StepOutcome

if TYPE_CHECKING:
    from .inductor_raw_entry import OutputBuffers
    from .model import RecurrentLM

__all__ = ["CompileConflict", "GenerationConfig", "GenerationOutput", "Streamer", "generate"]


class CompileConflict(TypeError, ValueError):
    """``compile=True`` with something the compiled fixed-depth decode cannot run (no silent eager)."""


def compile_conflicts(
    exit_criterion: str | None, draft_steps: int | None, hooks: list[str] | None = None
) -> list[str]:
    """What ``compile=True`` cannot honour: an exit criterion, drafts, attached hooks (by name)."""
    found = []
    if exit_criterion is not None:
        found.append(f"exit_criterion={exit_criterion!r}")
    if draft_steps is not None:
        found.append(f"draft_steps={draft_steps}")
    if hooks:
        found.append(f"hooks on {', '.join(hooks[:3])}{' …' if len(hooks) > 3 else ''}")
    return found


def check_compile(cfg: GenerationConfig, model: RecurrentLM) -> None:
    """Refuse ``compile=True`` with an option it would otherwise drop by decoding eagerly."""
    if not cfg.compile:
        return
    hooked = [n for n in model.hook_names() if model.hook_point(n).fns]
    found = compile_conflicts(cfg.exit_criterion, cfg.draft_steps, hooked)
    if found:
        raise CompileConflict(
            f"compile=True decodes at a fixed depth without hooks and cannot honour "
            f"{'; '.join(found)}: drop compile or those options"
        )


@dataclass(frozen=True)
class GenerationConfig:
    """Every option of :func:`generate` except the per-call objects (generator, streamer, mask).

    num_steps: core iterations per token (None = the config's mean recurrence). With an
    ``exit_criterion`` ("kl", "latent-diff", "entropy-diff", "cosine", "argmax-stability", "minp-kl")
    each token stops iterating between ``min_steps`` (default 1) and ``max_steps`` (default
    num_steps) once the criterion falls under ``exit_threshold`` (defaults in
    ``sampling.DEFAULT_THRESHOLDS``). Greedy unless ``do_sample`` (temperature, top_k, top_p, min_p).
    ``stop_tokens`` default to the tokenizer's stop ids; stopped rows continue with ``pad_token_id``.
    ``cache_budget`` = core-layer KV slots per token (None = full). ``continuous_compute`` starts
    each token from the previous token's ln_f(s_r). ``draft_steps`` + ``lookahead`` enable
    self-speculative decoding. ``output_scores`` keeps every token's logits. ``compile`` runs
    fixed-depth decoding through torch.compile'd static-shape prefill and decode steps; with an
    exit criterion, drafts or attached hooks it raises :class:`CompileConflict` (a TypeError and
    a ValueError) naming them, as the CLI refuses ``--compile`` with ``--exit`` or ``--draft-steps``.
    """

    num_steps: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    stop_tokens: tuple[int, ...] | None = None
    pad_token_id: int | None = None
    exit_criterion: str | None = None
    exit_threshold: float | None = None
    min_steps: int | None = None
    max_steps: int | None = None
    continuous_compute: bool = False
    cache_budget: int | None = None
    draft_steps: int | None = None
    lookahead: int | None = None
    init_scale: float = 1.0
    output_scores: bool = False
    compile: bool = False

    def replace(self, **changes: Any) -> GenerationConfig:
        """A copy with ``changes``; an unknown option name raises TypeError naming the known ones."""
        per_call = "attention_mask, generator, streamer, return_details"
        return replace_options(self, "generate", per_call, **changes)

    def resolved(self, model: RecurrentLM) -> GenerationConfig:
        """This config checked, with the depths and lookahead that ``None`` stands for filled in:
        num_steps (the model's mean recurrence), min_steps and max_steps (num_steps without an
        exit criterion, else 1 and num_steps), lookahead (4 with drafts, else 0)."""
        steps = self.num_steps
        steps = check_int("num_steps", model.config.mean_recurrence if steps is None else steps, 1)
        if self.exit_criterion is None:
            if self.min_steps is not None or self.max_steps is not None:
                raise ValueError("min_steps, max_steps and exit_threshold need an exit_criterion")
            if self.exit_threshold is not None:
                raise ValueError("min_steps, max_steps and exit_threshold need an exit_criterion")
            low = high = steps
        else:
            criterion = ExitCriterion(self.exit_criterion, self.exit_threshold)  # validates both
            if criterion.criterion.needs_gate:
                raise ValueError(
                    f"exit criterion {self.exit_criterion!r} reads a learned exit gate, which "
                    f"{model.name} (the Huginn layout) does not have"
                )
            high = check_int("max_steps", steps if self.max_steps is None else self.max_steps, 1)
            low = check_int("min_steps", 1 if self.min_steps is None else self.min_steps, 1)
            if low > high:
                raise ValueError(f"min_steps ({low}) exceeds max_steps ({high})")
        lookahead = self.lookahead
        if lookahead is not None and self.draft_steps is None:
            raise ValueError(
                "lookahead needs draft_steps (the draft depth of speculative decoding)"
            )
        if self.draft_steps is not None:
            check_int("draft_steps", self.draft_steps, 1)
            lookahead = check_int("lookahead", 4 if lookahead is None else lookahead, 1)
            if self.exit_criterion is not None or self.continuous_compute:
                raise ValueError(
                    "self-speculative decoding verifies tokens in parallel, so it cannot be "
                    "combined with exit_criterion or continuous_compute"
                )
        if self.init_scale < 0:
            raise ValueError(f"init_scale must be >= 0, got {self.init_scale}")
        if self.cache_budget is not None:
            check_int("cache_budget", self.cache_budget, 1)
        check_compile(self, model)
        return dataclasses.replace(
            self, num_steps=steps, min_steps=low, max_steps=high, lookahead=lookahead or 0,
            continuous_compute=bool(self.continuous_compute), init_scale=float(self.init_scale),
            stop_tokens=stop_tokens_for(model, self.stop_tokens),
        )  # fmt: skip


@dataclass
class GenerationOutput:
    """What ``generate(..., return_details=True)`` returns.

    sequences: (B, T + new) prompt and generated ids (pad after a row stopped).
    steps: (B, new) core iterations spent on each generated token (0 after the row stopped).
    acceptance_rate: accepted / drafted tokens of self-speculative decoding (None if none drafted).
    cache_bytes: memory held by the KV cache. scores: (B, new, V) logits when output_scores=True.
    compiled: whether the compiled decode ran; compile_seconds: its one-time compile cost in this
    call (0 when the compiled functions were already built for these shapes).
    """

    sequences: torch.Tensor
    steps: torch.Tensor
    acceptance_rate: float | None
    drafted: int
    accepted: int
    cache_bytes: int
    scores: torch.Tensor | None = None
    compiled: bool = False
    compile_seconds: float = 0.0

    @property
    def mean_steps(self) -> float:
        """Mean iterations per generated token (tokens after a stop excluded)."""
        spent = self.steps[self.steps > 0]
        return float(spent.float().mean()) if spent.numel() else 0.0


class _Run:
    """One generation call: cache, sequences buffer and the decoding loops."""

    def __init__(
        self,
        model: RecurrentLM,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        cfg: GenerationConfig,
        sampler: Sampler,
        pad_token_id: int,
        attention_mask: torch.Tensor | None,
        streamer: Streamer | None,
    ) -> None:
        """``cfg`` is resolved (:meth:`GenerationConfig.resolved`)."""
        self.model, self.cfg, self.sampler = model, cfg, sampler
        B, T = input_ids.shape
        self.prompt_len, self.max_new = T, max_new_tokens
        self.cache = self._cache(B, T + max_new_tokens)
        if attention_mask is not None:
            self.cache.set_padding(attention_mask)
        self.runner = ChunkRunner(model, self.cache)
        self.compiled = (
            CompiledDecode(model, self.cache, cfg.num_steps, compile_mode(model.device))
            if self.cache_is_static
            else None
        )
        self.criterion = (
            ExitCriterion(cfg.exit_criterion, cfg.exit_threshold) if cfg.exit_criterion else None
        )
        self.sequences = torch.full(
            (B, T + max_new_tokens), pad_token_id, dtype=torch.long, device=model.device
        )
        self.sequences[:, :T] = input_ids
        # each token's depth: num_steps unless its row exits early or has stopped (emit writes those)
        self.steps = torch.full((B, max_new_tokens), cfg.num_steps, dtype=torch.long,
                                device=model.device)  # fmt: skip
        # each new token's column of sequences and steps, as views made once (per token: one op)
        self.new_tokens = self.sequences[:, T:].unbind(1)
        self.new_steps = self.steps.unbind(1)
        self.finished = torch.zeros(B, dtype=torch.bool, device=model.device)
        self.stop_tokens = torch.tensor(cfg.stop_tokens, dtype=torch.long, device=model.device)
        self.stops = bool(cfg.stop_tokens)  # without stop tokens no row ever finishes early
        self.stopped = False  # whether any row has emitted a stop token (then finished says which)
        # two sets of results that the compiled tokens write in turn (one token reads the other's),
        # looked up once, after the first token has settled how its graphs are called
        self.buffers: list[OutputBuffers] | None = None
        self.id_views: dict[torch.Tensor, torch.Tensor] = {}  # the buffers' greedy tokens as ids
        self.pad = pad_token_id
        self.streamer = streamer
        self.scores: list[torch.Tensor] | None = [] if cfg.output_scores else None
        self.n = 0
        self.drafted = self.accepted = 0

    def _cache(self, batch: int, length: int) -> KVCache:
        """The call's KV cache; static storage (for the compiled decode) when ``compile`` applies:
        fixed depth (no exit criterion, no drafts) and no hooks."""
        model, cfg = self.model, self.cfg
        cache_steps = max(cfg.max_steps, cfg.draft_steps or 1)
        fixed_depth = cfg.exit_criterion is None and cfg.draft_steps is None
        self.cache_is_static = cfg.compile and fixed_depth and not model.has_hooks()
        storage = None
        if self.cache_is_static:  # static shapes: round up so that nearby lengths share one graph
            length = min(model.config.block_size, -(-length // 64) * 64)
            shape = KVCache.shape_for(model.config, batch, length, cache_steps, cfg.cache_budget)
            n_core = model.config.n_layers_in_recurrent_block
            storage = compile_state(model).static_storage(shape, model.dtype, model.device, n_core)
        return KVCache(
            model.config, batch, length, cache_steps, cfg.cache_budget, model.device,
            model.dtype, storage=storage,
        )  # fmt: skip

    # Forward passes ------------------------------------------------------------------------------
    def _initial(self, warm: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """s_0 of a chunk from its e: ``warm`` when given, else a fresh draw."""
        if warm is not None:
            return lambda e: warm
        return lambda e: self.model.initial_state(e, self.cfg.init_scale, self.sampler.generator)

    def chunk(
        self,
        ids: torch.Tensor,
        start: int,
        steps: int,
        warm: torch.Tensor | None = None,
        all_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` (B, T) at positions start… through ``steps`` iterations: (logits, latents)."""
        compiled = self.compiled
        if compiled is not None and steps == compiled.num_steps and not all_logits:
            return compiled(ids, start, self._compiled_s0(ids, warm))
        return self.runner.run(ids, start, steps, self._initial(warm), last_only=not all_logits)

    def _compiled_s0(self, ids: torch.Tensor, warm: torch.Tensor | None) -> torch.Tensor | None:
        """s_0 for the compiled decode: ``warm``, a fresh draw, or None for s_0 = 0 (the graph's)."""
        if warm is None and self.cfg.init_scale > 0:
            shape = (*ids.shape, self.model.config.n_embd)
            like = torch.empty(shape, device=ids.device, dtype=self.model.dtype)
            return self._initial(None)(like)
        return warm

    def token(
        self, ids: torch.Tensor, pos: int, warm: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int, torch.Tensor | None]:
        """One token per row at ``pos`` with adaptive exit: (logits (B, 1, V), latents, steps, the
        greedy tokens (B,) where the compiled decode took them in its graph, else None)."""
        crit = self.criterion
        if crit is None and self.compiled is not None:  # fixed depth: the compiled decode's
            into = self.buffers[self.n % 2] if self.buffers else None
            out = self.compiled.token(ids, pos, self._compiled_s0(ids, warm), into)
            if self.buffers is None:
                sets = [self.compiled.output_buffers() for _ in range(2)]
                self.buffers = [b for b in sets if b is not None]
            return out.logits, out.latents, self.cfg.num_steps, out.greedy
        if crit is None:
            logits, latents = self.chunk(ids, pos, self.cfg.num_steps, warm)
            return logits[:, -1:], latents, self.cfg.num_steps, None
        exit_ = _AdaptiveExit(self.runner, crit, self.cfg, ids.shape[0], ids.device)
        out = self.runner.forward(ids, pos, self.cfg.max_steps, self._initial(warm),
                                  last=not crit.needs_logits, on_step=exit_.step)  # fmt: skip
        logits, latents = exit_.outputs if crit.needs_logits else (out.logits, out.latents)
        if int(exit_.steps.min()) < self.cache.max_steps:
            self.cache.freeze_exits(pos, exit_.steps)
        return logits[:, -1:], latents, exit_.steps, None

    # Output --------------------------------------------------------------------------------------
    def emit(self, tokens: torch.Tensor, steps: torch.Tensor | int, logits: torch.Tensor) -> bool:
        """Append one token per row (``logits`` (B, 1, V) of its position, kept for
        ``output_scores``); True when generation is over (all stopped or length reached)."""
        if self.stopped:  # rows that emitted a stop token go on with pad tokens at depth 0
            tokens = torch.where(self.finished, self.pad, tokens)
            steps = torch.where(self.finished, 0, torch.as_tensor(steps, device=tokens.device))
        n = self.n
        self.new_tokens[n].copy_(tokens)
        if isinstance(steps, torch.Tensor):
            self.new_steps[n].copy_(steps)
        elif steps != self.cfg.num_steps:
            self.new_steps[n].fill_(steps)
        if self.scores is not None:  # a copy: a compiled token's outputs may be reused by the next
            self.scores.append(logits[:, -1].to(torch.float32, copy=True))
        self.n += 1
        over = self.n >= self.max_new
        if self.stops:
            hit = torch.isin(tokens, self.stop_tokens)
            if bool(hit.any()):  # until a row stops, nothing else changes and all rows go on
                self.finished |= hit
                self.stopped = True
                over = over or bool(self.finished.all())
        if self.streamer is not None:
            self.streamer(self.new_tokens[n], self.new_steps[n])
        return over

    def details(self) -> GenerationOutput:
        # Clones made outside inference mode: ordinary tensors that autograd may use later.
        scores = torch.stack(self.scores, dim=1).clone() if self.scores else None
        rate = self.accepted / self.drafted if self.drafted else None
        return GenerationOutput(
            self.sequences[:, : self.prompt_len + self.n].clone(),
            self.steps[:, : self.n].clone(),
            rate,
            self.drafted,
            self.accepted,
            self.cache.memory_bytes,
            scores,
            compiled=self.compiled is not None,
            compile_seconds=self.compiled.compile_seconds if self.compiled is not None else 0.0,
        )

    # Decoding loops ------------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor) -> torch.Tensor | None:
        """All prompt tokens but the last at full depth; returns their last latent for warm starts."""
        if ids.shape[1] < 2:
            return None
        _, latents = self.chunk(ids[:, :-1], 0, self.cfg.max_steps)
        return latents[:, -1:] if self.cfg.continuous_compute else None

    def plain(self, ids: torch.Tensor) -> None:
        warm = self.prefill(ids)
        x, pos = ids[:, -1:], ids.shape[1] - 1
        while self.n < self.max_new:
            logits, latents, steps, greedy = self.token(x, pos, warm)
            tokens = self._choose(logits, greedy)
            if self.emit(tokens, steps, logits):
                return
            x, pos = self._ids(tokens), pos + 1
            warm = latents if self.cfg.continuous_compute else None

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` (B,) as the next ids (B, 1); for the buffers' greedy tokens a view made once
        (a dict keyed by tensor compares identities)."""
        view = self.id_views.get(tokens)
        if view is None:
            view = tokens[:, None]
            if any(tokens is t for b in self.buffers or () for t in b.tensors):
                self.id_views[tokens] = view
        return view

    def _choose(self, logits: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        """The next token per row (B,): ``greedy`` where the graph took the argmax and the sampler
        is greedy, else the sampler's choice from ``logits`` (B, 1, V)."""
        if greedy is not None and not self.sampler.do_sample:
            return greedy
        return self.sampler.choose(logits[:, -1])[0]

    def speculative(self, ids: torch.Tensor) -> None:
        """Draft ``lookahead`` tokens at draft_steps, verify them in one pass at num_steps."""
        cfg, sampler = self.cfg, self.sampler
        assert cfg.draft_steps is not None
        self.prefill(ids)
        x, pos = ids[:, -1:], ids.shape[1] - 1
        while self.n < self.max_new:
            k = min(cfg.lookahead, self.max_new - self.n - 1)
            if k == 0:
                logits, _, _, greedy = self.token(x, pos, None)
                self.emit(self._choose(logits, greedy), cfg.num_steps, logits)
                return
            drafts, draft_probs, cur = [], [], x
            for i in range(k):
                logits, _ = self.chunk(cur, pos + i, cfg.draft_steps)
                token, probs = sampler.choose(logits[:, -1])
                drafts.append(token)
                draft_probs.append(probs)
                cur = token[:, None]
            draft = torch.stack(drafts, dim=1)
            verify = torch.cat([x, draft], dim=1)
            logits, _ = self.chunk(verify, pos, cfg.num_steps, all_logits=True)
            m, last = self._accept(draft, draft_probs, logits)
            self.drafted += k * int((~self.finished).sum())
            self.accepted += m * int((~self.finished).sum())
            for i in range(m):
                if self.emit(draft[:, i], cfg.num_steps, logits[:, i : i + 1]):
                    return
            if self.emit(last, cfg.num_steps, logits[:, m : m + 1]):
                return
            x, pos = last[:, None], pos + m + 1

    def _accept(
        self, draft: torch.Tensor, draft_probs: list, logits: torch.Tensor
    ) -> tuple[int, torch.Tensor]:
        """Accepted prefix length m (the smallest over unfinished rows) and the token after it."""
        B, k = draft.shape
        sampler = self.sampler
        if not sampler.do_sample:
            target = logits.argmax(dim=-1)  # (B, k + 1)
            agree = draft == target[:, :k]
        else:
            p = sampler.probs(logits.flatten(0, 1)).view(B, k + 1, -1)
            q = torch.stack(draft_probs, dim=1)
            p_d = p[:, :k].gather(-1, draft[..., None]).squeeze(-1)
            q_d = q.gather(-1, draft[..., None]).squeeze(-1)
            u = torch.rand(B, k, generator=sampler.generator, device=draft.device)
            agree = u * q_d < p_d
        run = agree.long().cumprod(dim=1).sum(dim=1)  # accepted prefix per row
        run = torch.where(self.finished, k, run)
        m = int(run.min())
        if not sampler.do_sample:
            return m, target[:, m]
        if m == k:
            return m, sampler.draw(p[:, k])
        residual = (p[:, m] - q[:, m]).clamp_min(0)
        total = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p[:, m])
        corrected = sampler.draw(residual)
        return m, torch.where(run > m, draft[:, m], corrected)


class _AdaptiveExit:
    """The per-step policy of an adaptive-exit token (``on_step`` of :func:`stack.run`): rows whose
    criterion converged between min_steps and max_steps keep their state; the loop stops once every
    row has exited. ``steps`` holds each row's iterations, ``outputs`` the coda of the last state
    when the criterion reads logits (computed here, once per step)."""

    def __init__(
        self,
        runner: ChunkRunner,
        criterion: ExitCriterion,
        cfg: GenerationConfig,
        batch: int,
        device: torch.device,
    ) -> None:
        self.runner, self.criterion, self.cfg = runner, criterion, cfg
        self.steps = torch.full((batch,), cfg.max_steps, dtype=torch.long, device=device)
        self.active = torch.ones(batch, dtype=torch.bool, device=device)
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        criterion.reset()

    def step(self, i: int, new: torch.Tensor, s: torch.Tensor) -> StepOutcome:
        """Iteration ``i`` gave ``new`` from ``s``: the state to keep, and whether every row exited."""
        cfg, crit = self.cfg, self.criterion
        if i > 1:
            new = torch.where(self.active[:, None, None], new, s)  # exited rows keep their state
        logits = None
        if crit.needs_logits:
            self.outputs = self.runner.coda(new, last_only=True)
            logits = self.outputs[0][:, -1]
        converged = crit(new, s, logits)
        if not cfg.min_steps <= i < cfg.max_steps:
            return StepOutcome(new)
        exiting = converged & self.active
        self.steps = torch.where(exiting, i, self.steps)
        self.active = self.active & ~exiting
        return StepOutcome(new, stop=not bool(self.active.any()))


def _check_mask(
    model: RecurrentLM, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """The left-padding mask (B, T) as booleans on the model's device, checked."""
    if attention_mask is None:
        return None
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected "
            f"{tuple(input_ids.shape)} like input_ids"
        )
    mask = attention_mask.to(device=model.device).bool()
    if not bool(mask[:, -1].all()) or not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError("only left padding is supported: each row's pads must come first")
    return mask


@overload
def generate(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    *,
    config: GenerationConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: Literal[False] = False,
    **options: Any,
) -> torch.Tensor: ...


@overload
def generate(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    *,
    config: GenerationConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: Literal[True],
    **options: Any,
) -> GenerationOutput: ...


def generate(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    *,
    config: GenerationConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: bool = False,
    **options: Any,
) -> torch.Tensor | GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (B, T).

    Returns the sequences (B, T + new), or with ``return_details`` a :class:`GenerationOutput`
    (iterations per token, acceptance rate, cache memory, compile cost). The options are a
    :class:`GenerationConfig` (``config``) and/or its fields as keywords, which override it;
    ``num_steps`` may also be given positionally. Per call: ``attention_mask`` (B, T; 0 = pad) for
    left-padded batches, ``generator`` for s_0 and sampling, ``streamer(tokens, steps)`` called with
    each new token of every row.
    """
    if num_steps is not None:
        options["num_steps"] = num_steps
    opts = (config or GenerationConfig()).replace(**options)
    input_ids = check_prompt(model, input_ids, max_new_tokens)
    mask = _check_mask(model, input_ids, attention_mask)
    cfg = opts.resolved(model)
    sampler = Sampler(cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, generator)
    pad_token_id = cfg.pad_token_id
    if pad_token_id is None:
        tok = model.tokenizer
        pad_token_id = int(getattr(tok, "pad_id", 0) or 0) if tok is not None else 0
    with torch.inference_mode():  # no autograd bookkeeping: a faster loop on small models
        run = _Run(model, input_ids, max_new_tokens, cfg, sampler, pad_token_id, mask, streamer)
        if max_new_tokens > 0:
            if cfg.draft_steps is not None:
                run.speculative(input_ids)
            else:
                run.plain(input_ids)
    details = run.details()
    return details if return_details else details.sequences
