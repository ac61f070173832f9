"""The app's tab records and its cached analyses, without running the page: the cache key comes
from the inputs (a changed input is a fresh result, a missing key an error), and a tab registered
like docs/contributing.md says is one that serve.py opens and presses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import streamlit as st

import workbench
from apps import compute, serve, views
from apps.cached import MissingCacheKey, cached_analysis, with_key
from recurrent_model.standin import fallback_model


@dataclass
class Box:
    value: float
    cache_key: object = None


CALLS: list[float] = []


@cached_analysis(keyed=("box",), max_entries=8)
def doubled(box: Box, factor: int = 2, _note: str = "") -> float:
    CALLS.append(box.value)
    return factor * box.value


def test_a_changed_input_gives_a_fresh_result():
    st.cache_data.clear()
    CALLS.clear()
    assert doubled(Box(1.0, "a")) == 2.0
    assert doubled(Box(1.0, "a"), _note="not hashed") == 2.0  # a hit
    assert doubled(Box(5.0, "b")) == 10.0  # another key
    assert doubled(Box(5.0, "b"), factor=3) == 15.0  # another setting
    assert CALLS == [1.0, 5.0, 5.0]


def test_an_input_without_a_key_is_an_error():
    with pytest.raises(MissingCacheKey, match="box"):
        doubled(Box(1.0))
    with pytest.raises(TypeError, match="keyed names no parameter"):
        cached_analysis(keyed=("traj",), max_entries=1)(lambda box: box)


def test_trajectory_analyses_follow_the_trajectory_they_are_given():
    st.cache_data.clear()
    model = fallback_model()
    ids = model.tokenizer.encode("3 eggs")
    one = with_key(workbench.collect(model, ids, 4, seeds=(0,)), ("model", "run 1"))
    two = with_key(workbench.collect(model, ids, 4, seeds=(1,)), ("model", "run 2"))
    first, second = compute.token_correlation(one), compute.token_correlation(two)
    assert not np.allclose(first.to_numpy(dtype=float), second.to_numpy(dtype=float))
    again = compute.token_correlation(one)
    assert np.array_equal(again.to_numpy(dtype=float), first.to_numpy(dtype=float))
    with pytest.raises(MissingCacheKey):
        compute.token_correlation(workbench.collect(model, ids, 4, seeds=(2,)))


def test_a_rewritten_checkpoint_is_another_model_key(tmp_path):
    path = tmp_path / "ckpt"
    fallback_model().save_pretrained(path)
    key = compute.load(str(path), "cpu", None, compute.checkpoint_signature(path)).cache_key
    fallback_model(seed=1).save_pretrained(path)
    model = compute.load(str(path), "cpu", None, compute.checkpoint_signature(path))
    assert model.cache_key != key and str(path) in model.cache_key


@dataclass
class FakePage:
    """What screenshot_tabs uses of a Playwright page; records the tabs and buttons it clicks."""

    clicked: list[str] = field(default_factory=list)
    viewport_size: dict = field(default_factory=lambda: {"width": 800, "height": 600})

    def get_by_role(self, role: str, name: object = None, exact: bool = False) -> FakeLocator:
        return FakeLocator(self, f"{role}:{name}", found=role == "tab")

    def get_by_text(self, text: str, exact: bool = False) -> FakeLocator:
        return FakeLocator(self, f"text:{text}", found=True)

    def locator(self, selector: str) -> FakeLocator:
        return FakeLocator(self, selector, found=False)

    def set_viewport_size(self, size: dict) -> None:
        self.viewport_size = size

    def wait_for_timeout(self, ms: int) -> None: ...

    def wait_for_selector(self, selector: str, **kwargs) -> None: ...

    def evaluate(self, script: str) -> int:
        return 900

    def screenshot(self, path: str, full_page: bool) -> None:
        Path(path).write_bytes(b"png")


@dataclass
class FakeLocator:
    page: FakePage
    name: str
    found: bool

    @property
    def first(self) -> FakeLocator:
        return self

    def count(self) -> int:
        return int(self.found)

    def click(self) -> None:
        self.page.clicked.append(self.name)


def toy_render(ctx) -> None:
    st.markdown(f"Toy tab: {ctx.traj.n_tokens} tokens")


def test_a_registered_tab_is_opened_and_pressed_by_serve(monkeypatch, tmp_path):
    toy = views.Tab("Toy", toy_render, action="Go", charts=("toy_chart",))
    monkeypatch.setattr(views, "TABS", [*views.TABS, toy])
    assert serve.shown_tabs()[-1] is toy and views.titles()[-1] == "Toy"
    page = FakePage()
    shots = serve.screenshot_tabs(page, tmp_path, [views.TABS[0], toy])
    assert list(shots) == [views.TABS[0].title, "Toy"]
    assert page.clicked[-2:] == ["tab:Toy", "text:Go"]
    assert shots["Toy"].name == "01-toy.png"
