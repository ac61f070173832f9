"""The diffusion-forcing sampler: decode while earlier positions are still being refined in depth.

Plain decoding runs all r core iterations of token n before token n+1 starts. This sampler keeps a
*wavefront* of not-yet-final positions; every sampler step advances the whole wave by
``inner_recurrence`` core iterations in one batched pass over the KV cache, guesses a token at every
wave position, appends ``headway`` new positions and freezes the prefix whose latent state stopped
moving. It follows ``generate_diffusion_style`` of the published Huginn-0125 modeling file (Geiping,
Yang, Su 2025, arXiv 2510.14961) step for step, with the same parameter names and defaults, so that
with ``init_scale=0`` and greedy decoding the tokens are the same. Deviations, all outside the
published behaviour: placeholder tokens come from this model's vocabulary; ``sequences`` is cut at
``max_new_tokens`` and after the first stop token; the tablets also record the step that stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .cached_forward import CachedForward
from .config import ContextLengthError
from .kv_cache import KVCache
from .sampling import Sampler

if TYPE_CHECKING:
    from .model import RecurrentLM

FREEZE_STRATEGIES = (
    "latent-diff",
    "latent-acceleration-1",
    "latent-acceleration-2",
    "token-stability",
    "fixed",
)
# "latest-m4-compress-s4" keeps one iteration's worth of core entries per token (for the Huginn layout
# with l_R = 4 this is exactly the published lookup); "full" keeps every iteration's entries.
CACHE_LOOKUP_STRATEGIES = ("latest-m4-compress-s4", "full")

Streamer = Callable[[torch.Tensor], None]


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


@dataclass(frozen=True)
class _Settings:
    num_steps: int
    inner_recurrence: int
    headway: int
    init_scale: float
    full_prefill: bool
    ema_embeds: float
    state_noise_mixing: float
    dampened_state_mixer: bool
    sqrt_mixer: bool
    freeze_strategy: str
    exit_t: float
    continuous_compute: bool
    max_wavefront: int
    max_diffusion_steps: int


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_float(name: str, value: object, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not value >= low or (high is not None and not value <= high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value


class _Sampler:
    """The sampler's state for one call: cache, wave, counters, tablets."""

    def __init__(
        self,
        model: RecurrentLM,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        cfg: _Settings,
        sampler: Sampler,
        stop_tokens: set[int],
        budget: int | None,
        streamer: Streamer | None,
    ) -> None:
        self.model, self.cfg, self.sampler = model, cfg, sampler
        self.prompt = input_ids
        self.P = input_ids.shape[1]
        self.max_new = max_new_tokens
        self.stops = stop_tokens
        self.streamer = streamer
        context = model.config.block_size
        # Positions written by a step lie below the sequence length, which the loop keeps <= context;
        # without freezing the wave grows by `headway` per step up to max_wavefront.
        wave_bound = cfg.max_wavefront if cfg.max_wavefront > 0 else context
        length = min(context, self.P + max_new_tokens + wave_bound + 2 * cfg.headway + 1)
        steps = max(cfg.num_steps if cfg.full_prefill else 1, cfg.inner_recurrence)
        self.cache = KVCache(model.config, 1, length, steps, budget, model.device, model.dtype)
        self.run = CachedForward(model, self.cache)
        blocked = max(context, self.P + max_new_tokens + cfg.headway + int(cfg.full_prefill))
        self.recurrence = torch.zeros(1, blocked, dtype=torch.long, device=model.device)
        self.stability = torch.zeros(1, blocked, dtype=torch.long, device=model.device)
        self.core_passes = self.tokens_forwarded = self.cache_clears = self.standing_waves = 0
        self.seen = 0  # cache positions holding valid entries (the published cache's seen tokens)
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

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt at num_steps with the cache; (first new token (1, 1), the wave's first state)."""
        r, ids = self.run, self.prompt
        r.begin(0, self.P)
        e = r.prelude(ids)
        injected = r.inject(e)
        s = r.start_state(self.fresh_state(e))
        for i in range(1, self.cfg.num_steps + 1):
            s = r.core_step(s, injected, i)
        logits, _ = r.coda(s, last_only=True)
        self.seen = self.P
        self.core_passes += 1
        self.tokens_forwarded += self.P
        return self.choose(logits[0, -1:]), self.fresh_state(s[:, -1:])

    def embed_without_cache(self, ids: torch.Tensor) -> torch.Tensor:
        """Prelude output of ``ids`` from position 0 without touching the cache (the first e_old)."""
        m = self.model
        return m.prelude(m.embed(ids), m.rope_at(0, ids.shape[1]))

    # The loop ------------------------------------------------------------------------------------
    def generate(self) -> torch.Tensor:
        cfg, dev = self.cfg, self.model.device
        P, headway = self.P, cfg.headway
        if cfg.full_prefill:
            first, states = self.prefill()
            frozen = current = torch.cat([self.prompt, first], dim=1)
            self.recurrence[:, : frozen.shape[1]] += cfg.num_steps
            if self.streamer is not None:
                self.streamer(first[0])
        else:
            frozen = current = self.prompt.clone()
            states = self.fresh_state(torch.zeros(1, P, self.model.config.n_embd, device=dev,
                                                  dtype=self.model.dtype))  # fmt: skip
            if cfg.max_wavefront > 0 and P > cfg.max_wavefront:
                raise ValueError(
                    f"the prompt of {P} tokens does not fit max_wavefront={cfg.max_wavefront}; use "
                    f"full_prefill=True or raise max_wavefront to at least {P}"
                )
        old_embeds = self.embed_without_cache(current) if cfg.ema_embeds > 0 else None
        latent = "latent" in cfg.freeze_strategy
        previous = states.clone()
        previous_delta = torch.zeros_like(states)
        prev_previous = torch.zeros_like(states)
        old_old_index = old_index = 0
        old_k = k = 0
        step = 0
        streamed = frozen.shape[1]
        context = self.model.config.block_size
        while frozen.shape[1] - P < self.max_new and current.shape[1] <= context:
            index = self.seen
            W = states.shape[1]
            if index + W > self.cache.max_length:
                raise ContextLengthError(
                    f"the wave reaches position {index + W}, beyond the {self.cache.max_length} "
                    "positions allocated for this call"
                )
            # 2. embeddings of the wave (written to the cache), mixed with last step's
            r = self.run
            r.begin(index, W)
            e = r.prelude(current[:, index : index + W])
            self.seen = index + W
            if old_embeds is not None:
                old = old_embeds[:, index - old_index :]
                mixed = e.clone() * (1 - cfg.ema_embeds)
                mixed[:, : old.shape[1], :] += old * cfg.ema_embeds
                e = old_embeds = mixed.clone()
            # 3. dampened state-noise mixing
            if cfg.state_noise_mixing > 0:
                noise_state = self.fresh_state(states)
                if cfg.dampened_state_mixer:
                    active = self.recurrence[:, index : index + W]
                    lam = (cfg.state_noise_mixing / (1 + active))[:, :, None].to(states.dtype)
                else:
                    lam = torch.as_tensor(cfg.state_noise_mixing, device=dev, dtype=states.dtype)
                if cfg.sqrt_mixer:
                    states = states * torch.relu(1 - lam).sqrt() + lam.sqrt() * noise_state
                else:
                    states = states * (1 - lam) + lam * noise_state
            # 4. inner_recurrence core iterations over the whole wave
            injected = r.inject(e)
            states = r.start_state(states)
            for i in range(1, cfg.inner_recurrence + 1):
                states = r.core_step(states, injected, i)
                self.recurrence[:, index : index + W] += 1
                self.core_passes += 1
                self.tokens_forwarded += W
            # 5. a guess at every position from the last frozen one onward
            logits, _ = r.coda(states)
            new_tokens = self.choose(logits[0, max(frozen.shape[1] - 1 - index, 0) :])
            edits = torch.cat([frozen, new_tokens[:, :-1]], dim=1)
            self.stability[:, : current.shape[1]] += current == edits
            extra = torch.randint(0, self.model.config.vocab_size, (1, headway - 1), device=dev,
                                  generator=self.sampler.generator)  # fmt: skip
            current = torch.cat([frozen, new_tokens, extra], dim=1)
            # 6. headway new positions
            if cfg.continuous_compute and W >= headway:
                new_state = states[:, -headway:].clone()
            else:
                new_state = self.fresh_state(states.new_zeros(1, headway, states.shape[2]))
            states = torch.cat([states, new_state], dim=1)
            headway_in_step = headway
            if cfg.max_wavefront > 0 and states.shape[1] > cfg.max_wavefront:
                headway_in_step = cfg.max_wavefront - (states.shape[1] - headway)
                states = states[:, : cfg.max_wavefront]
                current = current[:, : index + cfg.max_wavefront]
                self.standing_waves += 1
            # 7. freezing
            newly_frozen = False
            if latent:
                prev = previous[:, index - old_index :]
                n = min(prev.shape[1], states.shape[1])
                prev, match = prev[:, :n], states[:, :n]
                if cfg.freeze_strategy == "latent-diff":
                    criterion = (match - prev).norm(dim=-1) / match.norm(dim=-1)
                elif cfg.freeze_strategy == "latent-acceleration-1":
                    delta = match - prev
                    m = min(delta.shape[1], previous_delta.shape[1])
                    accel = delta[:, :m] - previous_delta[:, :m]
                    criterion = accel.norm(dim=-1) / match[:, :m].norm(dim=-1)
                    previous_delta = delta.clone()
                else:  # latent-acceleration-2: positions present in all three steps
                    lo = max(index, old_index, old_old_index)
                    hi = min(index + states.shape[1], old_index + previous.shape[1],
                             old_old_index + prev_previous.shape[1])  # fmt: skip
                    now = states[:, lo - index : hi - index]
                    before = previous[:, lo - old_index : hi - old_index]
                    earlier = prev_previous[:, lo - old_old_index : hi - old_old_index]
                    accel = (now - before) - (before - earlier)
                    criterion = accel.norm(dim=-1) / (now.norm(dim=-1) + 1e-6)
                exits = (criterion < cfg.exit_t)[0].nonzero()
                if exits.numel():
                    k = index + int(exits[-1, 0]) + 1
                    newly_frozen = True
            elif cfg.freeze_strategy == "token-stability":
                stable = (self.stability[0] > cfg.num_steps // cfg.inner_recurrence).nonzero()
                if stable.numel():
                    k = int(stable[-1, 0]) + 1
                    if k <= index:
                        raise RuntimeError(
                            "token-stability froze no wave position"
                        )  # not reachable
                    newly_frozen = True
                else:
                    k = 0
            if cfg.freeze_strategy == "fixed":
                if step > cfg.num_steps // cfg.inner_recurrence:
                    self._clear(states.shape[1] - headway - headway_in_step)
                    states = states[:, headway_in_step:]
                    frozen = torch.cat([frozen, new_tokens[:, :headway_in_step]], dim=1)
                else:
                    self._clear(states.shape[1] - headway_in_step)
            elif newly_frozen:
                self._clear(current.shape[1] - headway_in_step - k + 1)
                states = states[:, k - index - 1 :]
                frozen = current[:, :k]
            else:
                self._clear(states.shape[1] - headway_in_step)
            if self.streamer is not None and frozen.shape[1] > streamed:
                self.streamer(frozen[0, streamed:])
            streamed = frozen.shape[1]
            self._record(current, frozen, index, W)
            # 8. stop
            if step > cfg.num_steps:
                fresh = frozen[0, old_k:k] if latent else frozen[0, -headway:]
                if any(int(t) in self.stops for t in fresh.tolist()):
                    break
            if step > cfg.max_diffusion_steps:
                break
            if cfg.freeze_strategy == "latent-acceleration-2":
                prev_previous = previous.clone()
                old_old_index = old_index
            if latent:
                previous = states.clone()
            old_index = index
            step += 1
            old_k = k
        self.steps = step
        return frozen

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
            settings=dict(vars(self.cfg)),
        )


def _cut(frozen: torch.Tensor, prompt_length: int, max_new_tokens: int, stops: set[int]):
    """The prompt and at most max_new_tokens frozen tokens, ending after the first stop token."""
    new = frozen[0, prompt_length : prompt_length + max_new_tokens].tolist()
    for i, t in enumerate(new):
        if t in stops:
            new = new[: i + 1]
            break
    return frozen[:, : prompt_length + len(new)]


def generate_diffusion(
    model: RecurrentLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int = 32,
    inner_recurrence: int = 4,
    headway: int = 1,
    init_scale: float = 1.0,
    *,
    cache_lookup_strategy: str = "latest-m4-compress-s4",
    full_prefill: bool = True,
    ema_embeds: float = 0.1,
    state_noise_mixing: float = 0.5,
    freeze_strategy: str = "latent-diff",
    dampened_state_mixer: bool = True,
    sqrt_mixer: bool = False,
    continuous_compute: bool = False,
    exit_t: float = 0.03,
    max_wavefront: int = 128,
    max_diffusion_steps: int = 4096,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_tokens: Iterable[int] | None = None,
    streamer: Streamer | None = None,
    return_details: bool = False,
) -> torch.Tensor | DiffusionOutput:
    """Generate up to ``max_new_tokens`` after ``input_ids`` (1, T) with the diffusion-forcing sampler.

    num_steps: depth of the prompt prefill (and, with "fixed" / "token-stability", the freezing
    horizon); inner_recurrence: core iterations per sampler step; headway: new positions per step
    (positions beyond the first start as random placeholder tokens from the model's vocabulary);
    init_scale: scale of the random initial states (0 = zeros, deterministic with greedy decoding).
    ema_embeds: weight of last step's embeddings in e; state_noise_mixing (divided by 1 + the
    position's iterations when dampened_state_mixer; sqrt_mixer mixes variances): how much fresh
    initial state is mixed in before each step; freeze_strategy: "latent-diff" freezes up to the last
    wave position with ‖s − s_prev‖/‖s‖ < exit_t, also "latent-acceleration-1/2", "token-stability"
    (a guess unchanged for num_steps // inner_recurrence steps), "fixed" (headway tokens per step after
    num_steps // inner_recurrence steps); continuous_compute: new positions start from the last wave
    states; max_wavefront: the most positions in the wave (0 = unlimited); max_diffusion_steps: hard
    cap on sampler steps. cache_lookup_strategy: "latest-m4-compress-s4" (one iteration of core KV
    entries per token: later iterations overwrite earlier ones) or "full". Greedy unless ``do_sample``
    (temperature, top_k, top_p, min_p, generator). ``stop_tokens`` default to the tokenizer's stop ids;
    they are checked once the sampler is past num_steps steps, as in the published sampler.
    ``streamer(tokens)`` gets each newly frozen run of tokens. Returns (1, T + n) ids, or a
    :class:`DiffusionOutput` with the analysis tablets when ``return_details``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.numel() == 0:
        raise ValueError("input_ids must be a non-empty (1, tokens) tensor of token ids")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"the diffusion sampler decodes one sequence at a time; got a batch of {input_ids.shape[0]}"
        )
    if input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    vocab = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids must lie in [0, {vocab}) (the vocabulary)")
    _check_int("max_new_tokens", max_new_tokens, 0)
    context = model.config.block_size
    if input_ids.shape[1] + max_new_tokens > context:
        raise ContextLengthError(
            f"a prompt of {input_ids.shape[1]} tokens plus max_new_tokens={max_new_tokens} exceeds "
            f"the model's context of {context} tokens (block_size)"
        )
    if freeze_strategy not in FREEZE_STRATEGIES:
        raise ValueError(
            f"unknown freeze_strategy {freeze_strategy!r}; choose from {', '.join(FREEZE_STRATEGIES)}"
        )
    if cache_lookup_strategy not in CACHE_LOOKUP_STRATEGIES:
        raise ValueError(
            f"unknown cache_lookup_strategy {cache_lookup_strategy!r}; choose from "
            f"{', '.join(CACHE_LOOKUP_STRATEGIES)}"
        )
    cfg = _Settings(
        num_steps=_check_int("num_steps", num_steps, 1),
        inner_recurrence=_check_int("inner_recurrence", inner_recurrence, 1),
        headway=_check_int("headway", headway, 1),
        init_scale=_check_float("init_scale", init_scale, 0.0),
        full_prefill=bool(full_prefill),
        ema_embeds=_check_float("ema_embeds", ema_embeds, 0.0, 1.0),
        state_noise_mixing=_check_float("state_noise_mixing", state_noise_mixing, 0.0, 1.0),
        dampened_state_mixer=bool(dampened_state_mixer),
        sqrt_mixer=bool(sqrt_mixer),
        freeze_strategy=freeze_strategy,
        exit_t=_check_float("exit_t", exit_t, 0.0),
        continuous_compute=bool(continuous_compute),
        max_wavefront=_check_int("max_wavefront", max_wavefront, 0),
        max_diffusion_steps=_check_int("max_diffusion_steps", max_diffusion_steps, 1),
    )
    if 0 < cfg.max_wavefront <= cfg.headway:
        raise ValueError(
            f"max_wavefront={max_wavefront} must exceed headway={headway} (or be 0 = unlimited)"
        )
    sampler = Sampler(do_sample, temperature, top_k, top_p, min_p, generator)
    if stop_tokens is None:
        tok = model.tokenizer
        stop_tokens = tuple(tok.stop_ids) if tok is not None else ()
    stops = {int(t) for t in stop_tokens}
    budget = model.config.n_layers_in_recurrent_block
    if cache_lookup_strategy == "full":
        budget = None
    ids = input_ids.to(device=model.device, dtype=torch.long)
    with torch.inference_mode():
        run = _Sampler(model, ids, max_new_tokens, cfg, sampler, stops, budget, streamer)
        if max_new_tokens > 0:
            frozen = run.generate()
        else:
            frozen, run.steps = ids, 0
    frozen = frozen.clone()  # an ordinary tensor outside inference mode
    sequences = _cut(frozen, ids.shape[1], max_new_tokens, stops)
    return run.details(frozen, sequences) if return_details else sequences
