"""What every tab shares: the Context it renders from and the widgets all tabs use alike.

Tabs (``apps/tab_*.py``) import from here and from the cached computations (``apps.compute``,
``apps.intervention_compute``); nothing here imports a tab, so the modules form no cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from workbench import position_labels

from .compute import csv_bytes
from .inputs import RunSettings

PC_PAIRS = {"PC1 / PC2": (0, 1), "PC3 / PC4": (2, 3), "PC5 / PC6": (4, 5)}


@dataclass
class Context:
    """What every tab needs: the model, the collected trajectory and the keys that name them."""

    model: object
    model_key: str
    traj: object
    run: RunSettings

    @property
    def key(self) -> tuple:
        return (self.model_key, self.run)

    @property
    def labels(self) -> list[str]:
        return position_labels(self.traj.tokens, self.traj.n_tokens)

    def token_picker(self, label: str, key: str, default: int = 0) -> int:
        positions = list(range(self.traj.n_tokens))
        default = min(max(default, 0), len(positions) - 1)
        return st.selectbox(
            label, positions, index=default, format_func=lambda p: self.labels[p], key=key
        )


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
