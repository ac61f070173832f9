"""The Stability tab: why the selected token converges, orbits or slides.

For one token: the leading eigenvalues of its Jacobian block at its fixed point against the unit
circle, its Lyapunov spectrum along the collected trajectory (first seed) with the running λ_1, the
log-stretch of the leading direction per sub-layer, and how far the trajectory is from the fixed point.
The cost is estimated before anything runs; the computation starts on a toggle.
"""

from __future__ import annotations

import streamlit as st

from workbench.figures import stability as stability_figures

from . import stability_compute
from .ui import Context, chart, default_tokens, table_download

MAX_K = 16


def render(ctx: Context) -> None:
    """Eigenvalues, Lyapunov spectrum, running λ_1, attribution and fixed-point distance of a token."""
    st.caption(
        "Dynamical systems say why a token behaves as it does: at a stable fixed point every "
        "eigenvalue of its Jacobian block lies inside the unit circle; a flip has one below −1, a "
        "rotation a complex pair outside (angle ≈ 2π/period), a slider one near +1."
    )
    picks = default_tokens(ctx.tokens, 1)
    position = ctx.token_picker("Token", "stab_token", picks[0] if picks else 0)
    h = ctx.model.config.n_embd
    k = int(
        st.number_input("Eigenvalues and exponents (k)", 1, min(MAX_K, h), min(8, h), key="stab_k")
    )
    steps = ctx.traj.num_steps
    guess = stability_compute.estimate(ctx.model, position + 1, steps, k)
    parts = "fixed point, Arnoldi, Lyapunov exponents"
    parts += " and attribution" if getattr(ctx.model, "family", "Huginn") == "Huginn" else ""
    st.write(
        f"One token over {steps} iterations with k = {k}: at most {guess.describe()} ({parts})."
    )
    if not st.toggle("Compute the stability of this token", key="stab_go"):
        return
    progress = stability_compute.stability_progress(position, guess)
    result = stability_compute.token_stability(
        ctx.model, ctx.traj, ctx.run, position, k, _progress=progress
    )
    _summary(ctx, position, result)
    left, right = st.columns(2)
    with left:
        chart(stability_figures.eigenvalue_plane(result.spectrum), "stab_eigen")
        chart(stability_figures.running_exponent(result.running, result.warmup), "stab_running")
        chart(stability_figures.fixed_point_distance(result.distances), "stab_distance")
    with right:
        chart(stability_figures.lyapunov_bars(result.exponents), "stab_lyapunov")
        if result.attribution is None:
            st.info(
                "The stretch attribution splits an iteration into Huginn's adapter and sandwich "
                f"sub-layers; the {ctx.model.family} family's loop has no such split."
            )
        else:
            chart(stability_figures.attribution_bars(result.attribution), "stab_attribution")
    table_download(result.spectrum, "eigenvalues")


def _summary(ctx: Context, position: int, result: stability_compute.TokenStability) -> None:
    rho = float(result.spectrum["modulus"].iloc[0])
    first = result.exponents.iloc[0]
    lam, err = float(first["exponent"]), float(first["stderr"])
    neutral = " (neutral: within its error of 0)" if bool(first["neutral"]) else ""
    if not result.converged:
        st.warning(
            f"No fixed point found for {ctx.labels[position]} (residual {result.residual:.1e}): "
            "the eigenvalues describe the map at the last state searched, not a fixed point."
        )
    verdict = "no fixed point" if not result.converged else ("stable" if rho < 1 else "unstable")
    st.write(
        f"{ctx.labels[position]}: {verdict} (largest |λ| = {rho:.4f}, residual "
        f"{result.residual:.1e}); λ_1 = {lam:.4f} ± {err:.4f} per iteration{neutral}, averaged "
        f"after the first {result.warmup} steps; the last state is "
        f"{result.distances[-1]:.2e} of ‖s*‖ from it."
    )
