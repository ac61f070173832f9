"""Command line: stream a completion from a checkpoint and report the iterations spent per token.

python -m recurrent_model --checkpoint DIR --prompt "..." [--chat] [--num-steps 32]
    [--exit kl --threshold 5e-4] [--draft-steps 4 --lookahead 8] [--cache-budget 16]
    [--continuous] [--sample --temperature 0.8 --top-p 0.9] [--max-new-tokens 128] [--compile]
    [--diffusion --inner-recurrence 4 --headway 1 --exit-t 0.03 --freeze-strategy latent-diff]

Bad arguments are refused in one line naming the flags, before torch is imported. Long work
prints its estimate and then a progress line every few seconds on stderr (cli_progress.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from .criteria import freeze_strategies, names  # the criterion registry imports no torch

# torch and the model are imported only after the arguments are checked (see main): an argument
# error then costs no import time.
if TYPE_CHECKING:
    import torch

    from .diffusion import DiffusionOutput

DEFAULT_NEW_TOKENS = 128


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recurrent_model",
        description="Generate text with a recurrent-depth model and show the compute per token.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (Huginn layout)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"tokens to generate (default {DEFAULT_NEW_TOKENS}, or what the context leaves)",
    )
    p.add_argument("--num-steps", type=int, default=None, help="core iterations (default: r̄)")
    p.add_argument("--exit", choices=names("generate"), help="adaptive-exit criterion")
    p.add_argument("--threshold", type=float, default=None, help="adaptive-exit threshold")
    p.add_argument("--min-steps", type=int, default=None)
    p.add_argument("--draft-steps", type=int, default=None, help="self-speculative draft depth")
    p.add_argument("--lookahead", type=int, default=None, help="tokens drafted per verify pass")
    p.add_argument("--cache-budget", type=int, default=None, help="core KV slots per token")
    p.add_argument("--continuous", action="store_true", help="warm-start each token's state")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-scale", type=float, default=1.0)
    p.add_argument("--device", default=None, help="e.g. cpu (default), cuda, cuda:1")
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16 (default: the checkpoint's own)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="decode fixed-depth through torch.compile (one-time compile cost, reported)",
    )
    d = p.add_argument_group(
        "diffusion-forcing sampler (--diffusion; --num-steps is the prefill depth)"
    )
    d.add_argument("--diffusion", action="store_true", help="decode with model.generate_diffusion")
    # No defaults here: a flag left out takes generate_diffusion's own default.
    d.add_argument("--inner-recurrence", type=int, help="core iterations per step")
    d.add_argument("--headway", type=int, help="new positions per sampler step")
    d.add_argument("--exit-t", type=float, help="latent-diff freezing threshold")
    d.add_argument("--freeze-strategy", choices=freeze_strategies(), help="when a position freezes")
    d.add_argument("--max-wavefront", type=int, help="most positions in the wave")
    return p


# Flags of the diffusion sampler, passed to generate_diffusion only when given.
DIFFUSION_ONLY = ("inner_recurrence", "headway", "exit_t", "freeze_strategy", "max_wavefront")
# Flags of the token-by-token decoder that the diffusion sampler has no use for.
DECODER_ONLY = ("exit", "threshold", "min_steps", "draft_steps", "lookahead", "cache_budget")


class UsageError(ValueError):
    """Command-line arguments that cannot be honoured together; the message names the flags."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# Integer flags that count something: each must be at least 1 when given.
COUNTS = ("max_new_tokens", "num_steps", "min_steps", "draft_steps", "lookahead", "cache_budget",
          "inner_recurrence", "headway", "max_wavefront")  # fmt: skip


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse a combination that would leave a flag silently unused, a count below 1 and an
    empty prompt; every message names the flags as typed. (The checkpoint is load_model's to
    check: a path that does not exist may be a hub id.)"""
    if not args.prompt.strip():
        raise UsageError("--prompt is empty: give some text to continue")
    for dest in COUNTS:
        value = getattr(args, dest)
        if value is not None and value < 1:
            raise UsageError(f"{_flag(dest)} must be at least 1, got {value}")
    if args.diffusion:
        given = [_flag(d) for d in DECODER_ONLY if getattr(args, d) is not None]
        if args.compile:
            given.append("--compile")
        if given:
            raise UsageError(
                f"--diffusion decodes with its own freezing rule (--freeze-strategy, --exit-t) and "
                f"cannot honour {', '.join(given)}; drop them or drop --diffusion"
            )
        return
    given = [_flag(d) for d in DIFFUSION_ONLY if getattr(args, d) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} only apply with --diffusion")
    check_decoder_flags(args)


def check_decoder_flags(args: argparse.Namespace) -> None:
    """The token-by-token decoder's flags that need another flag, or must not exceed one."""
    if args.exit is None:
        given = [_flag(d) for d in ("threshold", "min_steps") if getattr(args, d) is not None]
        if given:
            raise UsageError(
                f"{' and '.join(given)} only {'apply' if len(given) > 1 else 'applies'} with an "
                f"adaptive exit: add --exit "
                f"({', '.join(names('generate'))}) or drop {' and '.join(given)}"
            )
    if args.lookahead is not None and args.draft_steps is None:
        raise UsageError("--lookahead only applies with --draft-steps (speculative decoding)")
    if None not in (args.min_steps, args.num_steps) and args.min_steps > args.num_steps:
        raise UsageError(
            f"--min-steps {args.min_steps} exceeds --num-steps {args.num_steps} "
            "(the most iterations a token may take)"
        )
    if args.compile and (args.exit is not None or args.draft_steps is not None):
        raise UsageError(
            "--compile decodes at a fixed depth and cannot honour --exit or --draft-steps; "
            "drop one of them"
        )


def check_device(name: str | None) -> torch.device | None:
    """The device ``--device`` names, after checking that this torch build can use it."""
    if name is None:
        return None
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device {name!r} is not a device name: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        why = (
            "this torch build has no CUDA or ROCm support"
            if torch.version.cuda is None and torch.version.hip is None
            else "no GPU is visible to this torch build"
        )
        raise UsageError(f"--device {name}: {why} (torch {torch.__version__}); use --device cpu")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {name} cannot be used here: {exc}") from exc
    return device


def cache_hint(message: str, n_core: int, diffusion: bool = False) -> str:
    """The library's KV-cache error in the command line's terms (flags, not keyword arguments)."""
    if diffusion:  # the sampler shares core slots itself: only the depth and length remain
        need = message.split("; lower")[0]
        return f"{need}; lower --num-steps or --max-new-tokens"
    text = re.sub(r"\bcache_budget=(\d+)", r"--cache-budget \1", message)
    text = re.sub(r"\bcache_budget\b", "--cache-budget", text)
    text = re.sub(r"\bnum_steps / max_steps\b|\bnum_steps\b", "--num-steps", text)
    if "--cache-budget" not in text:
        text += f"; share core-layer slots with --cache-budget {4 * n_core}"
    return text


# The library's keyword arguments and the flags that set them.
KEYWORD_FLAGS = {
    "exit_criterion": "--exit",
    "exit_threshold": "--threshold",
    "max_steps": "--num-steps",
    "max_new_tokens": "--max-new-tokens",
    "do_sample": "--sample",
    "continuous_compute": "--continuous",
    **{d: _flag(d) for d in (*COUNTS, *DIFFUSION_ONLY, "temperature", "top_k", "top_p", "min_p",
                             "init_scale")},
}  # fmt: skip


def in_flags(message: str) -> str:
    """A library error message with its keyword arguments replaced by the flags that set them."""
    names = "|".join(sorted(KEYWORD_FLAGS, key=len, reverse=True))
    return re.sub(rf"\b({names})\b", lambda m: KEYWORD_FLAGS[m.group(1)], message)


class _TextStreamer:
    """Prints the decoded text as tokens arrive (row 0), collecting the iterations per token."""

    def __init__(self, tokenizer, out: TextIO) -> None:
        self.tokenizer, self.out = tokenizer, out
        self.ids: list[int] = []
        self.steps: list[int] = []
        self.printed = ""

    def __call__(self, tokens: torch.Tensor, steps: torch.Tensor) -> None:
        if int(steps[0]) == 0:  # the row already stopped
            return
        self.steps.append(int(steps[0]))
        self.append([int(tokens[0])])

    def append(self, ids: Sequence[int]) -> None:
        """Print the text that ``ids`` add to what was printed."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):
            self.out.write(text[len(self.printed) :])
            self.out.flush()
            self.printed = text


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    """Run the command line; returns the exit status (2 with a message on stderr for bad input).

    The arguments are parsed and checked before torch and the model code are imported."""
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(args, out)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """Load the model, generate and report; library errors become one line naming the flags."""
    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .families import load_model
    from .kv_cache import KVCacheTooLarge
    from .tokenizer import TokenizerError

    try:
        device = check_device(args.device)
        model = load_model(args.checkpoint, device=device, dtype=args.dtype, require_tokenizer=True)
    except (CheckpointError, ConfigError, TokenizerError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if model.family != "Huginn":
        print(f"error: this command drives Huginn's inference features; a model of the "
              f"{model.family} family generates through model.generate in Python (docs/model.md)",
              file=sys.stderr)  # fmt: skip
        return 2
    streamer = _TextStreamer(model.tokenizer, out)
    try:
        details = _generate(model, args, streamer)
    except KVCacheTooLarge as exc:
        n_core = model.config.n_layers_in_recurrent_block
        print(f"error: {cache_hint(str(exc), n_core, args.diffusion)}", file=sys.stderr)
        return 2
    except (ConfigError, TokenizerError, ValueError) as exc:
        print(f"error: {in_flags(str(exc))}", file=sys.stderr)
        return 2
    out.write("\n\n")
    if args.diffusion:
        _report_diffusion(details, out)
    else:
        _report_decode(details, streamer, out)
    return 0


def new_tokens(args: argparse.Namespace, prompt_tokens: int, block_size: int) -> int:
    """``--max-new-tokens`` (DEFAULT_NEW_TOKENS when not given), cut to what the context leaves
    after the prompt; a cut of a given value is said in one line on stderr (a prompt that leaves
    no room is the library's error)."""
    room = block_size - prompt_tokens
    if args.max_new_tokens is None:
        return min(DEFAULT_NEW_TOKENS, max(room, 0))
    if 0 < room < args.max_new_tokens:
        print(
            f"note: --max-new-tokens {args.max_new_tokens} is cut to {room}: the context holds "
            f"{block_size} tokens and the prompt takes {prompt_tokens}",
            file=sys.stderr,
        )
    return min(args.max_new_tokens, max(room, 0))


def _generate(model, args: argparse.Namespace, streamer: _TextStreamer):
    """Encode the prompt and decode with the sampler the arguments choose, streaming to
    ``streamer``; long work prints its estimate first and progress while it runs."""
    import torch

    from .cli_progress import Ticker, estimate

    tok = model.tokenizer
    if args.chat:
        ids = tok.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        ids = tok.encode(args.prompt)
    max_new = new_tokens(args, len(ids), model.config.block_size)
    steps = model.config.mean_recurrence if args.num_steps is None else args.num_steps
    guess = estimate(model, len(ids), max_new, steps) if max_new > 0 else None
    headline = guess.describe(max_new, steps) if guess is not None else ""
    sampling = dict(
        do_sample=args.sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        init_scale=args.init_scale,
        generator=torch.Generator(device=model.device).manual_seed(args.seed),
        return_details=True,
    )
    prompt = torch.tensor([ids], device=model.device)
    with Ticker(sys.stderr, max_new, lambda: len(streamer.ids), guess, headline):
        if args.diffusion:
            return _diffusion(model, args, prompt, max_new, steps, streamer, sampling)
        return _decode(model, args, prompt, max_new, streamer, sampling)


def _diffusion(model, args, prompt, max_new: int, steps: int, streamer, sampling: dict):
    """model.generate_diffusion with the flags given (others take the sampler's defaults)."""
    return model.generate_diffusion(
        prompt,
        max_new,
        num_steps=steps,
        **{d: getattr(args, d) for d in DIFFUSION_ONLY if getattr(args, d) is not None},
        continuous_compute=args.continuous,
        streamer=lambda new, *_: streamer.append(new[: max_new - len(streamer.ids)].tolist()),
        **sampling,
    )


def _decode(model, args, prompt, max_new: int, streamer, sampling: dict):
    """model.generate, token by token, with the decoder's flags."""
    if args.compile:
        print("compiling (first call only)...", file=sys.stderr, flush=True)
    return model.generate(
        prompt,
        max_new,
        num_steps=args.num_steps,
        exit_criterion=args.exit,
        exit_threshold=args.threshold,
        min_steps=args.min_steps,
        draft_steps=args.draft_steps,
        lookahead=args.lookahead,
        cache_budget=args.cache_budget,
        continuous_compute=args.continuous,
        streamer=streamer,
        compile=args.compile,
        **sampling,
    )


def _report_decode(details, streamer: _TextStreamer, out: TextIO) -> None:
    """The iterations each token took, their mean, the cache size and the compile/draft summaries."""
    out.write(f"iterations per token: {' '.join(map(str, streamer.steps))}\n")
    out.write(
        f"{len(streamer.steps)} tokens, mean {details.mean_steps:.2f} iterations per token, "
        f"KV cache {details.cache_bytes / 2**20:.1f} MiB\n"
    )
    if details.compiled:
        out.write(f"compiled decode: {details.compile_seconds:.1f} s of one-time compilation\n")
    if details.acceptance_rate is not None:
        out.write(f"speculative acceptance rate: {details.acceptance_rate:.2f}\n")


def _report_diffusion(details: DiffusionOutput, out: TextIO) -> None:
    """The sampler's per-position iterations and its summary counts."""
    new = details.sequences.shape[1] - details.prompt_length
    spent = details.recurrence_per_position[details.prompt_length : details.prompt_length + new]
    out.write(f"iterations per token: {' '.join(str(int(n)) for n in spent)}\n")
    mean = float(spent.float().mean()) if new else 0.0
    out.write(
        f"{new} tokens in {details.sampler_steps} sampler steps, mean {mean:.2f} iterations per "
        f"token, {details.core_passes} core passes over {details.tokens_forwarded} positions\n"
    )


if __name__ == "__main__":
    sys.exit(main())
