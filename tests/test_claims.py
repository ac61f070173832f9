"""The census of claims (docs/claims.md) is complete and every source it names exists; the numbers of
docs/stability.md's findings agree with the committed output of the script that prints them.

What counts as a quantitative sentence (``quantitative``): in README.md, docs/*.md (claims.md aside)
and the markdown cells of notebooks/*.ipynb, a sentence (or a table row or list item) of prose that
holds a number with a unit (s, ms, µs, min, h, B, KB … GiB, tok/s, GFLOP/s, GB/s, passes, forwards, FLOPs), a
percentage, a ratio (× or x after the number, or × / ≈ before it), a parameter count (2.6M, 3.5B), or
a decimal number (0.05, 1e-5). Skipped: headings, fenced and indented code blocks, inline code (so
flags, commands and paths), link targets, version numbers (Python 3.11, torch 2.5, v1.2) and table
rows whose first cell is inline code (tables of flags, calls and commands). Plain integers without a
unit (64 steps, seed 0, 5 prompts) are settings or counts, not counted on their own.

A row of docs/claims.md covers a sentence when its claim (a short quote) occurs in that sentence of
that file. Every row's claim must occur in its file, and every path its source names must exist (a
``path::test_name`` must name a test defined in that file). Everything here reads text: no model
runs, so it takes well under a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
from prose_numbers import Quote, check

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "claims.md"
FINDINGS = ROOT / "eval" / "results" / "stability_findings.json"

UNIT = (
    r"(?:%|×|x\b|(?:ms|µs|us|ns|s|sec|min|minutes?|seconds?|hours?|h|days?|B|KB|KiB|kB|MB|MiB|GB"
    r"|GiB|TB|TiB|tok/s|tokens/s|it/s|GFLOP/s|GB/s|MB/s|passes|forwards|FLOPs?|TFLOPS?|PFLOPS?)\b)"
)
QUANT = re.compile(
    r"(?<![\w.])[−+-]?\d+(?:\.\d+)?(?:e[−+-]?\d+)?(?:[MBK]\b|\s?" + UNIT + r")"
    r"|[×≈]\s?\d|(?<![\w.])[−+-]?\d+\.\d+(?![.\d])|(?<![\w.])\d+e[−+-]?\d+"
)
VERSION = re.compile(
    r"\b(?:python|torch|pytorch|cuda|rocm|numpy|version|release|v|transformers|rccl|nccl)\s?\d+(?:\.\d+)+"
    r"|\b\d+\.\d+\.\d+\b",
    re.I,
)
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def prose_lines(text: str) -> str:
    """Markdown with headings, code blocks and tables of code (flags, calls) blanked out."""
    out, fenced = [], False
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
            out.append("")
        elif fenced or line.startswith(("    ", "\t")) or stripped.startswith("#"):
            out.append("")
        elif re.match(r"\|\s*`", stripped) or re.match(r"\|[\s:|-]+\|?$", stripped):
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def sentences(text: str) -> list[str]:
    """Sentences, table rows and list items of the prose, whitespace collapsed."""
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.) )", prose_lines(text))
    out = []
    for block in blocks:
        block = " ".join(block.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(*\[`])", block) if s]
    return out


def is_quantitative(sentence: str) -> bool:
    """Whether the sentence states a measured quantity (the rule of the module docstring)."""
    text = LINK_TARGET.sub("]", re.sub(r"`[^`]*`", "", sentence))
    return bool(QUANT.search(VERSION.sub("", text)))


def documents() -> dict[str, str]:
    """Every censused file (relative path) and its prose."""
    files = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").glob("*.md")):
        if path != CLAIMS:
            files[f"docs/{path.name}"] = path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
        files[f"notebooks/{path.name}"] = "\n\n".join(cells)
    return files


def table_rows() -> list[dict[str, str]]:
    """docs/claims.md's table: file, claim (the quote, its backticks and quotes stripped), source,
    check."""
    rows = []
    for line in CLAIMS.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 4 or cells[0] in ("file", "") or set(cells[0]) <= set(":- "):
            continue
        claim = cells[1].replace("\\|", "|")
        if claim.startswith("“") and claim.endswith("”"):
            claim = claim[1:-1]
        rows.append(
            {"file": cells[0].strip("`"), "claim": claim, "source": cells[2], "check": cells[3]}
        )
    return rows


def flat(text: str) -> str:
    return " ".join(text.split())


def test_every_quantitative_sentence_is_in_the_table():
    rows = table_rows()
    missing = []
    for name, text in documents().items():
        quotes = [r["claim"] for r in rows if r["file"] == name]
        for sentence in sentences(text):
            if is_quantitative(sentence) and not any(q in sentence for q in quotes):
                missing.append(f"{name}: {sentence[:160]}")
    assert missing == [], f"{len(missing)} quantitative sentences have no row:\n" + "\n".join(
        missing
    )


def test_every_row_quotes_its_file_and_names_sources_that_exist():
    texts, problems = documents(), []
    for row in table_rows():
        if row["file"] not in texts:
            problems.append(f"no such censused file: {row['file']}")
        elif row["claim"] not in flat(texts[row["file"]]) and not any(
            row["claim"] in s for s in sentences(texts[row["file"]])
        ):
            problems.append(f"{row['file']}: claim not found: {row['claim']}")
        sources = re.findall(r"`([^`]+)`", row["source"])
        if not sources:
            problems.append(f"{row['file']}: {row['claim']}: no source named")
        problems += [p for source in sources for p in source_problems(source)]
    assert problems == []


def source_problems(source: str) -> list[str]:
    """Why ``source`` (a path, optionally ``path::test_name``, then any arguments) fails."""
    path, _, test = source.split()[0].partition("::")
    if not (ROOT / path).exists():
        return [f"source does not exist: {source}"]
    if test and not re.search(rf"^\s*def {re.escape(test)}\(", (ROOT / path).read_text(), re.M):
        return [f"no test {test} in {path}"]
    return []


def test_the_census_rule_counts_units_and_skips_code_and_versions():
    assert is_quantitative("Anderson needs 17 passes on 2.6M parameters.")
    assert is_quantitative("a gap of 8.5 % at 0.82 s")
    assert not is_quantitative("Run it with `--steps 64` on Python 3.11 and torch 2.5.1.")
    assert not is_quantitative("Every token of 5 prompts, seed 0, 64 steps.")
    assert sentences("# 3.5 s heading\n\n    x = 1.5 s\n\nOne. Two takes 3 s.") == [
        "One.",
        "Two takes 3 s.",
    ]


def findings_values() -> dict[str, float]:
    record = json.loads(FINDINGS.read_text())
    assert record["script"] == "bench/bench_stability.py --findings"
    return record["values"]


def resolve(values: dict[str, float]):
    """A quote's value: a key of the findings file, or an expression over them (``v[key]``)."""

    def value(source: str) -> float:
        if source in values:
            return float(values[source])
        names = {"v": values, "abs": abs, "max": max, "min": min, "range": range}
        return float(eval(source, names))

    return value


def section(text: str, start: str, end: str) -> str:
    """The text from the line that starts with ``start`` to the one that starts with ``end``."""
    begin = text.index(start)
    return text[begin : text.index(end, begin)]


# docs/stability.md's findings: each number and the key of eval/results/stability_findings.json
# (written by bench/bench_stability.py --findings) it quotes, or an expression over them (v[key]).
C300, C1200, Q1200, A1200 = "flip.300.1.", "flip.1200.0.", "flip.1200.2.", "flip.1200.3."
POINT_3 = (
    Quote("has 23 tokens on period-2 orbits (period 2.000)", (C300 + "orbits", C300 + "period")),
    Quote("token 10 (", (C300 + "source",)),
    Quote("Token 10 has", (C300 + "source",)),
    Quote("in 20 passes, residual 9e-6", (C300 + "passes", C300 + "residual")),
    Quote("real, −1.099", (C300 + "real",)),
    Quote("at 8.5 %", (C300 + "distance_pct",)),
    Quote("The 22 flipping tokens", (C300 + "driven",)),
    Quote("(spectral radius 0.23–0.95)", (C300 + "after_radius_min", C300 + "after_radius_max")),
    Quote("the flip of token 10", (C300 + "source",)),
    Quote("41 of the", (C1200 + "orbits",)),
    Quote("flip from token 4", (C1200 + "source",)),
    Quote("token 4 again", (C1200 + "source",)),
    Quote("eigenvalue of −1.198", (C1200 + "real",)),
    Quote("the 40", (C1200 + "driven",)),
    Quote("(spectral radius 0.19–0.79)", (C1200 + "after_radius_min", C1200 + "after_radius_max")),
    Quote("36 tokens flip from token 6 on, but the fixed point of token 6",
          (Q1200 + "orbits", Q1200 + "source", Q1200 + "source")),
    Quote("eigenvalue of −0.984", (Q1200 + "real",)),
    Quote("the state 1.1 %", (Q1200 + "distance_pct",)),
    Quote("about 0.13", ("abs(v['flip.1200.2.real']) ** 128",)),
    Quote("29 tokens orbit with period 3.000 from token 2", (A1200 + "orbits", A1200 + "period", A1200 + "source")),
    Quote("point of token 2", (A1200 + "source",)),
    Quote("real part −1.009 and imaginary part ±0.404", (A1200 + "real", A1200 + "imag")),
    Quote("(modulus 1.087", (A1200 + "modulus",)),
    Quote("period of 2.28, not the measured 3.00", (A1200 + "predicted_period", A1200 + "measured_period")),
    Quote("at 51 %", (A1200 + "distance_pct",)),
    Quote("locks to 3", (A1200 + "period",)),
)  # fmt: skip
REL, ABS, SCALE = "attribution.relative.", "attribution.log_stretch.", "attribution.log_scale."
PLAIN_DIFF = (
    "max(abs(v['iterations.float32.plain.prompt%d' % i] - v['iterations.float64.plain.prompt%d' % i])"
    " for i in range(1, 5))"
)
FINDINGS_QUOTES = (
    Quote("187 tokens in all", ("default.tokens",)),
    Quote("all 187 tokens are fixed points at 128 iterations", ("kinds.fixed", "kinds.steps")),
    Quote("from −2.13 to −0.057 ± 0.004, median −0.71",
          ("default.48.min", "default.48.max", "default.48.max_stderr", "default.48.median")),
    Quote("from −2.12 to −0.044 ± 0.001", ("default.96.min", "default.96.max", "default.96.max_stderr")),
    Quote("(55 tokens", ("docstring.tokens",)),
    Quote("source token 5 reads λ_1 = −0.043 ± 0.015",
          ("docstring.48.source", "docstring.48.lambda_1", "docstring.48.stderr")),
    Quote("−0.017 ± 0.012", ("docstring.96.lambda_1", "docstring.96.stderr")),
    Quote("−0.001 ± 0.008", ("docstring.128.lambda_1", "docstring.128.stderr")),
    Quote("−0.001 ± 0.003", ("docstring.256.lambda_1", "docstring.256.stderr")),
    Quote("modulus 1.04 whose angle predicts the period 4.20 the classifier measures (4.18)",
          ("rotation.docstring.modulus", "rotation.docstring.predicted_period",
           "rotation.docstring.measured_period")),
    Quote("as about −0.04", ("docstring.48.lambda_1",)),
    Quote("the 20 tokens", ("spectra.tokens",)),
    Quote("from 0.22 to 0.63", ("spectra.radius_min", "spectra.radius_max")),
    Quote("complex pair at 20 of them", ("spectra.complex",)),
    Quote("(−1.49 to −0.059", ("series.300.orbit_min", "series.300.orbit_max")),
    Quote("Over 20 tokens", ("attribution.tokens",)),
    Quote("adapter +0.59 (+0.41 … +0.89), `core.0.attn` −1.07 (−1.35 … −0.86), `core.0.mlp` −0.11, "
          "`core.1.attn` −0.07, `core.1.mlp` −0.41",
          (ABS + "adapter.mean", ABS + "adapter.min", ABS + "adapter.max", ABS + "core.0.attn.mean",
           ABS + "core.0.attn.min", ABS + "core.0.attn.max", ABS + "core.0.mlp.mean",
           ABS + "core.1.attn.mean", ABS + "core.1.mlp.mean")),
    Quote("about 3.7 times ‖s‖ (log-scale +1.31, +1.15 … +1.58)",
          ("attribution.adapter_scale", SCALE + "adapter.mean", SCALE + "adapter.min", SCALE + "adapter.max")),
    Quote("bring it back (−1.01)", (SCALE + "core.0.attn.mean",)),
    Quote("adapter −0.72 (−1.02 … −0.44), `core.0.attn` −0.07 (−0.18 … +0.02), `core.0.mlp` −0.13, "
          "`core.1.attn` −0.06, `core.1.mlp` −0.10",
          (REL + "adapter.mean", REL + "adapter.min", REL + "adapter.max", REL + "core.0.attn.mean",
           REL + "core.0.attn.min", REL + "core.0.attn.max", REL + "core.0.mlp.mean",
           REL + "core.1.attn.mean", REL + "core.1.mlp.mean")),
    Quote("(relative −1.07, absolute −1.07", ("attribution.total_relative", "attribution.total")),
    Quote("(187 tokens", ("default.tokens",)),
    Quote("−0.954 / −0.876 / −0.909 / −0.876 and largest −0.052 / −0.039 / −0.115 / −0.057",
          ("series.300.mean", "series.1200.mean", "series.2400.mean", "series.3600.mean",
           "series.300.max", "series.1200.max", "series.2400.max", "series.3600.max")),
    Quote("between −0.91 and −0.88",
          ("min(v['series.1200.mean'], v['series.2400.mean'], v['series.3600.mean'])",
           "max(v['series.1200.mean'], v['series.2400.mean'], v['series.3600.mean'])")),
    Quote("23 orbiting tokens", ("series.300.orbits",)),
    Quote("106 at step", ("series.1200.orbits",)),
    Quote("Anderson a median of 17 core passes per prompt, plain iteration a median of 103",
          ("iterations.float64.anderson.median", "iterations.float64.plain.median")),
    Quote("the 5 default prompts", ("iterations.prompts",)),
    Quote("at most 5000 passes", ("iterations.cap",)),
    Quote("| float32 | 17 (14–22) | 103 (18–317) | 0 |",
          tuple(f"iterations.float32.{m}.{k}" for m in ("anderson", "plain") for k in ("median", "min", "max"))
          + ("v['iterations.float32.anderson.capped'] + v['iterations.float32.plain.capped']",)),
    Quote("| float64 | 17 (14–22) | 103 (18–230) | 0 |",
          tuple(f"iterations.float64.{m}.{k}" for m in ("anderson", "plain") for k in ("median", "min", "max"))
          + ("v['iterations.float64.anderson.capped'] + v['iterations.float64.plain.capped']",)),
    Quote("317 passes in float32 against 230", ("iterations.float32.plain.prompt0", "iterations.float64.plain.prompt0")),
    Quote("at most 2 passes", (PLAIN_DIFF,)),
) + POINT_3  # fmt: skip
# Settings and definitions the section states (not results), and the numbers it quotes from
# notebooks/stability.ipynb (token 12, the GSM8k prompt's series at 64 iterations), named there.
FINDINGS_SETTINGS = (
    "at 128 iterations from a random s_0 (init_scale 1, seed 0)", "over 48 iterations (the last 24 averaged)",
    "tolerance 1e-5", "(k = 4", "Attribution at 4 tokens per prompt after 16 iterations",
    "(steps 300, 1200, 2400, 3600; step 3600 is", "λ_1 < 0", "at 48 steps", "at 96 steps", "at 96,",
    "at 128 and", "at 256 steps", "within two errors of 0", "point 1", "point 2", "point 3", "point 4",
    "at step 300", "(4 per prompt", "token 0 left out; 16 iterations", "64 iterations",
    "48 iterations, as in", "at steps 300 / 1200 / 2400 / 3600", "steps 300 and 1200 included",
    "from step 300 to 1200", "2- and 3-cycles", "step 1200 —", "below 1e-5 at every position",
    "the −1 boundary", "below −1", "at 128 iterations (k = 4)", "first 13 tokens", "prompt's 45 tokens",
    "just inside −1", "after 128 iterations", "**1.", "**2.", "**3.", "**4.", "**5.", "**6.", "s_0 = 0",
    "2×-steps", "At step 300", "At step 1200", "max(‖s‖, 1)", "about 9 minutes", "2-core CPU",
    # notebooks/stability.ipynb
    "token 12", "−0.958", "(−0.049)", "log 0.958 = −0.043",
    "mean λ_1 −0.76, −0.71, −0.65, −0.60 and largest −0.048, −0.152, −0.115, −0.053 at steps 300, 1200, 2400, 3600",
    "by 0.17", "about 0.96 (point 2)",
)  # fmt: skip
# The cost section's sentence on the fixed point.
COST_QUOTES = (
    Quote("Anderson 14 to 22 core passes", ("iterations.float32.anderson.min", "iterations.float32.anderson.max")),
    Quote("plain iteration 18 to 317", ("iterations.float32.plain.min", "iterations.float32.plain.max")),
)  # fmt: skip
# The README's summary of the same findings.
README_QUOTES = (
    Quote("187 tokens", ("default.tokens",)),
    Quote("(−2.13 … −0.057 ± 0.004", ("default.48.min", "default.48.max", "default.48.max_stderr")),
    Quote("−0.001 ± 0.008", ("docstring.128.lambda_1", "docstring.128.stderr")),
    Quote("reads as −0.04", ("docstring.48.lambda_1",)),
    Quote("(−1.10 at step", ("flip.300.1.real",)),
    Quote("−1.20 at step", ("flip.1200.0.real",)),
    Quote("(+0.59 on average)", (ABS + "adapter.mean",)),
    Quote("first core attention (−1.07)", (ABS + "core.0.attn.mean",)),
    Quote("about 3.7 ‖s‖", ("attribution.adapter_scale",)),
    Quote("(−0.72 of −1.07 per iteration)", (REL + "adapter.mean", "attribution.total_relative")),
    Quote("a median of 17 core passes", ("iterations.float64.anderson.median",)),
    Quote("a median of 103, from 18 to 317 in float32 and 18 to 230 in float64",
          ("iterations.float64.plain.median", "iterations.float32.plain.min", "iterations.float32.plain.max",
           "iterations.float64.plain.min", "iterations.float64.plain.max")),
)  # fmt: skip
README_SETTINGS = (
    "at 128 steps", "below −1", "λ_1 < 0", "step 300,", "step 1200)", "to 1e-5",
    # bench/bench_stability.py without --findings: a recorded, timed run
    "8 Lyapunov exponents over 64 steps cost about 10 forwards", "about 0.8 s", "about 10 minutes",
)  # fmt: skip


def test_the_stability_findings_agree_with_the_script_output():
    values = findings_values()
    text = section(
        (ROOT / "docs" / "stability.md").read_text(), "## Findings", "## What a researcher"
    )
    assert check(text, FINDINGS_QUOTES, resolve(values), FINDINGS_SETTINGS) == []
    cost = section((ROOT / "docs" / "stability.md").read_text(), "A whole-sequence", "Everything")
    assert check(cost, COST_QUOTES, resolve(values), ("to 1e-5", "point 6")) == []
    readme = section(
        (ROOT / "README.md").read_text(), "On the shipped checkpoint and the four", "## "
    )
    assert check(readme, README_QUOTES, resolve(values), README_SETTINGS) == []
    # the verdicts the sentences state in words
    assert values["default.48.neutral"] == values["default.96.neutral"] == 0
    assert values["default.48.negative"] == values["default.tokens"] == values["kinds.fixed"]
    assert not values["docstring.48.neutral"]
    assert values["docstring.96.neutral"] and values["docstring.128.neutral"]
    assert values["docstring.256.neutral"]
    for i in range(5):
        f32, f64 = (values[f"iterations.{d}.anderson.prompt{i}"] for d in ("float32", "float64"))
        assert f32 == f64, "the doc says Anderson's counts agree in both precisions"
    for step in (300, 1200, 2400, 3600):
        assert values[f"series.{step}.negative"] == values["default.tokens"]


# docs/workbench.md's numbers on checkpoints/default and the key of
# eval/results/workbench_findings.json (written by eval/workbench_findings.py) each one quotes.
WORKBENCH = ROOT / "eval" / "results" / "workbench_findings.json"
D, P, Z = "dynamics.", "patching.", "zeroing."
WORKBENCH_SECTIONS = (
    (
        "On `checkpoints/default` at the app's default 32 steps",
        "No token is an orbit at this depth",
        (
            Quote("(45 tokens", (D + "tokens",)),
            Quote("7 tokens are settled", (D + "settled",)),
            Quote("all below 1.1e-4", (D + "settled_tail_max",)),
            Quote("the other 38", (D + "converging",)),
            Quote("still moving 0.2–7 %", (D + "converging_min_pct", D + "converging_max_pct")),
            Quote("6.7 %", (D + "converging_top0_pct",)),
            Quote("2.8 %", (D + "converging_top1_pct",)),
            Quote("2.6 %", (D + "converging_top2_pct",)),
            Quote("mean step 0.39–0.50", (D + "alternating_decay_min", D + "alternating_decay_max")),
        ),
        ("default 32 steps", "their last 4 steps", "`eval/results/workbench_findings.json`"),
    ),
    (
        'with `metric="logit_diff"`. On',
        "The app shows both answers",
        (
            Quote("with p = 0.866", (P + "clean.p_clean_answer",)),
            Quote(") = 1.8e-6", (P + "clean.p_corrupted_answer",)),
            Quote("with p = 0.882", (P + "corrupted.p_corrupted_answer",)),
            Quote(") = 1.5e-4", (P + "corrupted.p_clean_answer",)),
            Quote("+13.06 and −8.70, a gap of 21.8", (P + "m_clean", P + "m_corrupted", P + "gap")),
        ),
        ("(32 steps, s_0 = 0", 'answers "7"', 'run "5"', 'p("5")', 'p("7")'),
    ),
    (
        "**The patching grid in words**",
        "### Steering and ablation",
        (
            Quote("restores 0.35 at the operand", (P + "s32.operand",)),
            Quote("and 0.59 at the last", (P + "s32.last",)),
            Quote("0.02 at", (P + "s32.before_last",)),
            Quote("and 1.0 when every position", (P + "all_positions",)),
            Quote("restores −0.11", (P + "s31.operand",)),
            Quote("below 1e-3 in magnitude", (P + "before30_max",)),
            Quote("restores 1.000", (P + "hook_e.operand",)),
            Quote("at most 0.002", (P + "hook_e.others_max",)),
        ),
        ("(7 positions × 33 steps", "Positions 0–3", '"3", " +"', "exactly 0", '"4", position 4',
         "position 6", "position 5", "towards 5", "Before step 30", "at 8, 16 and 32 steps", "s_32",
         "s_31"),
    ),
    (
        "On the app's default prompt (45 tokens, ending",
        "- **The last position attends little",
        (
            Quote("a KL of 6e-7 to 1.2e-3 (median 3.3e-5; 3.6e-6",
                  (Z + "zero.last_min", Z + "zero.last_max", Z + "zero.last_median", Z + "zero.last_digit")),
            Quote("gives 2.7e-6 to 1.9e-2 (1.6e-4",
                  (Z + "negate.last_min", Z + "negate.last_max", Z + "negate.last_digit")),
            Quote("is 1.5–6.2 nats (8.8", (Z + "zero.own_min", Z + "zero.own_max", Z + "zero.own_last")),
            Quote("as much as 1.2 nats (7.2", (Z + "zero.next_max", Z + "zero.next_after_first")),
            Quote("is 0.06–1.2", (Z + "zero.mean_on_min", Z + "zero.mean_on_max")),
            Quote("p = 0.997", (Z + "p_newline",)),
        ),
        ("(45 tokens", "in 4 weeks", "32 steps", "s_0 = 0", 'digit "3"', 'for "3"'),
    ),
)  # fmt: skip


def test_the_workbench_numbers_agree_with_the_script_output():
    record = json.loads(WORKBENCH.read_text())
    assert record["script"] == "eval/workbench_findings.py"
    text = (ROOT / "docs" / "workbench.md").read_text()
    for start, end, quotes, settings in WORKBENCH_SECTIONS:
        assert check(section(text, start, end), quotes, resolve(record["values"]), settings) == []


# The dynamics census (eval/census.py → eval/results/census.json), as docs/default_checkpoint.md and
# the orbits notebook quote it.
CENSUS = ROOT / "eval" / "results" / "census.json"
OTHERS_ORBIT = (
    "[v['by_source.%s.orbit' % s] for s in ('prose', 'plain_prose', 'arithmetic', 'depth')]"
)
CENSUS_QUOTES = (
    Quote("250 held-out snippets", ("meta.prompts",)),
    Quote("from 3 seeds", ("len(v['meta.seeds'])",)),
    Quote("38,178 trajectories", ("meta.rows",)),
    Quote("at 99.8 %", ("100 * v['meta.kind_agrees_across_seeds']",)),
    Quote("97.3 % fixed points", ("100 * v['overall.all.fixed_point']",)),
    Quote("2.7 % orbits", ("100 * v['overall.all.orbit']",)),
    Quote("9.4 %", ("100 * v['by_source.code.orbit']",)),
    Quote("against 0–1.4 %", (f"100 * min({OTHERS_ORBIT})", f"100 * max({OTHERS_ORBIT})")),
)  # fmt: skip
CENSUS_SETTINGS = ("(50 each", "(periods 2, 3 and 4)")
NOTEBOOK_CENSUS_QUOTES = (
    Quote("250 held-out snippets × 3 seeds at 128 steps) finds 2.7 % of all tokens on orbits, 9.4 %",
          ("meta.prompts", "len(v['meta.seeds'])", "meta.num_steps", "100 * v['overall.all.orbit']",
           "100 * v['by_source.code.orbit']")),
)  # fmt: skip
NOTEBOOK_CENSUS_SETTINGS = (
    "section 7", '" 3" of "Claire makes a 3 egg', "(1,2), (3,4), (5,6)", "up to 128",
)  # fmt: skip


def flatten(record: dict, prefix: str = "") -> dict:
    """Nested dictionaries as one level of dotted keys (lists and numbers kept as they are)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_census_numbers_agree_with_its_result_file():
    values = flatten(json.loads(CENSUS.read_text()))
    text = section(
        (ROOT / "docs" / "default_checkpoint.md").read_text(), "- **Dynamics census**", "To see"
    )
    assert check(text, CENSUS_QUOTES, resolve(values), CENSUS_SETTINGS) == []
    periods = {key.removeprefix("periods.") for key in values if key.startswith("periods.")}
    assert values["overall.all.slider"] == 0 and periods == {"2", "3", "4"}
    nb = nbformat.read(ROOT / "notebooks" / "orbits_and_rotations.ipynb", as_version=4)
    prose = "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    assert check(prose, NOTEBOOK_CENSUS_QUOTES, resolve(values), NOTEBOOK_CENSUS_SETTINGS) == []
    assert values["by_source.prose.orbit"] == values["by_source.arithmetic.orbit"] == 0


# docs/default_checkpoint.md's results table and bullets against eval/results/results.json
# (eval/evaluate_checkpoint.py): each table row is one series over r.
RESULTS = ROOT / "eval" / "results" / "results.json"


def result_series(record: dict) -> dict[str, dict[int, float]]:
    """Every table row's label and its values by r."""
    series = {
        "validation loss": {r["steps"]: r["val_loss"] for r in record["val_loss"]},
        "held-out numpy code loss": {r["steps"]: r["loss"] for r in record["heldout_code"]},
    }
    for r in record["arithmetic"]:
        label = f"arithmetic, {r['difficulty']} digit" + ("s" if r["difficulty"] > 1 else "")
        series.setdefault(label, {})[r["steps"]] = r["accuracy"]
    names = {"carries": "carries", "variables": "variable chasing"}
    for r in record["depth_tasks"]:
        if r["kind"] in names:
            series.setdefault(f"{names[r['kind']]}, level {r['level']}", {})[r["steps"]] = r[
                "accuracy"
            ]
    return series


def result_values(record: dict) -> dict[str, float]:
    """The derived numbers the bullets quote."""
    val, code = (result_series(record)[k] for k in ("validation loss", "held-out numpy code loss"))
    r_bar = record["mean_recurrence"]
    beyond = [abs(s[r] / s[r_bar] - 1) for s in (val, code) for r in s if r > r_bar]
    spread = [
        p[k]
        for p in record["path_independence"]
        for k in ("max_final_spread", "attractor_distance")
    ]
    carries = {}
    for r in record["depth_tasks"]:
        if r["kind"] == "carries" and r["trained_level"]:
            carries.setdefault(r["level"], {})[r["steps"]] = r["accuracy"]
    first = {level: min(r for r, a in acc.items() if a >= 1.0) for level, acc in carries.items()}
    return {"val_gain": 100 * (1 - val[r_bar] / val[1]), "code_gain": 100 * (1 - code[r_bar] / code[1]),
            "beyond": 100 * max(beyond), "spread": max(spread),
            "carries_trained_min": min(max(acc.values()) for acc in carries.values()),
            "first_r_1": first[1], "first_r_6": first[6]}  # fmt: skip


def test_the_results_table_and_bullets_agree_with_the_result_file():
    record = json.loads(RESULTS.read_text())
    series, problems = result_series(record), []
    text = (ROOT / "docs" / "default_checkpoint.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| r | 1 |"))
    depths = [int(cell.split()[0]) for cell in header.strip("|").split("|")[1:]]
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        label = re.sub(r" \(.*\)$", "", cells[0])
        if not line.startswith("| ") or label not in series:
            continue
        for r, cell in zip(depths, cells[1:], strict=True):
            unit = 10.0 ** -len(cell.partition(".")[2])
            if abs(series[label][r] - float(cell)) > unit / 2 + 1e-12:
                problems.append(f"{label} at r = {r}: {cell} but {series[label][r]:.4g}")
    assert problems == []
    bullets = section(text, "What the numbers say", "- **Dynamics census**")
    quotes = (
        Quote("by 27.0 % on the validation rows and by 11.8 %", ("val_gain", "code_gain")),
        Quote("within\n  0.03 %", ("beyond",)),
        Quote("to within 1.1e-6", ("spread",)),
        Quote("learned to 1.00", ("carries_trained_min",)),
        Quote("reaches it at r = 4", ("first_r_1",)),
        Quote("at r = 8", ("first_r_6",)),
    )
    settings = ("r = 1", "by r = 4", "level 1", "level 6", "level 8", "stay at 0", "From 5 random")
    assert [row["share"] for row in record["dynamics_share"] if row["kind"] == "fixed_point"] == [
        1.0
    ]
    assert check(bullets, quotes, resolve(result_values(record)), settings) == []
