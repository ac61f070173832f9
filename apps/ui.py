"""What every tab shares: the Context it renders from and the widgets all tabs use alike.

Tabs (``apps/tab_*.py``) import from here and from the cached computations (``apps.compute``,
``apps.intervention_compute``); nothing here imports a tab, so the modules form no cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from workbench import position_labels
from workbench._frames import printable, shown_token, token_display_strings

from . import cost
from .compute import csv_bytes
from .inputs import PromptText, RunSettings

PC_PAIRS = {"PC1 / PC2": (0, 1), "PC3 / PC4": (2, 3), "PC5 / PC6": (4, 5)}


def describe_start(model, seed: int, init_scale: float) -> str:
    """s_0 in words: "seed 0's random s_0 (init scale 1)", or the embedding for a family that starts
    every run there (Ouro)."""
    if not getattr(model, "random_initial_state", True):
        return "the embedding (s_0 is not random in this family)"
    return f"seed {seed}'s random s_0 (init scale {init_scale:g})"


@dataclass
class Context:
    """What every tab needs: the model, the collected trajectory, the keys that name them and the
    input as typed (for another model's tokenizer; None where a caller has no text)."""

    model: object
    model_key: str
    traj: object
    run: RunSettings
    prompt: PromptText | None = None

    @property
    def key(self) -> tuple:
        return (self.model_key, self.run)

    @property
    def start(self) -> str:
        """Where the shown run starts: seed 0's random s_0, or the family's own start."""
        return describe_start(self.model, self.traj.seeds[0], self.run.init_scale)

    @cached_property
    def tokens(self) -> list[str]:
        """Each position's token as printable text (\\n, <0xE4>): what every view labels."""
        if self.model.tokenizer is None:
            return [printable(t) for t in self.traj.tokens]
        return token_display_strings(self.model.tokenizer, self.traj.token_ids)

    @cached_property
    def labels(self) -> list[str]:
        """ "i: 'token'" per position, the labels of the figures and the token pickers."""
        return position_labels(self.tokens, self.traj.n_tokens)

    def token_picker(self, label: str, key: str, default: int = 0) -> int:
        """One token position, its label refreshed whenever the prompt's tokens change."""
        default = min(max(default, 0), self.traj.n_tokens - 1)
        refresh_picks(key, self.labels, [default], single=True)
        positions = list(range(self.traj.n_tokens))
        # the labels list, not a closure over self: widgets keep format_func until the next run,
        # and a reference to the model there would keep it alive past a switch
        return st.selectbox(label, positions, format_func=self.labels.__getitem__, key=key)

    def tokens_picker(self, label: str, key: str, default: Sequence[int]) -> list[int]:
        """Several token positions, refreshed like ``token_picker``."""
        refresh_picks(key, self.labels, list(default), single=False)
        positions = list(range(self.traj.n_tokens))
        return st.multiselect(label, positions, format_func=self.labels.__getitem__, key=key)


def refresh_picks(key: str, labels: list[str], default: list[int], single: bool) -> None:
    """Keep a token widget's picks in step with the current tokens before the widget is drawn.

    The browser keeps the labels it was sent, so after the prompt changes the picks are written
    again (fresh labels); picks past the new last token are dropped, and the page says which.
    """
    seen_key = f"{key}__labels"
    seen = st.session_state.get(seen_key)
    st.session_state[seen_key] = labels
    if key not in st.session_state:
        st.session_state[key] = default[0] if single else default
        return
    if seen == labels:
        return
    value = st.session_state[key]
    picks = [value] if single else list(value)
    kept = [p for p in picks if 0 <= p < len(labels)]
    dropped = [p for p in picks if p not in kept]
    if dropped:
        names = ", ".join(seen[p] if seen and p < len(seen) else str(p) for p in dropped)
        st.info(f"Dropped {names} from this token choice: the prompt has {len(labels)} tokens now.")
    if single:
        st.session_state[key] = kept[0] if kept else default[0]
    else:
        st.session_state[key] = kept


def chart(fig: go.Figure, key: str) -> None:
    st.plotly_chart(fig, key=key, width="stretch")


def download(label: str, data: Callable[[], bytes] | bytes, file_name: str, key: str) -> None:
    """A download button that does not rerun the script; ``data`` may be a lazy callable."""
    mime = "text/csv" if file_name.endswith(".csv") else "application/octet-stream"
    st.download_button(label, data, file_name=file_name, mime=mime, key=key, on_click="ignore")


def table_download(frame: pd.DataFrame, name: str) -> None:
    download(f"Download {name}.csv", lambda: csv_bytes(frame), f"{name}.csv", f"dl_{name}")


def default_tokens(tokens: Sequence[str], n: int = 3) -> list[int]:
    """Initial token choice: those holding a digit (the paper's orbiting " 3"), else the last n."""
    digits = [i for i, t in enumerate(tokens) if any(c.isdigit() for c in t)]
    return digits[:n] if digits else list(range(max(0, len(tokens) - n), len(tokens)))


def estimate_gate(what: str, guess: cost.CostEstimate, key: str, identity: object) -> bool:
    """Show a heavy action's estimate before it starts. True when it may run: at once when the
    estimate is short, else once its button was pressed for this ``identity`` (the model, the run
    and the action's settings), so later reruns redraw the cached result without asking again."""
    st.caption(f"{what}: {guess.describe()}")
    approved = st.session_state.setdefault("approved_actions", set())
    if guess.seconds <= cost.HEAVY_SECONDS or (key, identity) in approved:
        return True
    # approved in the click's callback: the rerun it starts draws the result and no button
    approve = lambda: approved.add((key, identity))  # noqa: E731
    st.button(f"Run ({guess.describe()})", key=key, on_click=approve)
    return False


def quoted_tokens(frame: pd.DataFrame, column: str = "token") -> pd.DataFrame:
    """A copy of ``frame`` with its token column as `shown_token` writes it, as the figures
    label tokens: a space or an empty token is visible in a table cell."""
    shown = frame.copy()
    shown[column] = [shown_token(t) for t in shown[column]]
    return shown
