"""Bundles: a corpus run and an in-memory analysis exported to one zip and opened again give equal
frames bit for bit (dtypes included), the settings, the figures and a README; the zip appears
atomically and never replaces a file unasked; and every bad bundle (newer format, truncated,
a member escaping by '..' or an absolute name or a symlink, a checksum mismatch, a missing or an
unlisted member) is refused in one line, with nothing written outside the test's folders."""

from __future__ import annotations

import json
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from workbench import bundle, corpus
from workbench.corpus.analyses import Settings
from workbench.corpus.engine import Job

PROMPTS = ["def f(x): return x + 1", "12 + 7 = 19", "The cat sat on the mat today"]


@pytest.fixture(scope="module")
def run(shipped_model, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bundle-run")
    data = root / "p.txt"
    data.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    job = Job(str(data), Settings(16, (0, 1), ("dynamics", "lens"), (1, 8)), unit_tokens=16)
    return corpus.run(shipped_model, job, root / "run", progress=False)


def awkward_frame() -> pd.DataFrame:
    """Columns Parquet could get wrong: categorical, object with None, float NaN and -0.0,
    int32, bool, nullable boolean, str; an object index with a name."""
    frame = pd.DataFrame(
        {
            "category": pd.Categorical(["a", "b", None, "a"], categories=["b", "a"]),
            "object": pd.Series(["x", None, "z", "w"], dtype=object),
            "float": [1.5, np.nan, -0.0, np.inf],
            "int32": np.arange(4, dtype=np.int32),
            "bool": [True, False, True, True],
            "nullable": pd.array([True, None, False, True], dtype="boolean"),
            "str": ["p", "q", None, "r"],
        },
        index=pd.Index(["i", "j", "k", "l"], dtype=object, name="key"),
    )
    return frame


def analysis(model=None) -> bundle.Analysis:
    settings = bundle.analysis_settings(model, prompt="def f(x):", num_steps=16, seeds=(0, 1))
    frames = {"awkward": awkward_frame(), "empty": pd.DataFrame({"a": pd.Series([], dtype=float)})}
    figure = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    return bundle.Analysis(settings, frames, {"bars": figure})


@pytest.fixture
def small(tmp_path) -> Path:
    """A valid bundle without PNGs (fast), to break in the refusal tests."""
    return bundle.export(analysis(), tmp_path / "small.zip", png=False)


def rezip(src: Path, dst: Path, replace: dict | None = None, extra=(), drop=()) -> Path:
    """A copy of the zip ``src`` with members replaced, added (ZipInfo or name, bytes) or dropped."""
    replace = replace or {}
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w") as new:
        for info in old.infolist():
            if info.filename not in drop:
                new.writestr(info.filename, replace.get(info.filename, old.read(info)))
        for info, data in extra:
            new.writestr(info, data)
    return dst


def test_a_corpus_run_round_trips(run, tmp_path):
    path = bundle.export(run, tmp_path / "run.zip")
    assert path == tmp_path / "run.zip" and sorted(p.name for p in tmp_path.iterdir()) == [
        "run.zip"
    ]
    b = bundle.open(path)
    pd.testing.assert_frame_equal(b.tokens, corpus.load(run), check_exact=True)
    pd.testing.assert_frame_equal(b.prompts, corpus.load_prompts(run), check_exact=True)
    for key, table in corpus.summary(run).items():
        if isinstance(table, pd.Series):
            table = table.to_frame()
        if isinstance(table, pd.DataFrame):
            pd.testing.assert_frame_equal(b.frames[f"summary_{key}"], table, check_exact=True)
    assert b.settings == corpus.read_manifest(run)
    assert {"kinds_by_source", "kinds_by_category", "periods", "steps"} <= set(b.figures)
    assert "plotly" in b.figure_html("kinds_by_source").lower()
    for name in b.figures:  # a PNG, or bundle.json says why not
        png = b.figure_png(name)
        assert (png is not None and png.startswith(b"\x89PNG")) or b.index["png_absent"][name]
    assert "tokens" in b.readme and "kinds_by_source" in b.readme
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        index = json.loads(archive.read("bundle.json"))
    assert {"bundle.json", "README.md", "frames/tokens.parquet", "figures/steps.html"} <= set(names)
    assert index["format_version"] == 1 and set(index["members"]) == set(names) - {"bundle.json"}


def test_an_analysis_round_trips_bit_for_bit(shipped_model, tmp_path):
    source = analysis(shipped_model)
    b = bundle.open(bundle.export(source, tmp_path / "a.zip"))
    for name, frame in source.frames.items():
        pd.testing.assert_frame_equal(b.frames[name], frame, check_exact=True)
    assert b.awkward["object"].dtype == object and b.awkward.index.dtype == object
    assert b.settings["model"] == "small" and len(b.settings["config_hash"]) == 16
    assert b.settings["seeds"] == [0, 1] and "pandas" in b.settings["packages"]
    assert b.figures == ["bars"] and "<html>" in b.figure_html("bars")
    assert b.figure("bars").to_plotly_json() == source.figures["bars"].to_plotly_json()
    with pytest.raises(AttributeError):
        _ = b.no_such_frame


def test_a_frame_parquet_cannot_hold_is_refused_in_one_line(tmp_path):
    mixed = pd.DataFrame({"mixed": pd.Series([1, "a"], dtype=object)})
    with pytest.raises(bundle.BundleError, match="frame 'mixed' cannot be written as Parquet"):
        bundle.export(bundle.Analysis({}, {"mixed": mixed}), tmp_path / "x.zip")
    with pytest.raises(bundle.BundleError, match="frame name '../up'"):
        bundle.export(bundle.Analysis({}, {"../up": awkward_frame()}), tmp_path / "x.zip")
    assert not list(tmp_path.iterdir())


def test_an_existing_path_is_kept_unless_overwrite(small, tmp_path):
    before = small.read_bytes()
    with pytest.raises(bundle.BundleError, match="exists: pass overwrite=True"):
        bundle.export(analysis(), small, png=False)
    assert small.read_bytes() == before
    bundle.export(bundle.Analysis({"n": 2}), small, overwrite=True, png=False)
    assert bundle.open(small).settings == {"n": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.zip"]  # no temporary left


def test_nothing_is_written_outside_the_target(run, tmp_path, monkeypatch):
    cwd, scratch, out = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "out"
    for folder in (cwd, scratch, out):
        folder.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = sorted(p.name for p in tmp_path.iterdir())
    b = bundle.open(bundle.export(run, out / "run.zip"))
    assert len(b.tokens) and b.readme
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not list(cwd.iterdir()) and not list(scratch.iterdir())
    assert [p.name for p in out.iterdir()] == ["run.zip"]


def refused(path: Path, match: str) -> str:
    with pytest.raises(bundle.BundleError, match=match) as info:
        bundle.open(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_newer_format_version_is_refused(small, tmp_path):
    index = json.loads(zipfile.ZipFile(small).read("bundle.json"))
    newer = json.dumps({**index, "format_version": 2}).encode()
    path = rezip(small, tmp_path / "newer.zip", {"bundle.json": newer})
    refused(path, r"format version 2 is newer than this workbench reads \(version 1\)")


def test_a_truncated_zip_is_refused(small, tmp_path):
    data = small.read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    refused(tmp_path / "cut.zip", "not a readable zip")
    (tmp_path / "text.zip").write_text("not a zip")
    refused(tmp_path / "text.zip", "not a readable zip")


@pytest.mark.parametrize("name", ["../evil.txt", "frames/../../evil.txt", "/tmp/evil.txt"])
def test_a_member_escaping_the_bundle_is_refused(small, tmp_path, name):
    path = rezip(small, tmp_path / "evil.zip", extra=[(name, b"evil")])
    refused(path, f"member '{name}' escapes the bundle")
    assert not (tmp_path.parent / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()


def test_a_symlink_member_is_refused(small, tmp_path):
    link = zipfile.ZipInfo("frames/link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    path = rezip(small, tmp_path / "link.zip", extra=[(link, b"/etc/passwd")])
    refused(path, "member 'frames/link' is a symlink")


def test_a_checksum_mismatch_a_missing_and_an_unlisted_member_are_refused(small, tmp_path):
    member = "frames/awkward.parquet"
    data = bytearray(zipfile.ZipFile(small).read(member))
    data[len(data) // 2] ^= 0xFF
    corrupt = rezip(small, tmp_path / "corrupt.zip", {member: bytes(data)})
    refused(corrupt, f"member '{member}' fails its sha256 check")
    refused(rezip(small, tmp_path / "missing.zip", drop=[member]), f"'{member}' is missing")
    unlisted = rezip(small, tmp_path / "extra.zip", extra=[("frames/x.parquet", b"x")])
    refused(unlisted, "'frames/x.parquet' is not listed in bundle.json")


@pytest.mark.parametrize("failure", ["not installed", "cannot render"])
def test_absent_pngs_are_recorded_with_the_reason(tmp_path, monkeypatch, failure):
    if failure == "not installed":
        monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido raises ImportError
    else:
        monkeypatch.setitem(sys.modules, "kaleido", sys.modules.get("kaleido", object()))

        def no_chrome(*args, **kwargs):
            raise RuntimeError("no Chrome found\nsecond line")

        monkeypatch.setattr(pio, "write_images", no_chrome)
    b = bundle.open(bundle.export(analysis(), tmp_path / "a.zip"))
    why = b.index["png_absent"]["bars"]
    expected = (
        "kaleido is not installed"
        if failure == "not installed"
        else "RuntimeError: no Chrome found"
    )
    assert expected in why and "\n" not in why
    assert b.figure_png("bars") is None and "<html>" in b.figure_html("bars")
    assert f"bars (no PNG: {why})" in b.readme
