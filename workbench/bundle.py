"""Bundles: one zip that holds an analysis whole (its settings, its tables as Parquet, its figures as
HTML and PNG, and a README), to share it or to open it again later.

    path = workbench.bundle.export("runs/corpus", "corpus.zip")      # a corpus run directory
    path = workbench.bundle.export(Analysis(settings, frames, figures), "lens.zip")
    b = workbench.bundle.open("corpus.zip")
    b.tokens, b.frames["prompts"], b.settings, b.figure_html("kinds_by_source"), b.readme

The zip holds ``bundle.json`` (format and version, settings, frames and figures, the sha256 of
every other member, which PNGs are absent and why), ``frames/<name>.parquet``,
``figures/<name>.html`` (self-contained: plotly.js inside), ``figures/<name>.json`` (the figure as
plotly writes it, to draw it again), ``figures/<name>.png`` (through kaleido when it is installed and
finds a Chrome) and ``README.md``. A frame must survive the Parquet round
trip bit for bit (values and dtypes) or the export is refused; object columns of strings, which
Parquet reads back as ``str``, are restored to ``object``.

``open`` reads members into memory only (it never extracts) and refuses, in one line, a file that
is not a zip or is truncated, a bundle of a newer format version, a member whose name is absolute,
holds ``..`` or is a symlink, a member that is missing, unlisted or fails its checksum.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import re
import stat
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pyarrow as pa

from recurrent_model.atomic_io import fsync_path, new_file_mode, replace_durably

FORMAT = "workbench-bundle"
FORMAT_VERSION = 1
INDEX = "bundle.json"
README = "README.md"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
PACKAGES = ("recurrent-depth-workbench", "torch", "numpy", "pandas", "pyarrow", "plotly", "kaleido")


class BundleError(ValueError):
    """A bundle that cannot be written or opened; the message is one line naming the problem."""


@dataclass
class Analysis:
    """An analysis held in memory, ready to export: ``settings`` (model id, config hash, prompt,
    steps, seeds, package versions: ``analysis_settings`` fills them), ``frames`` (name →
    DataFrame) and ``figures`` (name → plotly Figure). Names are letters, digits, ``_ . -``."""

    settings: dict[str, Any]
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, go.Figure] = field(default_factory=dict)


def package_versions() -> dict[str, str]:
    """The installed version of each package an analysis's numbers depend on."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def config_hash(config: Any) -> str:
    """16 hex digits of sha256 over a model config's dict (sorted keys), or over a plain dict."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def analysis_settings(
    model: Any = None,
    *,
    prompt: str | None = None,
    num_steps: int | None = None,
    seeds: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """The settings an ``Analysis`` records: the model's id and config hash, the prompt, steps and
    seeds, any ``extra`` setting, and the package versions."""
    out: dict[str, Any] = {}
    if model is not None:
        out["model"] = str(getattr(model, "name", model))
        if getattr(model, "config", None) is not None:
            out["config_hash"] = config_hash(model.config)
    out.update(prompt=prompt, num_steps=num_steps, seeds=None if seeds is None else list(seeds))
    out.update(extra)
    out["packages"] = package_versions()
    return out


def export(
    source: str | os.PathLike | Analysis,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    png: bool = True,
) -> Path:
    """Write ``source`` (a corpus run directory or an ``Analysis``) to the zip ``path``; returns it.

    The zip is written to a hidden sibling and renamed into place, so ``path`` appears whole or
    not at all; an existing ``path`` is kept unless ``overwrite``. ``png=False`` writes HTML
    figures only (bundle.json says why the PNGs are absent, as it does when kaleido cannot run).
    """
    path = Path(path)
    if path.is_dir():
        raise BundleError(f"{path} is a directory: give the zip file's path")
    if path.exists() and not overwrite:
        raise BundleError(f"{path} exists: pass overwrite=True to replace it")
    if isinstance(source, Analysis):
        kind, origin, content = "analysis", None, source
    elif isinstance(source, (str, os.PathLike)):
        kind, origin, content = "corpus run", Path(source).name, _corpus_analysis(Path(source))
    else:
        raise BundleError(
            f"cannot export a {type(source).__name__}: give a run directory or Analysis"
        )
    members, index = _members(content, png)
    index = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "source": origin,
             "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **index}  # fmt: skip
    members[README] = _readme(index).encode()
    index["members"] = {name: _sha256(data) for name, data in members.items()}
    _write_zip(path, {INDEX: json.dumps(index, indent=2).encode(), **members}, overwrite)
    return path


def _corpus_analysis(run: Path) -> Analysis:
    """A corpus run as an Analysis: its manifest, rows, prompts, summary tables and figures."""
    from . import corpus
    from .figures import corpus as corpus_figures

    manifest = corpus.read_manifest(run)
    tokens = corpus.load(run)
    tables = corpus.summary(run, frame=tokens)
    frames = {"tokens": tokens, "prompts": corpus.load_prompts(run)}
    for key, table in tables.items():
        if isinstance(table, pd.Series):
            table = table.to_frame()
        if isinstance(table, pd.DataFrame):
            frames[f"summary_{key}"] = table
    meta = {
        k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in tables["meta"].items()
    }
    frames["summary_meta"] = pd.DataFrame([meta])
    figures = {
        "kinds_by_source": corpus_figures.kind_share_bars(tables["by_source"], "source"),
        "kinds_by_category": corpus_figures.kind_share_bars(tables["by_category"], "category"),
        "periods": corpus_figures.period_histogram_figure(tables["periods"]),
        "steps": corpus_figures.convergence_steps_figure(
            tables["steps_by_source"], tables["steps_by_difficulty"]
        ),
    }
    if tables["lambda_1"] is not None:
        figures["lambda_1"] = corpus_figures.lambda_quantiles_figure(tables["lambda_1"])
    return Analysis(manifest, frames, figures)


def _members(content: Analysis, png: bool) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every member but bundle.json and the README, and what bundle.json says of them."""
    if not isinstance(content.settings, dict):
        raise BundleError(f"settings must be a dict, got {type(content.settings).__name__}")
    for kind, names in (("frame", content.frames), ("figure", content.figures)):
        for name in names:
            if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
                raise BundleError(f"{kind} name {name!r}: use letters, digits and _ . - only")
    members: dict[str, bytes] = {}
    frames: dict[str, Any] = {}
    for name, frame in content.frames.items():
        members[f"frames/{name}.parquet"], frames[name] = _frame_bytes(name, frame)
    for name, fig in content.figures.items():
        if not isinstance(fig, go.Figure):
            raise BundleError(f"figure {name!r} is a {type(fig).__name__}, not a plotly Figure")
        members[f"figures/{name}.html"] = fig.to_html(include_plotlyjs=True).encode()
        members[f"figures/{name}.json"] = fig.to_json().encode()
    images, absent = _pngs(content.figures, png)
    for name, data in images.items():
        members[f"figures/{name}.png"] = data
    index = {
        "settings": _plain(content.settings),
        "frames": frames,
        "figures": list(content.figures),
        "png_absent": absent,
    }
    return members, index


def _frame_bytes(name: str, frame: pd.DataFrame) -> tuple[bytes, dict[str, Any]]:
    """The frame as Parquet and the dtypes to restore; refused unless it reads back equal."""
    if not isinstance(frame, pd.DataFrame):
        raise BundleError(f"frame {name!r} is a {type(frame).__name__}, not a DataFrame")
    buffer = io.BytesIO()
    try:
        frame.to_parquet(buffer)
    except (ValueError, TypeError, NotImplementedError, pa.ArrowException) as exc:
        raise BundleError(
            f"frame {name!r} cannot be written as Parquet: {_first_line(exc)}"
        ) from None
    spec = {
        "rows": len(frame),
        "columns": [str(c) for c in frame.columns],
        "object_columns": [i for i, d in enumerate(frame.dtypes) if d == np.dtype(object)],
        "object_index": [i for i in range(frame.index.nlevels)
                         if frame.index.get_level_values(i).dtype == np.dtype(object)],
    }  # fmt: skip
    data = buffer.getvalue()
    try:
        pd.testing.assert_frame_equal(frame, _read_frame(data, spec), check_exact=True)
    except AssertionError as exc:
        raise BundleError(
            f"frame {name!r} does not survive the Parquet round trip: {_first_line(exc)}"
        ) from None
    return data, spec


def _read_frame(data: bytes, spec: dict[str, Any]) -> pd.DataFrame:
    """A frame from its Parquet bytes, object columns (read back as ``str``) made object again."""
    frame = pd.read_parquet(io.BytesIO(data))
    for i in spec.get("object_columns", []):
        frame.isetitem(i, frame.iloc[:, i].astype(object))
    levels = spec.get("object_index", [])
    if levels:
        if frame.index.nlevels == 1:
            frame.index = frame.index.astype(object)
        else:
            frame.index = frame.index.set_levels(
                [frame.index.levels[i].astype(object) for i in levels], level=levels
            )
    return frame


def _pngs(figures: dict[str, go.Figure], wanted: bool) -> tuple[dict[str, bytes], dict[str, str]]:
    """Each figure as PNG through kaleido (one browser for all), or why there is none."""
    if not figures:
        return {}, {}
    if not wanted:
        return {}, {name: "not asked for (export(..., png=False))" for name in figures}
    try:
        import kaleido  # noqa: F401
    except ImportError:
        why = "kaleido is not installed (pip install kaleido, in the project's app extra)"
        return {}, {name: why for name in figures}
    names = list(figures)
    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / f"{i}.png" for i in range(len(names))]
        figs = [figures[n] for n in names]
        try:
            pio.write_images(
                figs, files, width=[f.layout.width or 700 for f in figs],
                height=[f.layout.height or 500 for f in figs],
            )  # fmt: skip
            return {n: f.read_bytes() for n, f in zip(names, files)}, {}
        except Exception as exc:  # kaleido raises many kinds (no Chrome, a crash): one line each
            why = f"kaleido could not render: {type(exc).__name__}: {_first_line(exc)}"
            return {}, {name: why for name in names}


def _readme(index: dict[str, Any]) -> str:
    """README.md: what the bundle holds and how to open it."""
    settings = index["settings"]
    lines = [
        f"# Workbench bundle: {index['kind']}" + (f" {index['source']}" if index["source"] else ""),
        "",
        f"Written {index['created']} by the recurrent-depth workbench (bundle format version "
        f"{index['format_version']}). Open it with:",
        "",
        "```python",
        "import workbench.bundle",
        'b = workbench.bundle.open("this.zip")',
        "b.settings; b.frames; b.figure(name); b.figure_html(name)",
        "```",
        "",
        "`bundle.json` holds the settings, the list of frames and figures, and the sha256 of every "
        "other member; `open` checks each of them.",
        "",
        "## Settings",
        "",
        *[f"- {k}: {_short(v)}" for k, v in settings.items()],
        "",
        "## Frames (`frames/<name>.parquet`)",
        "",
    ]
    if index["frames"]:
        lines += ["| frame | rows | columns |", "|---|---|---|"]
        for name, spec in index["frames"].items():
            lines.append(f"| {name} | {spec['rows']} | {_short(', '.join(spec['columns']), 200)} |")
    else:
        lines.append("None.")
    lines += ["", "## Figures (`figures/<name>.html`, self-contained; `.json` and `.png` beside it)",
              ""]  # fmt: skip
    absent = index["png_absent"]
    for name in index["figures"]:
        lines.append(f"- {name}" + (f" (no PNG: {absent[name]})" if name in absent else ""))
    if not index["figures"]:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def _write_zip(path: Path, members: dict[str, bytes], overwrite: bool) -> None:
    """The zip at a hidden sibling, fsynced, then renamed (``overwrite``) or linked into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp makes it private; the bundle is an ordinary file
        with os.fdopen(fd, "wb") as handle:
            with zipfile.ZipFile(handle, "w") as archive:
                for name, data in members.items():
                    packed = name.endswith((".parquet", ".png"))  # compressed already
                    info = zipfile.ZipInfo(name, date_time=dt.datetime.now().timetuple()[:6])
                    info.compress_type = zipfile.ZIP_STORED if packed else zipfile.ZIP_DEFLATED
                    archive.writestr(info, data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            replace_durably(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if path appeared meanwhile: never clobbered
            except FileExistsError:
                raise BundleError(f"{path} exists: pass overwrite=True to replace it") from None
            tmp.unlink()
            fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True, eq=False, repr=False)
class Bundle:
    """An opened bundle: ``settings``, ``frames`` (name → DataFrame; also ``bundle.<name>``),
    ``figures`` (names), ``figure(name)``, ``figure_html(name)``, ``figure_png(name)``, ``readme``
    and ``index`` (bundle.json as read)."""

    path: Path
    index: dict[str, Any]
    frames: dict[str, pd.DataFrame]
    members: dict[str, bytes]

    @property
    def settings(self) -> dict[str, Any]:
        return self.index["settings"]

    @property
    def figures(self) -> list[str]:
        return list(self.index["figures"])

    @property
    def readme(self) -> str:
        return self.members[README].decode()

    def figure_html(self, name: str) -> str:
        """The figure's self-contained HTML page."""
        return self._member(f"figures/{name}.html", name).decode()

    def figure(self, name: str) -> go.Figure | None:
        """The figure as a plotly Figure to draw again, or None when the bundle holds only its
        HTML (and PNG)."""
        self._member(f"figures/{name}.html", name)
        data = self.members.get(f"figures/{name}.json")
        return None if data is None else pio.from_json(data.decode(), skip_invalid=True)

    def figure_png(self, name: str) -> bytes | None:
        """The figure's PNG, or None when the bundle has none (``index['png_absent']`` says why)."""
        self._member(f"figures/{name}.html", name)
        return self.members.get(f"figures/{name}.png")

    def _member(self, member: str, name: str) -> bytes:
        if member not in self.members:
            raise KeyError(f"no figure {name!r} in {self.path.name} (figures: {self.figures})")
        return self.members[member]

    def __repr__(self) -> str:
        return (
            f"Bundle({str(self.path)!r}, {self.index.get('kind')}, frames={list(self.frames)}, "
            f"figures={self.figures})"
        )

    def __getattr__(self, name: str) -> pd.DataFrame:
        frames = self.__dict__.get("frames", {})
        if name in frames:
            return frames[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or frame {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("frames", {})))


def open(path: str | os.PathLike) -> Bundle:
    """Open the bundle at ``path``: every member read into memory and checked (names, presence,
    sha256, format version); anything wrong is refused with a one-line ``BundleError``."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            for info in infos:
                _check_member_name(path, info)
            names = [info.filename for info in infos]
            if len(set(names)) < len(names):
                raise BundleError(f"{path}: a member name occurs twice (a malformed bundle)")
            if INDEX not in names:
                raise BundleError(f"{path}: not a workbench bundle (no {INDEX})")
            index = _read_index(path, archive.read(INDEX))
            members = {n: archive.read(n) for n in names if n != INDEX}
    except FileNotFoundError:
        raise BundleError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError) as exc:
        raise BundleError(
            f"{path}: not a readable zip (truncated or corrupt: {_first_line(exc)})"
        ) from None
    _check_members(path, index, members)
    frames = {}
    for name, spec in index["frames"].items():
        try:
            frames[name] = _read_frame(members[f"frames/{name}.parquet"], spec)
        except Exception as exc:  # pyarrow raises many kinds for a bad file: one line each
            raise BundleError(
                f"{path}: frame {name!r} cannot be read: {_first_line(exc)}"
            ) from None
    return Bundle(path, index, frames, members)


def _check_member_name(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse a member that could land outside a folder it were extracted to, or a symlink."""
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name) or ".." in parts:
        raise BundleError(f"{path}: member {name!r} escapes the bundle (absolute or '..'): refused")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise BundleError(f"{path}: member {name!r} is a symlink: refused")


def _read_index(path: Path, data: bytes) -> dict[str, Any]:
    """bundle.json, its format and version checked (a newer version is refused)."""
    try:
        index = json.loads(data)
    except ValueError:
        raise BundleError(f"{path}: {INDEX} is not JSON (a malformed bundle)") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise BundleError(f"{path}: not a workbench bundle ({INDEX} names another format)")
    version = index.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise BundleError(f"{path}: malformed {INDEX} (format_version {version!r})")
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version} is newer than this workbench reads "
            f"(version {FORMAT_VERSION}): update the workbench"
        )
    keys = {"settings": dict, "frames": dict, "figures": list, "members": dict, "png_absent": dict}
    for key, kind in keys.items():
        if not isinstance(index.get(key), kind):
            raise BundleError(f"{path}: malformed {INDEX} (no {key} {kind.__name__})")
    return index


def _check_members(path: Path, index: dict[str, Any], members: dict[str, bytes]) -> None:
    """Every listed member present with its sha256, nothing unlisted, every frame and figure's
    member listed."""
    listed = index["members"]
    for name in members:
        if name not in listed:
            raise BundleError(f"{path}: member {name!r} is not listed in {INDEX}: refused")
    for name, digest in listed.items():
        if name not in members:
            raise BundleError(f"{path}: member {name!r} is missing (a truncated bundle)")
        if _sha256(members[name]) != digest:
            raise BundleError(f"{path}: member {name!r} fails its sha256 check (a corrupt bundle)")
    needed = [f"frames/{n}.parquet" for n in index["frames"]] + [README]
    needed += [f"figures/{n}.html" for n in index["figures"]]
    for name in needed:
        if name not in listed:
            raise BundleError(
                f"{path}: malformed {INDEX} (it names {name!r} but lists no such member)"
            )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(value: Any) -> Any:
    """Settings as JSON holds them: tuples as lists, numpy scalars as numbers, paths and other
    objects as strings."""

    def default(obj: Any) -> Any:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        if isinstance(obj, (set, frozenset)):
            return sorted(obj, key=str)
        return str(obj)

    return json.loads(json.dumps(value, default=default))
