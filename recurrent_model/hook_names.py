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

ATTN_OUT = "hook_attn_out"
RESID_MID = "hook_resid_mid"
MLP_OUT = "hook_mlp_out"
RESID_POST = "hook_resid_post"
SUBLAYER_POINTS = (ATTN_OUT, RESID_MID, MLP_OUT, RESID_POST)

PRELUDE, CORE, CODA = "prelude", "core", "coda"


def layer(part: str, index: int) -> str:
    """The name prefix of layer ``index`` of ``part`` (``prelude``, ``core`` or ``coda``): ``core.1``."""
    if part not in (PRELUDE, CORE, CODA):
        raise ValueError(f"unknown layer stack {part!r}; one of {PRELUDE}, {CORE}, {CODA}")
    if index < 0:
        raise ValueError(f"{part} layer index must be >= 0, got {index}")
    return f"{part}.{index}"


def sublayer(prefix: str, point: str) -> str:
    """The hook name of ``point`` in the block named ``prefix`` (a :func:`layer` prefix)."""
    if point not in SUBLAYER_POINTS:
        raise ValueError(f"unknown block hook point {point!r}; one of {', '.join(SUBLAYER_POINTS)}")
    return f"{prefix}.{point}"


def block(prefix: str) -> tuple[str, ...]:
    """A block's hook names in the order the block fires them (:data:`SUBLAYER_POINTS`)."""
    return tuple(sublayer(prefix, point) for point in SUBLAYER_POINTS)


def prelude(index: int, point: str = RESID_POST) -> str:
    """The hook name of prelude layer ``index`` at ``point`` (e.g. ``prelude.0.hook_resid_post``)."""
    return sublayer(layer(PRELUDE, index), point)


def core(index: int, point: str = RESID_POST) -> str:
    """The hook name of core layer ``index`` at ``point``; it fires once per iteration, steps 1 … r."""
    return sublayer(layer(CORE, index), point)


def coda(index: int, point: str = RESID_POST) -> str:
    """The hook name of coda layer ``index`` at ``point``."""
    return sublayer(layer(CODA, index), point)


def declared(n_prelude: int, n_core: int, n_coda: int) -> list[str]:
    """Every hook name of a model with these layer counts, in forward order."""

    def blocks(part: str, n: int) -> list[str]:
        return [name for i in range(n) for name in block(layer(part, i))]

    first, loop, last = blocks(PRELUDE, n_prelude), blocks(CORE, n_core), blocks(CODA, n_coda)
    return [EMBED, *first, E, STATE, ADAPTER, *loop, LATENT, *last, FINAL_NORM, LOGITS]


def check_created(created: list[str], n_prelude: int, n_core: int, n_coda: int) -> None:
    """Raise ``ValueError`` naming the difference when ``created`` is not :func:`declared`'s list."""
    expected = declared(n_prelude, n_core, n_coda)
    if created == expected:
        return
    extra = [n for n in created if n not in expected]
    missing = [n for n in expected if n not in created]
    if extra or missing:
        detail = f"created but not declared: {extra}; declared but not created: {missing}"
    elif len(created) != len(expected):
        detail = f"{len(created)} hook points for {len(expected)} declared names (a duplicate)"
    else:
        first = next(i for i, (a, b) in enumerate(zip(created, expected)) if a != b)
        detail = f"same names in another order, first at position {first}: {created[first]!r} "
        detail += f"where hook_names declares {expected[first]!r}"
    raise ValueError(f"the model's hook points differ from recurrent_model.hook_names: {detail}")


def first_step(name: str) -> int:
    """The first step a per-iteration hook records: 0 for ``core.hook_state`` (s_0), else 1."""
    return 0 if name == STATE else 1
