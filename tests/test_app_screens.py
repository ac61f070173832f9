"""What the app's screens show: tokens with visible whitespace, the Dynamics table's positions,
the Wavefront tab's comparison with greedy decoding, the Interventions tab's prompt pair, and an
estimate's Run button that goes once it was pressed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from apps import tab_wavefront
from workbench import figures
from workbench._frames import shown_token

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
PROMPT = "Claire makes a 3 egg omelet.\n She eats it."


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def quoted(values) -> bool:
    """Every value as `shown_token` writes it: in quotes, no raw newline."""
    return all(v.startswith("'") and v.endswith("'") and "\n" not in v for v in values)


@pytest.fixture(scope="module")
def app() -> AppTest:
    """The app on a prompt with a newline, 12 steps, one seed, s_0 = 0."""
    at = AppTest.from_file(APP, default_timeout=240)
    at.session_state["prompt"] = PROMPT
    at.run()
    at.number_input(key="steps").set_value(12)
    at.text_input(key="seeds").set_value("0")
    at.number_input(key="init_scale").set_value(0.0)
    at.run()
    assert_clean(at)
    return at


def show(at: AppTest, view: str) -> AppTest:
    at.session_state["view"] = view
    return at.run()


def test_shown_token_makes_whitespace_visible():
    assert [shown_token(t) for t in (" m", "\n", "", "\t")] == ["' m'", "'\\n'", "''", "'\\t'"]
    frame = pd.DataFrame({
        "position": [0, 0], "step": [0, 1], "token": [" m", " m"], "final_prob": [0.1, 0.9],
        "top1_token": [" ", "\n"],
    })  # fmt: skip
    cells = figures.lens_heatmap(frame).data[0].text.ravel().tolist()
    assert cells == ["' '", "'\\n'"]


def test_dynamics_table_has_a_position_column_and_quoted_tokens(app):
    show(app, "Dynamics")
    assert_clean(app)
    table = app.dataframe(key="dyn_table").value
    assert list(table.columns[:2]) == ["position", "token"]
    assert table["position"].tolist() == list(range(len(table)))
    assert quoted(table["token"]) and "'\\n'" in table["token"].tolist()
    assert not [c for c in table.columns if "_" in c]  # headers in words


def test_steering_top_tokens_are_quoted(app):
    show(app, "Interventions")
    app.radio(key="intervention_tool").set_value("Steering").run()
    assert_clean(app)
    top = next(d.value for d in app.dataframe if "baseline token" in d.value.columns)
    assert quoted(top["baseline token"]) and quoted(top["steered token"])
    app.radio(key="intervention_tool").set_value("Patching").run()


def test_interventions_states_its_pair_and_offers_the_sidebar_prompt(app):
    show(app, "Interventions")
    app.radio(key="intervention_tool").set_value("Patching").run()
    pair = app.radio(key="patch_pair")
    assert "The sidebar's prompt, one token replaced" in pair.options
    default = [i.value for i in app.info if i.value.startswith("**Clean prompt:**")]
    assert default and "The sidebar's prompt is not used" in default[0]
    pair.set_value("Corrupt a token of the prompt").run()
    assert_clean(app)
    statement = [i.value for i in app.info if i.value.startswith("**Clean prompt:**")]
    assert statement and "the sidebar's prompt" in statement[0]
    assert "Claire makes a 3 egg omelet" in statement[0] and "She eats it" in statement[0]
    app.radio(key="patch_pair").set_value("Default pair").run()


GREEDY = dict(text=" 7\n", table=pd.DataFrame({"token": [" 7", "\\n"], "steps": [8, 8]}))


def sampled(tokens: list[int], names: dict[int, str]) -> dict:
    """A diffusion_run result whose position 10 froze at step 0 (8 iterations), 11 at step 1 (16)."""
    frame = pd.DataFrame({
        "step": [0, 0, 1, 1], "position": [10, 11, 10, 11], "token": [tokens[0], 0, *tokens],
        "recurrence": [8, 4, 12, 16], "frozen": [True, False, True, True],
    })  # fmt: skip
    text = "".join(names[t] for t in tokens).replace("\\n", "\n")
    return dict(text=text, frame=frame, new_tokens=2, token_text=names)


def test_the_greedy_note_says_where_and_why_exactly_when_the_texts_differ():
    names = {1: " 7", 2: "\\n", 3: " 9"}
    request = (2, 4, 1, 0.03, "latent-diff")
    assert tab_wavefront.greedy_note(sampled([1, 2], names), GREEDY, request, 8, 0.0) is None
    note = tab_wavefront.greedy_note(sampled([3, 2], names), GREEDY, request, 8, 1.0)
    assert "from new token 1 on" in note and "' 9'" in note and "' 7'" in note
    assert "exactly 8 core iterations" in note and "less than 0.03" in note
    assert "8–16 core iterations" in note and "init scale 1" in note
    zero = tab_wavefront.greedy_note(sampled([3, 2], names), GREEDY, request, 8, 0.0)
    assert "init scale" not in zero


@pytest.mark.parametrize("changed", [False, True], ids=["as decoded", "greedy text changed"])
def test_the_wavefront_note_follows_the_greedy_text(app, monkeypatch, changed):
    from apps import compute

    seen, original, sample = [], compute.generation, compute.diffusion_run
    samples = []

    def greedy(*args, **kwargs):
        out = dict(original(*args, **kwargs))
        if changed:
            out["text"] += " and more"
        seen.append(out["text"])
        return out

    def diffusion(*args, **kwargs):
        samples.append(sample(*args, **kwargs)["text"])
        return sample(*args, **kwargs)

    monkeypatch.setattr(compute, "generation", greedy)
    monkeypatch.setattr(compute, "diffusion_run", diffusion)
    show(app, "Wavefront")
    app.number_input(key="wf_new").set_value(4)
    app.number_input(key="wf_exit_t").set_value(0.5)
    app.button[0].click().run()
    assert_clean(app)
    sampler = samples[-1]
    notes = [i.value for i in app.info if "differs from greedy decoding" in i.value]
    same = [s.value for s in app.success if "writes the same text" in s.value]
    assert seen and (sampler != seen[-1]) == bool(notes) == (not same)
    if changed:
        assert notes and seen[-1] in notes[0]


def test_a_pressed_run_button_goes_with_its_result(app, monkeypatch):
    from apps import cost

    show(app, "Wavefront")
    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)  # every estimate is heavy: each asks first
    app.number_input(key="wf_new").set_value(3)
    app.button[0].click().run()
    assert [b.key for b in app.button if b.key == "wf_go"] == ["wf_go"]
    app.button(key="wf_go").click().run()
    assert_clean(app)
    assert "wavefront_heatmap" in {c.key for c in app.get("plotly_chart")}
    assert not [b for b in app.button if b.key == "wf_go"]


def test_a_corruption_that_keeps_the_answer_is_said_in_words(app, monkeypatch):
    from apps import intervention_compute

    calls = []
    monkeypatch.setattr(intervention_compute, "answer", lambda *args: ("\\n", 0.9))
    monkeypatch.setattr(intervention_compute, "patching", lambda *a, **k: calls.append(a))
    show(app, "Interventions")
    app.radio(key="intervention_tool").set_value("Patching").run()
    app.radio(key="patch_pair").set_value("Corrupt a token of the prompt").run()
    app.button[0].click().run()
    assert not app.exception and not calls  # refused before the patching starts
    warning = [w.value for w in app.warning if w.value.startswith("Both runs answer")]
    assert warning and "'\\\\n'" in warning[0] and "logit_diff" not in warning[0]
    app.radio(key="patch_pair").set_value("Default pair").run()
