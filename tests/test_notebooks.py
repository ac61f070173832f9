"""The notebooks run top to bottom (kernel python3) from the repository root and from notebooks/,
their figures carry data, the claims their prose makes hold on what they computed, and they are
stored with their outputs stripped. Where a notebook has a PROSE entry, every number its markdown
quotes is compared with the value the notebook computed (tests/prose_numbers.py says how)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from prose_numbers import Quote, check

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = [
    "orbits_and_rotations.ipynb",
    "path_independence.ipynb",
    "convergence.ipynb",
    "interventions.ipynb",
    "training_dynamics.ipynb",
    "stability.ipynb",
    "corpus.ipynb",
    "families.ipynb",
]
# Where each notebook's kernel starts: JupyterLab starts it in notebooks/ (`make notebooks`), a
# kernel started elsewhere in the repository root. The slower notebooks run from one place only.
WORKING_DIRECTORIES = {
    "orbits_and_rotations.ipynb": ("notebooks", "root"),
    "path_independence.ipynb": ("root",),
    "convergence.ipynb": ("notebooks",),
    "interventions.ipynb": ("root",),
    "training_dynamics.ipynb": ("notebooks",),
    "corpus.ipynb": ("notebooks",),
}
# What each notebook's prose says, checked on its own variables after its last cell.
CLAIMS = {
    "orbits_and_rotations.ipynb": """
assert len(orbits) > 0, "the prose discusses orbiting tokens, but none orbit"
assert (kinds.to_numpy() == "orbit").all(), "the prose says every seed reaches the same orbit"
shared = attractor.loc[shown]
assert (shared.attractor_distance < shared.final_spread).all(), "a shared orbit, phase apart"
""",
    "path_independence.ipynb": """
assert summary["mean"].iloc[-1] < 1e-2 * summary["mean"].iloc[0], "the seeds do not converge"
assert (table["kind"] == "fixed_point").all(), "the prose says every token is a fixed point"
""",
    "convergence.ipynb": """
first, last = (conv[conv.step == s].distance_to_final.mean() for s in (0, STEPS))
assert last < 1e-2 * first, "the prose says the states converge"
assert corr["correlation"].max() < 0.3, "the prose says the token correlation stays below 0.3"
assert per_step["kl_to_final"].loc[8] < 1e-2, "the prose says KL < 0.01 within about 8 steps"
""",
    "interventions.ipynb": """
gap = float(patched["clean"].iloc[0] - patched["corrupted"].iloc[0])
assert abs(gap) >= 1.0, f"the default pair's clean/corrupted gap is only {gap:.3g}"
assert not patched["gap_too_small"].any()
early = by_position.loc[:, by_position.columns <= STEPS // 2]
assert early.abs().to_numpy().max() < 0.05, "the prose says early patches restore nothing"
assert by_position[STEPS].max() > 0.3, "the prose says the last steps restore part of the gap"
assert (sweep["top_token"] == sweep["top_token"].iloc[0]).all() and sweep["kl"].max() < 0.05
assert result.percentile >= 95 and result.effect > 10 * result.control_mean
""",
    "training_dynamics.ipynb": """
steps = sorted(series["step"].unique())
fig = figures.checkpoint_series_figure(series)
assert list(fig.layout.xaxis.tickvals) == steps
gain = summary["gain r=1→r̄"]
assert gain.iloc[0] <= 0 < gain.iloc[-1], "the prose says depth pays only late in training"
assert kinds["share_orbit"].iloc[-1] == 0, "the prose says no token orbits at the end"
assert (kinds["share_fixed_point"].iloc[-2:] == 1).all(), "the prose says every token settles from 2400"
""",
    "corpus.ipynb": """
assert len(frame) == 384 and len(prompts) == 8 and (prompts["tokens"] == 24).all()
assert (frame.groupby(["prompt_id", "position"])["seed_spread"].nunique() == 1).all()
assert tables["meta"]["num_steps"] == 128 and tables["meta"]["kind_agrees_across_seeds"] == 1.0
for shares in (tables["by_source"], tables["by_category"]):
    assert (shares["fixed_point"] == 1).all() and (shares["converging"] == 0).all(), "all settled"
assert tables["periods"].sum() == 0, "the prose says no token orbits"
steps = tables["steps_by_source"]
assert (steps["never"] == 0).all() and (tables["steps_by_difficulty"]["never"] == 0).all()
assert steps.loc["arithmetic", "median"] == 10 and steps.loc["code", "median"] == 13
levels = tables["steps_by_difficulty"]["median"]
assert levels["arithmetic:1"] == 6 and levels.drop("arithmetic:1").between(10, 13).all()
assert (tables["steps_by_difficulty"]["tokens"] == 48).all(), "one prompt per level"
""",
    "families.ipynb": """
assert set(frames) == {"Huginn", "Ouro", "Retrofitted"}
assert frames["Ouro"].attrs["learned_exit"] and frames["Ouro"]["exit_step"].between(1, STEPS).all()
assert not frames["Huginn"].attrs["learned_exit"] and frames["Huginn"]["exit_step"].isna().all()
if not is_fallback(models["Huginn"]):
    assert (frames["Huginn"]["kind"] == "fixed_point").all(), "the prose: every token heads for a fixed point"
""",
}


# Every number of a notebook's markdown: the expression (on the notebook's variables, after its last
# cell) each one quotes, in order, or a setting or definition the prose states (not a result).
PROSE = {
    "stability.ipynb": (
        (
            Quote("At 128 iterations", ("CLASSIFY_STEPS",)),
            Quote("44 of the 45 tokens", ("(verdicts.label == 'fixed_point').sum()", "len(ids)")),
            Quote("token 12, is still converging", ("verdicts.index[verdicts.label != 'fixed_point'][0]",)),
            Quote("about −0.05 ± 0.002, belongs to token 12", ("lambdas[slow]", "exponent_table.stderr.iloc[slow]", "slow")),
            Quote("about −0.59", ("np.median(lambdas)",)),
            Quote("in about 22 core passes", ("found.iterations",)),
            Quote("more than 10 times as many", ("plain_at_least / found.iterations",)),
            Quote("Token 12's largest eigenvalue is real and negative, about −0.96", ("slow", "spectrum.real.iloc[0]")),
            Quote("to within 0.01", ("abs(np.exp(run.exponents[0]) - rho)",)),
            Quote("Token 12's scale-free split: the adapter about −0.47", ("slow", "relative['adapter']")),
            Quote("attention about −0.06", ("relative['core.0.attn']",)),
            Quote("attention about +0.45", ("relative['core.1.attn']",)),
            Quote("less than 0.1 either way", ("relative[['core.0.mlp', 'core.1.mlp']].abs().max()",)),
            Quote("(about −0.04)", ("attribution.attrs['total_relative']",)),
            Quote("adapter at about +0.7", ("absolute['adapter']",)),
            Quote("about −0.9, the pair", ("absolute['core.0.attn']",)),
            Quote("about 3.2 ‖s‖", ("np.exp(attribution.log_scale.iloc[0])",)),
            Quote("between about −0.15 and −0.05", ("per_step.lambda_1_max.min()", "per_step.lambda_1_max.max()")),
            Quote("from about −0.76 at step 300 to about −0.60 at step 3600", ("per_step.lambda_1_mean.iloc[0]", "per_step.step.iloc[0]", "per_step.lambda_1_mean.iloc[-1]", "per_step.step.iloc[-1]")),
        ),
        (
            "a real eigenvalue below −1",  # definitions of the vocabulary
            "an eigenvalue near +1",
            "within two errors of 0",
            "s_0 = 0",
            "gets 0",
            "at 128 iterations from a random s_0",  # CLASSIFY_STEPS, quoted above too
            "(seed 0, init_scale 1)",  # the collect call's settings
            "inside the −1 boundary",
            "λ_1 < 0",
        ),
    ),
    "convergence.ipynb": (
        (
            Quote("Most tokens settle within 30 steps", ("settle.steps_to_converge.median()",)),
            Quote("take up to 50", ("settle.steps_to_converge.max()",)),
            Quote(
                "below 0.01 within about 8 steps",
                ("per_step.kl_to_final.loc[8]", "(per_step.kl_to_final < 0.01).idxmax()"),
            ),
            Quote("to about 0 at the end", ("per_step.kl_to_final.iloc[-1]",)),
            Quote("settles near 4 nats", ("per_step.entropy.iloc[-1]",)),
            Quote("stays below 0.3", ("corr.correlation.max()",)),
        ),
        ("near 1 would mean collapse",),  # a definition
    ),
    "path_independence.ipynb": (
        (
            Quote("from about 1.4 at", ("summary['mean'].iloc[0]",)),
            Quote("at step 32", ("STEPS",)),
            Quote("a larger scale (2)", ("max(INIT_SCALES)",)),
            Quote("falls from above 1", ("first['spread'].mean()",)),
        ),
        ("0 included", "s_0 = 0", '" 3" of the prompt'),
    ),
    "training_dynamics.ipynb": (
        (
            Quote("at steps 300, 1200", ("steps[0]", "steps[1]")),
            Quote("2400 and\n3600 (the final one", ("steps[2]", "steps[3]")),
            Quote("(above 3 nats)", ("series['loss'].min()",)),
            Quote("(below 2 nats here)", ("series['train_loss'].max()",)),
            Quote("at steps 300 and 1200 the loss", ("steps[0]", "steps[1]")),
            Quote("at 2400 it is", ("steps[2]",)),
            Quote("more than\n10 % lower", ("100 * gain.iloc[-1]",)),
            Quote("at step 300, nearly half at 1200", ("steps[0]", "steps[1]")),
            Quote("from step 2400 on", ("steps[2]",)),
            Quote("≈ 0", ("summary['change r̄→4r̄'].abs().max()",)),
        ),
        ("1.0 = all tokens alike", "r = 1"),
    ),
    "interventions.ipynb": (
        (
            Quote("(p ≈ 0.9)",
                  ("min(float(model(torch.tensor([ids]), num_steps=STEPS, init_scale=0.0).logits[0, -1]"
                   ".softmax(-1)[t]) for ids, t in ((clean, pair.target), (corrupted, pair.corrupted_target)))",)),
            Quote("from about +13 (clean) to about −9 (corrupted): a gap of about 22",
                  ("m_clean", "m_corrupted", "m_clean - m_corrupted")),
            Quote("(position 4)", ("where",)),
            Quote("restores exactly 1", ("everywhere.restored.iloc[-1]",)),
            Quote("(restored ≈ 1)", ("noised.restored.median()",)),
            Quote("stays below 0.05", ("sweep.kl.max()",)),
            Quote("below 1e-3 on average", ("result.control_mean",)),
            Quote("(percentile\n100 %)", ("result.percentile",)),
        ),
        ('from 7 to 5', 'logit("7") − logit("5")', "1. **", "2. **", "3. **", "## 1.", "## 2.", "## 3.",
         "iterations 4 … r", "at α = 2", "operand '4'", "column of step 0 is 0", "s_0 = 0",
         "stay at 0", '"3 + 4 = " against "3 + 2 = "', "stays '7'"),
    ),
    "corpus.ipynb": (
        (
            Quote("cut to 24 tokens", ("prompts.tokens.max()",)),
            Quote("the 8 prompts hold 192 tokens and the 2 seeds give the 384 rows",
                  ("len(prompts)", "prompts.tokens.sum()", "frame.seed.nunique()", "len(frame)")),
            Quote("At 128 steps", ("tables['meta']['num_steps']",)),
            Quote("`fixed_point` is 1.0 and `converging` 0.0",
                  ("min(tables[t]['fixed_point'].min() for t in ('by_source', 'by_category'))",
                   "max(tables[t]['converging'].max() for t in ('by_source', 'by_category'))")),
            Quote("(`kind_agrees_across_seeds` 1.0", ("tables['meta']['kind_agrees_across_seeds']",)),
            Quote("(`never` is 0.0", ("max(tables['steps_by_source'].never.max(), tables['steps_by_difficulty'].never.max())",)),
            Quote("median is 10 steps for arithmetic and 13 for code",
                  ("tables['steps_by_source'].loc['arithmetic', 'median']", "tables['steps_by_source'].loc['code', 'median']")),
            Quote("median 6)", ("tables['steps_by_difficulty'].loc['arithmetic:1', 'median']",)),
            Quote("medians of 10 to 13 steps",
                  ("tables['steps_by_difficulty']['median'].drop('arithmetic:1').min()",
                   "tables['steps_by_difficulty']['median'].drop('arithmetic:1').max()")),
            Quote("single prompt of 24 tokens with two seeds (48 rows)",
                  ("prompts.tokens.min()", "tables['steps_by_difficulty'].tokens.max()")),
        ),
        ("stays below 1e-2",),  # the steps-to-converge threshold, a setting
    ),
}  # fmt: skip


def prose_values_cell(quotes: tuple[Quote, ...]) -> str:
    """A code cell that prints every quoted expression's value as one JSON line (null for a value
    that is None: the prose check then reports that number as having no value)."""
    expressions = sorted({e for quote in quotes for e in quote.values})
    return (
        "import json as _json\n"
        f"_values = {{e: eval(e, globals()) for e in {expressions!r}}}\n"
        "_values = {e: None if v is None else float(v) for e, v in _values.items()}\n"
        "print('PROSE-VALUES', _json.dumps(_values))"
    )


def prose_problems(nb: nbformat.NotebookNode, name: str) -> list[str]:
    """The disagreements between the executed notebook's markdown and its printed values."""
    quotes, settings = PROSE[name]
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(line for line in text.splitlines() if line.startswith("PROSE-VALUES "))
    values = json.loads(line.removeprefix("PROSE-VALUES "))
    prose = "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    return check(prose, quotes, lambda e: math.nan if values[e] is None else values[e], settings)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "strip the outputs"


# Another CPU's kernel paths for the kernel's process (docs/contributing.md): torch's AVX2 kernels
# and oneDNN's AVX2 ISA. The notebooks whose prose is checked under them as well as natively.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
ON_AVX2 = ("stability.ipynb",)


def _runs():
    runs = [(name, where, "native") for name in NAMES for where in WORKING_DIRECTORIES.get(name, ("root",))]  # fmt: skip
    return runs + [(name, "root", "avx2") for name in ON_AVX2]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "where", "kernels"), _runs())
def test_notebook_runs_and_its_prose_holds(name, where, kernels, monkeypatch):
    for key, value in (AVX2 if kernels == "avx2" else {}).items():
        monkeypatch.setenv(key, value)  # the kernel process inherits the environment
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    if kernels == "avx2":
        check_path = "import torch\nassert torch.backends.cpu.get_cpu_capability() == 'AVX2'"
        nb.cells.insert(0, nbformat.v4.new_code_cell(check_path))
    if name in CLAIMS:
        nb.cells.append(nbformat.v4.new_code_cell(CLAIMS[name]))
    if name in PROSE:
        nb.cells.append(nbformat.v4.new_code_cell(prose_values_cell(PROSE[name][0])))
    cwd = NOTEBOOKS if where == "notebooks" else ROOT
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell or claim
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    if name in PROSE:
        assert prose_problems(nb, name) == []
    figures = [
        o["data"]["application/vnd.plotly.v1+json"]
        for o in outputs
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    assert len(figures) >= 3
    for figure in figures:  # every figure draws something: a trace with values, or a note
        traces = figure["data"]
        values = [
            v for t in traces for key in ("x", "y", "z", "cells") if key in t for v in [t[key]]
        ]
        assert values or figure["layout"].get("annotations"), "an empty figure"
