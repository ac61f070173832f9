"""Why a token orbits or slides: its fixed point, that point's stability and the eigenvalue responsible.

For each token ``classify_dynamics`` calls an orbit or a slider, the token's fixed point is searched for
(Anderson on its block map, the other positions held at s_r, from s_r) and the leading eigenvalues of
its Jacobian block there are read (Arnoldi). The classifier's verdict is then matched with theory:

- a period-2 flip: an unstable fixed point with a real eigenvalue below −1;
- a rotation: a complex pair with |λ| ≥ 1, whose angle predicts the period 2π/|arg λ|;
- a slider: an eigenvalue near +1 (a line of near-fixed points).

A token whose fixed point is stable, or that has none within ``max_iter`` passes, is said to be so: its
orbit is then not born from that point (another attractor, or a long transient). A moving token with a
stable block after an unstable token is "driven": causal attention passes the earlier motion on.

A source token (flip, rotation, slider, unstable) also gets its block's λ_1 along the trajectory with
its standard error. A rotation whose λ_1 is within its error of 0 is *neutral*: the state turns on an
invariant circle, which neither attracts nor repels along itself; the note says so, with the complex
pair's modulus. An attracting cycle (a flip's 2-cycle, a period-locked rotation) has λ_1 < 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

import recurrent_model as rm

from .collect import collect, token_strings
from .core_map import CoreMap, LoopMap, as_batch, model_maps
from .dynamics import classify_dynamics
from .fixed_point import solve
from .lyapunov import benettin
from .spectrum import ArnoldiNoConvergence, leading_eigenvalues

#: |λ − 1| below this makes an eigenvalue "near +1" (a slider's).
SLIDER_TOL = 0.05
#: |Im λ| / |λ| below this makes an eigenvalue real.
REAL_TOL = 1e-6
#: Mechanisms that move a token by themselves (and, through attention, the tokens after it).
UNSTABLE = ("flip", "rotation", "slider", "unstable")


def classify_eigenvalue(value: complex) -> str:
    """flip (real < −1), rotation (complex, |λ| ≥ 1), slider (≈ +1), unstable, or stable."""
    real = abs(value.imag) <= REAL_TOL * max(abs(value), 1e-30)
    if real and value.real < -1:
        return "flip"
    if abs(value - 1) < SLIDER_TOL:
        return "slider"
    if not real and abs(value) >= 1:
        return "rotation"
    return "unstable" if abs(value) >= 1 else "stable"


def responsible_eigenvalue(values: np.ndarray, expected: str) -> tuple[complex, str]:
    """The eigenvalue that explains ``expected`` (flip, rotation, slider), else the largest one."""
    kinds = [classify_eigenvalue(v) for v in values]
    for value, kind in zip(values, kinds):
        if kind == expected:
            return complex(value), kind
    return complex(values[0]), kinds[0]


def expected_mechanism(kind: str, flip: bool) -> str:
    """What theory expects for a classifier verdict."""
    if kind == "slider":
        return "slider"
    if kind == "orbit":
        return "flip" if flip else "rotation"
    return "stable"


def _note(found: bool, expected: str, mechanism: str, measured: float, predicted: float) -> str:
    if not found:
        return "no fixed point found within max_iter passes"
    if mechanism == expected == "rotation":
        return f"rotation: predicted period {predicted:.2f} vs measured {measured:.2f}"
    if mechanism == expected:
        return f"{mechanism}, as the classifier's verdict predicts"
    if mechanism == "stable":
        return f"the fixed point is stable: the {expected} is not born from it"
    return f"expected a {expected} eigenvalue, the leading one is a {mechanism}"


def explain_token(
    core: CoreMap | LoopMap, context: torch.Tensor, position: int, k: int, tol: float, max_iter: int
) -> dict[str, object]:
    """Fixed point and leading eigenvalues of one token's block map, others at ``context``."""
    block = core.block(position, context)
    found = solve(block, context[position], "anderson", tol, max_iter)
    out: dict[str, object] = {
        "fixed_point_found": found.converged,
        "residual": found.residual,
        "fixed_point_passes": found.passes,
        "distance_from_final": float(
            (found.state - context[position]).norm() / context[position].norm()
        ),
    }
    out["eigenvalues"] = None
    if found.converged:
        try:
            out["eigenvalues"] = leading_eigenvalues(block, found.state, k)
        except ArnoldiNoConvergence as partial:
            out["eigenvalues"] = partial.converged if len(partial.converged) else None
            out["arnoldi_note"] = str(partial)
    return out


def explain_dynamics(
    model: rm.RecurrentLM,
    input_ids: torch.Tensor | Sequence[int],
    num_steps: int | None = None,
    *,
    k: int = 8,
    seed: int = 0,
    init_scale: float = 1.0,
    tol: float = 1e-5,
    max_iter: int = 300,
    kinds: Sequence[str] = ("orbit", "slider"),
) -> pd.DataFrame:
    """One row per token of ``kinds`` (classified on s_0 … s_num_steps, default 4 r̄): its fixed point
    and the eigenvalue responsible for what the classifier saw.

    Columns ``position``, ``token``, ``kind``, ``flip``, ``measured_period``, ``fixed_point_found``,
    ``residual``, ``fixed_point_passes``, ``distance_from_final`` (‖s* − s_r‖/‖s_r‖), ``stable``
    (NaN without a fixed point), ``spectral_radius``, ``mechanism`` (flip, rotation, slider, unstable,
    stable, driven: stable itself but after an unstable token, "no fixed point", or "no spectrum" when
    Arnoldi spent its JVP budget), ``eig_real``, ``eig_imag``, ``eig_modulus``, ``eig_angle``,
    ``predicted_period`` (2π/|angle| for a complex eigenvalue), ``note``, a sentence, and for source
    tokens (flip, rotation, slider, unstable) ``lambda_1``, ``lambda_1_stderr`` and ``neutral`` (the
    block's λ_1 over the same s_0 … s_num_steps, the last half averaged; NaN for the others).
    """
    ids = as_batch(input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"explain_dynamics takes one prompt row, got {ids.shape[0]}")
    steps = 4 * model.config.mean_recurrence if num_steps is None else int(num_steps)
    traj = collect(model, ids[0].tolist(), steps, seeds=(seed,), init_scale=init_scale,
                   normalized=False, progress=False)  # fmt: skip
    verdicts = classify_dynamics(traj.normalized_states[0])
    core = model_maps(model, ids)[0]
    context = torch.from_numpy(np.ascontiguousarray(traj.raw_states[0, -1])).to(core.dtype)
    labels = token_strings(model, ids[0].tolist())
    start = torch.from_numpy(np.ascontiguousarray(traj.raw_states[0, 0])).to(core.dtype)
    rows = []
    for position, verdict in verdicts.iterrows():
        if verdict["kind"] not in kinds:
            continue
        info = explain_token(core, context, int(position), k, tol, max_iter)
        row = _row(int(position), labels[int(position)], verdict, info)
        if row["mechanism"] in UNSTABLE:
            row.update(source_exponent(core, start, int(position), steps, seed))
            row["note"] = exponent_note(row)
        rows.append(row)
    return mark_driven(pd.DataFrame(rows, columns=COLUMNS))


def source_exponent(
    core: CoreMap | LoopMap, start: torch.Tensor, position: int, num_steps: int, seed: int
) -> dict[str, object]:
    """The token block's λ_1 from ``start`` over ``num_steps`` (the last half averaged), its error."""
    run = benettin(core, start, num_steps, 1, position, None, seed)
    return {"lambda_1": float(run.exponents[0]), "lambda_1_stderr": float(run.stderr_or_nan[0]),
            "neutral": bool(run.neutral[0])}  # fmt: skip


def exponent_note(row: dict[str, object]) -> str:
    """The note of a source token, with its λ_1 and error: a neutral rotation is an invariant circle."""
    lam, err = float(row["lambda_1"]), float(row["lambda_1_stderr"])  # type: ignore[arg-type]
    measured = f"λ_1 = {lam:+.4f} ± {err:.4f}"
    if row["mechanism"] == "rotation" and row["neutral"]:
        return (
            f"rotation on an invariant circle ({measured}, neutral): the complex pair "
            f"|λ| = {float(row['eig_modulus']):.3f} sits by the unit circle; "  # type: ignore[arg-type]
            f"predicted period {float(row['predicted_period']):.2f} vs measured "  # type: ignore[arg-type]
            f"{float(row['measured_period']):.2f}"  # type: ignore[arg-type]
        )
    kind = "neutral" if row["neutral"] else ("an attracting cycle" if lam < 0 else "expanding")
    return f"{row['note']} ({measured}: {kind})"


def mark_driven(frame: pd.DataFrame) -> pd.DataFrame:
    """A moving token whose own fixed point is stable, after a token that is not: ``driven``.

    Attention is causal, so an earlier token's flip or rotation reaches every later position; a
    later token with a stable block of its own moves because its input moves.
    """
    sources = frame.index[frame["mechanism"].isin(UNSTABLE)]
    for i in frame.index:
        row = frame.loc[i]
        earlier = [
            int(frame.at[j, "position"])
            for j in sources
            if frame.at[j, "position"] < row["position"]
        ]
        if row["mechanism"] == "stable" and row["kind"] != "fixed_point" and earlier:
            frame.at[i, "mechanism"] = "driven"
            frame.at[i, "note"] = (
                f"its own fixed point is stable: it is driven by the unstable token {earlier[0]} before it"
            )
    return frame


COLUMNS = [
    "position", "token", "kind", "flip", "measured_period", "fixed_point_found", "residual",
    "fixed_point_passes", "distance_from_final", "stable", "spectral_radius", "mechanism",
    "eig_real", "eig_imag", "eig_modulus", "eig_angle", "predicted_period", "note", "lambda_1",
    "lambda_1_stderr", "neutral",
]  # fmt: skip


def _row(
    position: int, token: str, verdict: pd.Series, info: dict[str, object]
) -> dict[str, object]:
    flip = bool(verdict.get("flip", False))
    measured = float(verdict.get("period", np.nan))
    expected = expected_mechanism(str(verdict["kind"]), flip)
    row = {"position": position, "token": token, "kind": verdict["kind"], "flip": flip,
           "measured_period": measured}  # fmt: skip
    row.update({key: info[key] for key in ("fixed_point_found", "residual", "fixed_point_passes",
                                            "distance_from_final")})  # fmt: skip
    values = info["eigenvalues"]
    if values is None:
        row.update(stable=np.nan, spectral_radius=np.nan, mechanism="no fixed point", eig_real=np.nan,
                   eig_imag=np.nan, eig_modulus=np.nan, eig_angle=np.nan, predicted_period=np.nan)  # fmt: skip
        row["note"] = _note(False, expected, "", measured, np.nan)
        if "arnoldi_note" in info:
            row.update(mechanism="no spectrum", note=str(info["arnoldi_note"]))
        return row
    value, mechanism = responsible_eigenvalue(np.asarray(values), expected)
    angle = float(np.angle(value))
    predicted = 2 * np.pi / abs(angle) if abs(value.imag) > REAL_TOL * abs(value) else np.nan
    row.update(stable=bool(np.abs(values).max() < 1), spectral_radius=float(np.abs(values).max()),
               mechanism=mechanism, eig_real=value.real, eig_imag=value.imag, eig_modulus=abs(value),
               eig_angle=angle, predicted_period=predicted)  # fmt: skip
    row["note"] = _note(True, expected, mechanism, measured, predicted)
    if "arnoldi_note" in info:
        row["note"] += f" ({info['arnoldi_note']})"
    return row
