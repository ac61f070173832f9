"""Suite-wide fixtures."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported in the fixture, so that tests that never use it do not pay for it
    import torch

    import recurrent_model as rm

_MAIN = sys.modules["__main__"]  # pytest's own, captured before any test runs


@pytest.fixture(autouse=True)
def _restore_main_module() -> Iterator[None]:
    """Streamlit's AppTest installs the app script as ``sys.modules["__main__"]``; spawned worker
    processes of later tests (data preparation) would then re-run the app on start-up. Every test
    starts and ends with the real ``__main__``."""
    sys.modules["__main__"] = _MAIN
    yield
    sys.modules["__main__"] = _MAIN


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_num_threads()


@contextmanager
def _threads_kept(what: str) -> Iterator[None]:
    """Fail ``what`` (a test, a test module) if it leaves torch's thread count changed, and put the
    count back: the next test in the process (another one under another order of the files) would
    otherwise run on the count it left."""
    before = _torch_threads()
    yield
    after = _torch_threads()
    if before is not None and after != before:
        sys.modules["torch"].set_num_threads(before)
        pytest.fail(f"{what} left torch at {after} threads instead of {before}")


@pytest.fixture(autouse=True)
def _keep_torch_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    with _threads_kept(f"the test {request.node.name}"):
        yield


@pytest.fixture(scope="module", autouse=True)
def _keep_torch_threads_per_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """The same for what a module's fixtures set."""
    with _threads_kept(f"the fixtures of {request.module.__name__}"):
        yield


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for the test, the count before restored after it."""
    from recurrent_model.threads import single_thread

    with single_thread(True):
        yield


@pytest.fixture(scope="session")
def model() -> Iterator[rm.RecurrentLM]:
    """The tiny preset with the random weights of ``torch.manual_seed(0)``, in eval mode, built once
    and shared by every test that asks for ``model``.

    Tests must not mutate it (weights, config, tokenizer, train/eval mode, hooks): change a
    ``copy.deepcopy`` of it instead. At the end of the session this fixture fails if anything did.
    Building it leaves the global RNG as it was.
    """
    import torch

    import recurrent_model as rm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        shared = rm.RecurrentLM(rm.preset("tiny")).eval()
    weights = {k: v.clone() for k, v in shared.state_dict().items()}
    config = shared.config.to_dict()
    yield shared
    changed = [k for k, v in shared.state_dict().items() if not torch.equal(v, weights[k])]
    if shared.config.to_dict() != config:
        changed.append("config")
    if shared.tokenizer is not None or shared.training or shared.has_hooks():
        changed.append("tokenizer, mode or hooks")
    assert not changed, f"a test mutated the shared `model` fixture: {', '.join(changed)}"


@pytest.fixture(scope="module")
def shipped_model() -> rm.RecurrentLM:
    """checkpoints/default as ``rm.load_model`` gives it (eval mode), loaded once per module; the
    test is skipped when the checkpoint is not present."""
    import recurrent_model as rm
    from recurrent_model.standin import DEFAULT_CHECKPOINT

    if not (DEFAULT_CHECKPOINT / "model.safetensors").is_file():
        pytest.skip("checkpoints/default is not present")
    return rm.load_model(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def tiny(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """(root, config): a tiny corpus in root/corpus and a training config for it (helpers.write_config,
    data cache root/data), made once per module. The module's ``TINY`` dict sets the number of
    documents (``docs``) and keys of the train section."""
    from helpers import write_config, write_corpus

    settings = dict(getattr(request.module, "TINY", {}))
    docs = int(settings.pop("docs", 160))
    root = tmp_path_factory.mktemp("tiny")
    write_corpus(root / "corpus", docs=docs)
    return root, write_config(root / "tiny.yaml", root / "corpus", root / "data", **settings)


#: The looped-LM families every family-generic test runs on.
FAMILY_NAMES = ("huginn", "ouro", "retrofit")


def tiny_family_model(family: str) -> torch.nn.Module:
    """A tiny random model of ``family`` (seed 0), eval mode: Huginn's tiny preset; an Ouro with
    a full and a sliding-window layer; a retrofitted model with GQA. Each gets a loop count of 4."""
    import torch

    import recurrent_model as rm
    from recurrent_model.ouro import OuroConfig, OuroLM
    from recurrent_model.retrofit import RetrofitConfig, RetrofitLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if family == "huginn":
            return rm.RecurrentLM(rm.preset("tiny")).eval()
        if family == "ouro":
            config = OuroConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=96, vocab_size=512,
                                max_position_embeddings=128, layer_types=["full_attention", "sliding_attention"],
                                sliding_window=8, name="tiny-ouro")  # fmt: skip
            return OuroLM(config).eval()
        config = RetrofitConfig(n_embd=64, n_heads=4, num_key_value_heads=2, n_layers_in_prelude=1,
                                n_layers_in_recurrent_block=2, n_layers_in_coda=1,
                                intermediate_size=96, vocab_size=512, rope_theta=10000.0,
                                block_size=128, mean_recurrence=4, tie_embeddings=False,
                                init_std=0.1, name="tiny-retrofit")  # fmt: skip
        return RetrofitLM(config).eval()


@pytest.fixture(scope="session", params=FAMILY_NAMES)
def family_model(request: pytest.FixtureRequest) -> torch.nn.Module:
    """A tiny random model of each family in turn (:func:`tiny_family_model`), shared: copy it
    before changing it."""
    return tiny_family_model(request.param)
