"""Hook names as constants and builders, so callers never spell a hook as a string literal.

Step numbering is one rule everywhere: ``step`` is the core iteration that produced the activation.
``core.hook_state`` holds s_0 … s_r, so its step runs 0 … r (0 = the initial state); every other
per-iteration hook fires from iteration 1 to r. :meth:`ActivationCache.at` applies the rule.
"""

from __future__ import annotations

EMBED = "hook_embed"
E = "hook_e"
STATE = "core.hook_state"
ADAPTER = "core.hook_adapter"
LATENT = "hook_latent"
FINAL_NORM = "hook_final_norm"
LOGITS = "hook_logits"

SUBLAYER_POINTS = ("hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


def _block(part: str, index: int, point: str) -> str:
    if point not in SUBLAYER_POINTS:
        raise ValueError(f"unknown block hook point {point!r}; one of {', '.join(SUBLAYER_POINTS)}")
    if index < 0:
        raise ValueError(f"{part} layer index must be >= 0, got {index}")
    return f"{part}.{index}.{point}"


def prelude(index: int, point: str = "hook_resid_post") -> str:
    """The hook name of prelude layer ``index`` at ``point`` (e.g. ``prelude.0.hook_resid_post``)."""
    return _block("prelude", index, point)


def core(index: int, point: str = "hook_resid_post") -> str:
    """The hook name of core layer ``index`` at ``point``; it fires once per iteration, steps 1 … r."""
    return _block("core", index, point)


def coda(index: int, point: str = "hook_resid_post") -> str:
    """The hook name of coda layer ``index`` at ``point``."""
    return _block("coda", index, point)


def first_step(name: str) -> int:
    """The first step a per-iteration hook records: 0 for ``core.hook_state`` (s_0), else 1."""
    return 0 if name == STATE else 1
