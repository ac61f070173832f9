"""The diffusion-forcing sampler: decode while earlier positions are still being refined in depth.

Plain decoding runs all r core iterations of token n before token n+1 starts. This sampler keeps a
*wavefront* of not-yet-final positions; every sampler step advances the whole wave by
``inner_recurrence`` core iterations in one batched pass over the KV cache, guesses a token at every
wave position, appends ``headway`` new positions and freezes the prefix whose latent state stopped
moving. It follows ``generate_diffusion_style`` of the published Huginn-0125 modeling file (Geiping,
Yang, Su 2025, arXiv 2510.14961) step for step, with the same parameter names and defaults, so that
with ``init_scale=0`` and greedy decoding the tokens are the same. Deviations, all outside the
published behaviour: placeholder tokens come from this model's vocabulary; ``sequences`` is cut at
``max_new_tokens`` and after the first stop token; the tablets also record the step that stops and
reach past the context by ``headway`` columns; "fixed" freezing of a wave cut back to
``max_wavefront`` freezes ``headway`` guesses per step like an uncut wave, fewer only where the cut
left fewer (the published sampler freezes only the positions that joined but moves its cache by
``headway``, which leaves cache and wave apart); without ``full_prefill`` a freeze never reaches
back into the prompt (the published one cuts the frozen tokens there and lets guesses replace
prompt tokens); a call that the context or ``max_diffusion_steps`` ends short of
``max_new_tokens`` says so in one warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

import torch

from .cached_forward import ChunkRunner
from .config import ContextLengthError
from .criteria import CRITERIA, Criterion, Judge, Step, WaveView, freeze_strategies
from .kv_cache import KVCache
from .options import (
    Streamer,
    check_float,
    check_int,
    check_prompt,
    replace_options,
    stop_tokens_for,
)
from .sampling import Sampler

if TYPE_CHECKING:
    from .model import RecurrentLM

__all__ = [
    "CACHE_LOOKUP_STRATEGIES",
    "FREEZE_STRATEGIES",
    "DiffusionConfig",
    "DiffusionOutput",
    "Streamer",
    "generate_diffusion",
]

#: The built-in freeze strategies: the criteria registered for "diffusion" (``criteria.CRITERIA``),
#: then "fixed"; :class:`DiffusionConfig` accepts every criterion registered for "diffusion".
FREEZE_STRATEGIES = freeze_strategies()
# "latest-m4-compress-s4" keeps one iteration's worth of core entries per token (for the Huginn layout
# with l_R = 4 this is exactly the published lookup); "full" keeps every iteration's entries.
CACHE_LOOKUP_STRATEGIES = ("latest-m4-compress-s4", "full")


@dataclass(frozen=True)
class DiffusionConfig:
    """Every option of :func:`generate_diffusion` except the per-call objects (generator, streamer).

    The defaults are the published sampler's. ``num_steps`` (default 32, that sampler's default, not
    the checkpoint's mean recurrence): the depth of the prompt prefill and, with "fixed" /
    "token-stability", the freezing horizon; it is also how many sampler steps pass before stop
    tokens are checked. ``inner_recurrence``: core iterations per sampler step; ``headway``: new
    positions per step (positions beyond the first start as random placeholder tokens from the
    model's vocabulary); ``init_scale``: scale of the random initial states (0 = zeros,
    deterministic with greedy decoding). ``ema_embeds``: weight of last step's embeddings in e;
    ``state_noise_mixing`` (divided by 1 + the position's iterations when ``dampened_state_mixer``;
    ``sqrt_mixer`` mixes variances): how much fresh initial state is mixed in before each step;
    ``freeze_strategy``: "latent-diff" freezes up to the last wave position with
    ‖s − s_prev‖/‖s‖ < ``exit_t``, also "latent-acceleration-1/2", "token-stability" (a guess
    unchanged for num_steps // inner_recurrence steps), "fixed" (headway tokens per step after
    num_steps // inner_recurrence steps); ``continuous_compute``: new positions start from the last
    wave states; ``max_wavefront``: the most positions in the wave (0 = unlimited);
    ``max_diffusion_steps``: hard cap on sampler steps. ``cache_lookup_strategy``:
    "latest-m4-compress-s4" (one iteration of core KV entries per token: later iterations overwrite
    earlier ones) or "full". Greedy unless ``do_sample`` (temperature, top_k, top_p, min_p).
    ``stop_tokens`` default to the tokenizer's stop ids.
    """

    num_steps: int = 32
    inner_recurrence: int = 4
    headway: int = 1
    init_scale: float = 1.0
    cache_lookup_strategy: str = "latest-m4-compress-s4"
    full_prefill: bool = True
    ema_embeds: float = 0.1
    state_noise_mixing: float = 0.5
    freeze_strategy: str = "latent-diff"
    dampened_state_mixer: bool = True
    sqrt_mixer: bool = False
    continuous_compute: bool = False
    exit_t: float = 0.03
    max_wavefront: int = 128
    max_diffusion_steps: int = 4096
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    stop_tokens: tuple[int, ...] | None = None

    def replace(self, **changes: Any) -> DiffusionConfig:
        """A copy with ``changes``; an unknown option name raises TypeError naming the known ones."""
        per_call = "generator, streamer, return_details"
        return replace_options(self, "generate_diffusion", per_call, **changes)

    def resolved(self, model: RecurrentLM) -> DiffusionConfig:
        """This config checked, numbers as their types, stop tokens filled in."""
        if self.freeze_strategy not in freeze_strategies():
            raise ValueError(
                f"unknown freeze_strategy {self.freeze_strategy!r}; choose from "
                f"{', '.join(freeze_strategies())}"
            )
        if self.cache_lookup_strategy not in CACHE_LOOKUP_STRATEGIES:
            raise ValueError(
                f"unknown cache_lookup_strategy {self.cache_lookup_strategy!r}; choose from "
                f"{', '.join(CACHE_LOOKUP_STRATEGIES)}"
            )
        cfg = dataclasses.replace(
            self,
            num_steps=check_int("num_steps", self.num_steps, 1),
            inner_recurrence=check_int("inner_recurrence", self.inner_recurrence, 1),
            headway=check_int("headway", self.headway, 1),
            init_scale=check_float("init_scale", self.init_scale, 0.0),
            full_prefill=bool(self.full_prefill),
            ema_embeds=check_float("ema_embeds", self.ema_embeds, 0.0, 1.0),
            state_noise_mixing=check_float("state_noise_mixing", self.state_noise_mixing, 0.0, 1.0),
            dampened_state_mixer=bool(self.dampened_state_mixer),
            sqrt_mixer=bool(self.sqrt_mixer),
            exit_t=check_float("exit_t", self.exit_t, 0.0),
            continuous_compute=bool(self.continuous_compute),
            max_wavefront=check_int("max_wavefront", self.max_wavefront, 0),
            max_diffusion_steps=check_int("max_diffusion_steps", self.max_diffusion_steps, 1),
            stop_tokens=stop_tokens_for(model, self.stop_tokens),
        )
        if 0 < cfg.max_wavefront <= cfg.headway:
            raise ValueError(
                f"max_wavefront={cfg.max_wavefront} must exceed headway={cfg.headway} "
                "(or be 0 = unlimited)"
            )
        return cfg

    def sampler(self, generator: torch.Generator | None) -> Sampler:
        return Sampler(
            self.do_sample, self.temperature, self.top_k, self.top_p, self.min_p, generator
        )


@dataclass
class DiffusionOutput:
    """What ``generate_diffusion(..., return_details=True)`` returns (batch size 1).

    sequences: (1, T + n) prompt and frozen tokens, cut at max_new_tokens and after a stop token.
    frozen: (1, T + m) every frozen token as the sampler left it (m may exceed max_new_tokens).
    Tablets, one row per sampler step (positions along the columns, -1 / 0 where nothing was written):
    token_tablet (steps, L) the current sequence (frozen + guesses + placeholders), frozen_tablet (steps,
    L) the frozen tokens, counter_tablet (steps, L) core iterations spent on each position so far,
    stability_tablet (steps, L) how many steps each position's guess stayed unchanged;
    frozen_lengths / sequence_lengths (steps,) the frozen prefix and sequence length at the end of each
    step; wave_starts / wave_widths (steps,) the first position and the number of positions the step
    iterated.
    Summary counts as in the published sampler: core_passes (core iterations over a chunk, the prefill
    counting once), tokens_forwarded (positions pushed through core iterations), cache_clears (cache
    positions discarded), standing_waves (steps whose wave hit max_wavefront), sampler_steps.
    stop_reason: why the sampler stopped: "max_new_tokens", "stop_token", "max_diffusion_steps",
    or "context" (the sequence of frozen tokens, guesses and placeholders outgrew the model's
    context before max_new_tokens froze).
    """

    sequences: torch.Tensor
    frozen: torch.Tensor
    prompt_length: int
    token_tablet: torch.Tensor
    frozen_tablet: torch.Tensor
    counter_tablet: torch.Tensor
    stability_tablet: torch.Tensor
    frozen_lengths: torch.Tensor
    sequence_lengths: torch.Tensor
    wave_starts: torch.Tensor
    wave_widths: torch.Tensor
    recurrence_per_position: torch.Tensor
    stability_per_position: torch.Tensor
    core_passes: int
    tokens_forwarded: int
    cache_clears: int
    standing_waves: int
    sampler_steps: int
    settings: dict = field(default_factory=dict)
    stop_reason: str = "max_new_tokens"

    @property
    def summary(self) -> dict[str, int]:
        """The published sampler's summary scores under their names."""
        return {
            "num_core_forward_passes": self.core_passes,
            "num_tokens_forward": self.tokens_forwarded,
            "num_cache_clears": self.cache_clears,
            "num_standing_waves": self.standing_waves,
            "diffusion_steps": self.sampler_steps,
            "gen_seq_length": int(self.sequence_lengths[-1]) if len(self.sequence_lengths) else 0,
            "len_prefill": self.prompt_length,
        }


@dataclass
class _Wave:
    """The sampler's moving state between steps: sequences, the wave's states and what freezing
    compares against (the previous steps' states and where their waves started)."""

    frozen: torch.Tensor  # (1, F) frozen tokens, prompt included
    current: torch.Tensor  # (1, L) frozen tokens, guesses and placeholders
    states: torch.Tensor  # (1, W, h) the wave's latent states
    previous: torch.Tensor  # last step's states
    old_embeds: torch.Tensor | None  # last step's mixed embeddings (ema_embeds > 0)
    index: int = 0  # first position of this step's wave
    old_index: int = 0
    k: int = 0  # frozen length found by the last freeze
    old_k: int = 0
    step: int = 0
    new_tokens: torch.Tensor | None = None  # this step's guesses from the last frozen position on
    headway_in_step: int = 0  # positions this step added that fit the wavefront


class _Sampler:
    """The sampler's state for one call: cache, wave, counters, tablets."""

    def __init__(
        self,
        model: RecurrentLM,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        cfg: DiffusionConfig,
        sampler: Sampler,
        streamer: Streamer | None,
    ) -> None:
        """``cfg`` is resolved (:meth:`DiffusionConfig.resolved`)."""
        self.model, self.cfg, self.sampler = model, cfg, sampler
        self.prompt = input_ids
        self.P = input_ids.shape[1]
        self.max_new = max_new_tokens
        self.stops = set(cfg.stop_tokens or ())
        self.streamer = streamer
        # The freeze criterion and its judge for this call (None: the "fixed" schedule).
        self.criterion: Criterion | None = CRITERIA.get(cfg.freeze_strategy)
        self.judge: Judge | None = self.criterion.start() if self.criterion else None
        self.latent = self.criterion is not None and not self.criterion.needs_logits
        context = model.config.block_size
        # Positions written by a step lie below the sequence length, which the loop keeps <= context;
        # without freezing the wave grows by `headway` per step up to max_wavefront.
        wave_bound = cfg.max_wavefront if cfg.max_wavefront > 0 else context
        length = min(context, self.P + max_new_tokens + wave_bound + 2 * cfg.headway + 1)
        steps = max(cfg.num_steps if cfg.full_prefill else 1, cfg.inner_recurrence)
        budget = None
        if cfg.cache_lookup_strategy != "full":
            budget = model.config.n_layers_in_recurrent_block
        self.cache = KVCache(model.config, 1, length, steps, budget, model.device, model.dtype)
        self.run = ChunkRunner(model, self.cache)
        # Per-position counters and tablet columns: the sequence of the step that reaches the
        # context ends up to `headway` positions past it (the last guess and the placeholders).
        blocked = max(
            context + cfg.headway, self.P + max_new_tokens + cfg.headway + int(cfg.full_prefill)
        )
        self.recurrence = torch.zeros(1, blocked, dtype=torch.long, device=model.device)
        self.stability = torch.zeros(1, blocked, dtype=torch.long, device=model.device)
        self.core_passes = self.tokens_forwarded = self.cache_clears = self.standing_waves = 0
        self.seen = 0  # cache positions holding valid entries (the published cache's seen tokens)
        self.steps = 0
        self.stop_reason = "max_new_tokens"
        self.rows: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("token", "frozen", "counter", "stability")
        }
        self.lengths: dict[str, list[int]] = {
            k: [] for k in ("frozen", "sequence", "wave", "width")
        }

    # Model pieces --------------------------------------------------------------------------------
    def fresh_state(self, like: torch.Tensor) -> torch.Tensor:
        return self.model.initial_state(like, self.cfg.init_scale, self.sampler.generator)

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of float32 logits (n, V) -> (1, n)."""
        return self.sampler.choose(logits)[0][None, :]

    def stream(self, tokens: torch.Tensor, start: int) -> None:
        """Pass newly frozen ``tokens`` (from position ``start``) and their iterations on."""
        if self.streamer is not None:
            n = tokens.shape[0]
            self.streamer(tokens, self.recurrence[0, start : start + n].clone())

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt at num_steps with the cache; (first new token (1, 1), the wave's first state)."""
        logits, latents = self.run.run(self.prompt, 0, self.cfg.num_steps, self.fresh_state)
        self.seen = self.P
        self.core_passes += 1
        self.tokens_forwarded += self.P
        return self.choose(logits[0, -1:]), self.fresh_state(latents[:, -1:])

    def embed_without_cache(self, ids: torch.Tensor) -> torch.Tensor:
        """Prelude output of ``ids`` from position 0 without touching the cache (the first e_old)."""
        m = self.model
        return m.prelude(m.embed(ids), m.rope_at(0, ids.shape[1]))

    # The loop ------------------------------------------------------------------------------------
    def start(self) -> _Wave:
        """The wave before the first step: after the prefill's first token, or over the prompt."""
        cfg, P = self.cfg, self.P
        if cfg.full_prefill:
            first, states = self.prefill()
            frozen = torch.cat([self.prompt, first], dim=1)
            self.recurrence[:, : frozen.shape[1]] += cfg.num_steps
            self.stream(first[0], P)
        else:
            frozen = self.prompt.clone()
            like = torch.zeros(1, P, self.model.config.n_embd, device=self.model.device,
                               dtype=self.model.dtype)  # fmt: skip
            states = self.fresh_state(like)
            # "fixed" freezes only guesses: a wave filled by the prompt keeps none and never moves.
            need = P + 1 if self.criterion is None else P
            if 0 < cfg.max_wavefront < need:
                raise ValueError(
                    f"the prompt of {P} tokens does not fit max_wavefront={cfg.max_wavefront}"
                    f"{' with a new position (freeze_strategy fixed)' if need > P else ''}; use "
                    f"full_prefill=True or raise max_wavefront to at least {need}"
                )
        old_embeds = self.embed_without_cache(frozen) if cfg.ema_embeds > 0 else None
        return _Wave(frozen, frozen, states, states.clone(), old_embeds)

    def generate(self) -> torch.Tensor:
        """Sampler steps until max_new_tokens are frozen, the context is full or a stop; the frozen
        tokens (1, T + m)."""
        wave = self.start()
        streamed = wave.frozen.shape[1]
        context = self.model.config.block_size
        while True:
            if wave.frozen.shape[1] - self.P >= self.max_new:
                self.stop_reason = "max_new_tokens"
                break
            if wave.current.shape[1] > context:
                self.stop_reason = "context"
                break
            W = self.refine(wave)
            self.grow(wave)
            self.freeze(wave)
            if wave.frozen.shape[1] > streamed:
                self.stream(wave.frozen[0, streamed:], streamed)
            streamed = wave.frozen.shape[1]
            self._record(wave.current, wave.frozen, wave.index, W)
            reason = self.should_stop(wave)
            if reason is not None:
                done = wave.frozen.shape[1] - self.P >= self.max_new
                self.stop_reason = "max_new_tokens" if done and reason != "stop_token" else reason
                break
            self.advance(wave)
        self.steps = wave.step
        return wave.frozen

    def refine(self, wave: _Wave) -> int:
        """Steps 2-5: embed the wave (mixed with last step's embeddings), mix noise into its states,
        run inner_recurrence iterations over it and guess a token at every position from the last
        frozen one. Returns the wave's width."""
        cfg, r = self.cfg, self.run
        index = wave.index = self.seen
        W = wave.states.shape[1]
        if index + W > self.cache.max_length:
            raise ContextLengthError(
                f"the wave reaches position {index + W}, beyond the {self.cache.max_length} "
                "positions allocated for this call"
            )
        r.begin(index, W)
        e = r.prelude(wave.current[:, index : index + W])
        self.seen = index + W
        if wave.old_embeds is not None:
            old = wave.old_embeds[:, index - wave.old_index :]
            mixed = e.clone() * (1 - cfg.ema_embeds)
            mixed[:, : old.shape[1], :] += old * cfg.ema_embeds
            e = wave.old_embeds = mixed.clone()
        states = self.mix_noise(wave.states, index, W)
        states = r.iterate(states, e, cfg.inner_recurrence)
        self.recurrence[:, index : index + W] += cfg.inner_recurrence
        self.core_passes += cfg.inner_recurrence
        self.tokens_forwarded += W * cfg.inner_recurrence
        wave.states = states
        logits, _ = r.coda(states)
        frozen, current = wave.frozen, wave.current
        new_tokens = self.choose(logits[0, max(frozen.shape[1] - 1 - index, 0) :])
        edits = torch.cat([frozen, new_tokens[:, :-1]], dim=1)
        self.stability[:, : current.shape[1]] += current == edits
        extra = torch.randint(0, self.model.config.vocab_size, (1, cfg.headway - 1),
                              device=self.model.device, generator=self.sampler.generator)  # fmt: skip
        wave.current = torch.cat([frozen, new_tokens, extra], dim=1)
        wave.new_tokens = new_tokens
        return W

    def mix_noise(self, states: torch.Tensor, index: int, W: int) -> torch.Tensor:
        """Step 3: dampened state-noise mixing (the states themselves without it)."""
        cfg = self.cfg
        if cfg.state_noise_mixing <= 0:
            return states
        noise_state = self.fresh_state(states)
        if cfg.dampened_state_mixer:
            active = self.recurrence[:, index : index + W]
            lam = (cfg.state_noise_mixing / (1 + active))[:, :, None].to(states.dtype)
        else:
            lam = torch.as_tensor(cfg.state_noise_mixing, device=states.device, dtype=states.dtype)
        if cfg.sqrt_mixer:
            return states * torch.relu(1 - lam).sqrt() + lam.sqrt() * noise_state
        return states * (1 - lam) + lam * noise_state

    def grow(self, wave: _Wave) -> None:
        """Step 6: headway new positions, cut to max_wavefront (a standing wave)."""
        cfg, states, headway = self.cfg, wave.states, self.cfg.headway
        if cfg.continuous_compute and states.shape[1] >= headway:
            new_state = states[:, -headway:].clone()
        else:
            new_state = self.fresh_state(states.new_zeros(1, headway, states.shape[2]))
        states = torch.cat([states, new_state], dim=1)
        wave.headway_in_step = headway
        if cfg.max_wavefront > 0 and states.shape[1] > cfg.max_wavefront:
            wave.headway_in_step = cfg.max_wavefront - (states.shape[1] - headway)
            states = states[:, : cfg.max_wavefront]
            wave.current = wave.current[:, : wave.index + cfg.max_wavefront]
            self.standing_waves += 1
        wave.states = states

    def freeze(self, wave: _Wave) -> None:
        """Step 7: freeze a prefix by the configured strategy and forget the cache positions the
        next step rewrites."""
        if self.criterion is None:
            self._freeze_fixed(wave)
            return
        if self.latent:
            frozen_to = self._latent_freeze(wave)
        else:
            frozen_to = self._stable_freeze(wave)
        if frozen_to is None:
            self._clear(wave.states.shape[1] - wave.headway_in_step)
            return
        # Without full_prefill the wave starts over the prompt, whose positions may pass the test:
        # that freezes nothing new (cutting below the frozen prefix would drop prompt tokens).
        frozen_to = max(frozen_to, wave.frozen.shape[1])
        wave.k = frozen_to
        self._clear(wave.current.shape[1] - wave.headway_in_step - frozen_to + 1)
        wave.states = wave.states[:, frozen_to - wave.index - 1 :]
        wave.frozen = wave.current[:, :frozen_to]

    def _judged(self, wave: _Wave, now: torch.Tensor | None, before: torch.Tensor | None):
        """The freeze criterion's value for this step (per wave position, or per sequence position
        for a criterion of the guesses)."""
        assert self.judge is not None
        view = WaveView(wave.states, wave.previous, wave.index, wave.old_index, self.stability[0])
        return self.judge(Step(now, before, None, view))

    def _latent_freeze(self, wave: _Wave) -> int | None:
        """The frozen length up to the last wave position whose criterion passes exit_t."""
        assert self.criterion is not None
        prev = wave.previous[:, wave.index - wave.old_index :]
        n = min(prev.shape[1], wave.states.shape[1])
        value = self._judged(wave, wave.states[:, :n], prev[:, :n])
        exits = self.criterion.converged(value, self.cfg.exit_t)[0].nonzero()
        return wave.index + int(exits[-1, 0]) + 1 if exits.numel() else None

    def _stable_freeze(self, wave: _Wave) -> int | None:
        """A criterion of the guesses (token-stability): the frozen length up to the last position
        it passes with the horizon num_steps // inner_recurrence."""
        cfg, criterion = self.cfg, self.criterion
        assert criterion is not None
        value = self._judged(wave, None, None)
        stable = criterion.converged(value, cfg.num_steps // cfg.inner_recurrence).nonzero()
        if not stable.numel():
            wave.k = 0
            return None
        k = int(stable[-1, 0]) + 1
        if k <= wave.index:
            raise RuntimeError("token-stability froze no wave position")  # not reachable
        return k

    def _freeze_fixed(self, wave: _Wave) -> None:
        """fixed: once past num_steps // inner_recurrence steps, ``headway`` guesses freeze per step
        and the wave drops as many states from its front, so the cache keeps exactly the positions
        before the next wave; fewer freeze when the wave cut back to max_wavefront kept fewer
        guesses in the sequence."""
        cfg = self.cfg
        width = wave.states.shape[1] - wave.headway_in_step  # positions this step iterated
        if wave.step > cfg.num_steps // cfg.inner_recurrence:
            assert wave.new_tokens is not None
            kept = wave.current.shape[1] - wave.frozen.shape[1]  # guesses and placeholders kept
            n = min(cfg.headway, wave.new_tokens.shape[1], kept)
            self._clear(width - n)
            wave.states = wave.states[:, n:]
            wave.frozen = torch.cat([wave.frozen, wave.new_tokens[:, :n]], dim=1)
        else:
            self._clear(width)

    def should_stop(self, wave: _Wave) -> str | None:
        """Step 8: "stop_token" for a stop token among the freshly frozen ones (checked once past
        num_steps steps, as in the published sampler), "max_diffusion_steps" at the step cap."""
        cfg = self.cfg
        if wave.step > cfg.num_steps:
            fresh = (
                wave.frozen[0, wave.old_k : wave.k]
                if self.latent
                else wave.frozen[0, -cfg.headway :]
            )
            if any(int(t) in self.stops for t in fresh.tolist()):
                return "stop_token"
        return "max_diffusion_steps" if wave.step > cfg.max_diffusion_steps else None

    def advance(self, wave: _Wave) -> None:
        """Keep this step's states and wave start for the next step's freezing."""
        if self.latent:
            wave.previous = wave.states.clone()
        wave.old_index = wave.index
        wave.step += 1
        wave.old_k = wave.k

    def _clear(self, count: int) -> None:
        """Forget the last ``count`` cache positions (the next step rewrites them)."""
        if count < 0 or count > self.seen:
            raise RuntimeError(f"cannot clear {count} of {self.seen} cache positions")
        self.seen -= count
        self.cache_clears += count

    def _record(self, current: torch.Tensor, frozen: torch.Tensor, index: int, W: int) -> None:
        L = self.recurrence.shape[1]
        row = torch.full((L,), -1, dtype=torch.long)
        row[: current.shape[1]] = current[0].cpu()
        self.rows["token"].append(row)
        row = torch.full((L,), -1, dtype=torch.long)
        row[: frozen.shape[1]] = frozen[0].cpu()
        self.rows["frozen"].append(row)
        self.rows["counter"].append(self.recurrence[0].cpu().clone())
        self.rows["stability"].append(self.stability[0].cpu().clone())
        self.lengths["frozen"].append(frozen.shape[1])
        self.lengths["sequence"].append(current.shape[1])
        self.lengths["wave"].append(index)
        self.lengths["width"].append(W)

    def details(self, frozen: torch.Tensor, sequences: torch.Tensor) -> DiffusionOutput:
        L = self.recurrence.shape[1]
        used = max(self.lengths["sequence"], default=frozen.shape[1])
        used = min(L, max(used, frozen.shape[1]))

        def tablet(name: str) -> torch.Tensor:
            rows = self.rows[name]
            if not rows:
                return torch.zeros(0, used, dtype=torch.long)
            return torch.stack(rows)[:, :used].clone()

        def lengths(name: str) -> torch.Tensor:
            return torch.tensor(self.lengths[name], dtype=torch.long)

        n = frozen.shape[1]
        return DiffusionOutput(
            sequences=sequences.clone(),
            frozen=frozen.clone(),
            prompt_length=self.P,
            token_tablet=tablet("token"),
            frozen_tablet=tablet("frozen"),
            counter_tablet=tablet("counter"),
            stability_tablet=tablet("stability"),
            frozen_lengths=lengths("frozen"),
            sequence_lengths=lengths("sequence"),
            wave_starts=lengths("wave"),
            wave_widths=lengths("width"),
            recurrence_per_position=self.recurrence[0, :n].cpu().clone(),
            stability_per_position=self.stability[0, :n].cpu().clone(),
            core_passes=self.core_passes,
            tokens_forwarded=self.tokens_forwarded,
            cache_clears=self.cache_clears,
            standing_waves=self.standing_waves,
            sampler_steps=self.steps,
            settings=dataclasses.asdict(self.cfg),
            stop_reason=self.stop_reason,
        )

    def warn_if_short(self, frozen: torch.Tensor) -> None:
        """One RuntimeWarning when the context or the step cap ended the call before
        max_new_tokens froze (a stop token ending it early is what the caller asked for)."""
        new = frozen.shape[1] - self.P
        if new >= self.max_new or self.stop_reason not in ("context", "max_diffusion_steps"):
            return
        if self.stop_reason == "context":
            why = (
                f"the unfrozen wave reached the end of the model's context "
                f"({self.model.config.block_size} tokens)"
            )
        else:
            why = f"max_diffusion_steps={self.cfg.max_diffusion_steps} ran out"
        warnings.warn(
            f"diffusion sampler stopped early: {why} with {new} of max_new_tokens={self.max_new} "
            "tokens frozen",
            RuntimeWarning,
            stacklevel=3,
        )


def _cut(frozen: torch.Tensor, prompt_length: int, max_new_tokens: int, stops: set[int]):
    """The prompt and at most max_new_tokens frozen tokens, ending after the first stop token."""
    new = frozen[0, prompt_length : prompt_length + max_new_tokens].tolist()
    for i, t in enumerate(new):
        if t in stops:
            new = new[: i + 1]
            break
    return frozen[:, : prompt_length + len(new)]


@overload
def generate_diffusion(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    inner_recurrence: int | None = None,
    headway: int | None = None,
    init_scale: float | None = None,
    *,
    config: DiffusionConfig | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: Literal[False] = False,
    **options: Any,
) -> torch.Tensor: ...


@overload
def generate_diffusion(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    inner_recurrence: int | None = None,
    headway: int | None = None,
    init_scale: float | None = None,
    *,
    config: DiffusionConfig | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: Literal[True],
    **options: Any,
) -> DiffusionOutput: ...


def generate_diffusion(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    inner_recurrence: int | None = None,
    headway: int | None = None,
    init_scale: float | None = None,
    *,
    config: DiffusionConfig | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    return_details: bool = False,
    **options: Any,
) -> torch.Tensor | DiffusionOutput:
    """Generate up to ``max_new_tokens`` after ``input_ids`` (1, T) with the diffusion-forcing sampler.

    The options are a :class:`DiffusionConfig` (``config``) and/or its fields as keywords, which
    override it; the first four may also be given positionally. ``None`` leaves a field as the
    config has it: by default ``num_steps=32``, ``inner_recurrence=4``, ``headway=1`` and
    ``init_scale=1.0``, the published sampler's defaults (so num_steps is not the checkpoint's mean
    recurrence unless passed). Per call: ``generator`` for the initial states, placeholders and
    sampling; ``streamer(tokens, steps)`` gets each newly frozen run of tokens and the core
    iterations each received. Returns (1, T + n) ids, cut at max_new_tokens and after the first
    stop token, or a :class:`DiffusionOutput` with the analysis tablets when ``return_details``.
    The sampler stops, like the published one, when its sequence (frozen tokens, guesses and
    placeholders) outgrows the model's context; when that or ``max_diffusion_steps`` leaves fewer
    than max_new_tokens frozen it warns in one line (RuntimeWarning; ``stop_reason`` says which).
    """
    given = dict(num_steps=num_steps, inner_recurrence=inner_recurrence, headway=headway,
                 init_scale=init_scale)  # fmt: skip
    options.update({name: value for name, value in given.items() if value is not None})
    cfg = (config or DiffusionConfig()).replace(**options)
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(
            f"the diffusion sampler decodes one sequence at a time; got a batch of {input_ids.shape[0]}"
        )
    ids = check_prompt(model, input_ids, max_new_tokens, rows="1")
    cfg = cfg.resolved(model)
    sampler = cfg.sampler(generator)
    with torch.inference_mode():
        run = _Sampler(model, ids, max_new_tokens, cfg, sampler, streamer)
        frozen = run.generate() if max_new_tokens > 0 else ids
    frozen = frozen.clone()  # an ordinary tensor outside inference mode
    run.warn_if_short(frozen)
    sequences = _cut(frozen, ids.shape[1], max_new_tokens, run.stops)
    return run.details(frozen, sequences) if return_details else sequences
