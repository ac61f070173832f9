"""Probes: held-out accuracy on synthetic states with and without the signal; generated arithmetic."""

import numpy as np
import pytest
import torch

import recurrent_model as rm
import workbench as wb
from workbench.arithmetic import arithmetic_dataset, arithmetic_problems, is_correct
from workbench.probes import correctness_probe, iteration_probe, trajectory_features


def test_iteration_probe_reads_a_counter_on_held_out_tokens():
    rng = np.random.default_rng(0)
    steps, T, h = 8, 40, 32
    offsets = rng.normal(size=(1, T, h))
    counter = rng.normal(size=h)
    states = (
        offsets + np.arange(steps)[:, None, None] * counter + 0.05 * rng.normal(size=(steps, T, h))
    )
    result = iteration_probe(states, seed=1, pca_dims=None)
    assert result.test_accuracy > 0.9 and result.n_test == 8 * 10 and result.chance == 1 / 8
    assert result.extra["mean_abs_step_error"] < 0.2
    noise = iteration_probe(rng.normal(size=(steps, T, h)), seed=1)
    assert noise.test_accuracy < 0.35


def test_correctness_probe_separable_and_not():
    rng = np.random.default_rng(0)
    y = np.arange(80) % 2 == 0
    x = rng.normal(size=(80, 16))
    x[:, 0] += np.where(y, 3.0, -3.0)
    good = correctness_probe(x, y)
    assert good.test_accuracy > 0.9 and good.chance == pytest.approx(0.5)
    random = correctness_probe(rng.normal(size=(80, 16)), y)
    assert random.test_accuracy < 0.8
    with pytest.raises(ValueError, match="at least 2 correct"):
        correctness_probe(x, np.zeros(80, dtype=bool))


def test_trajectory_features_and_answer_check():
    z = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2)
    np.testing.assert_allclose(trajectory_features(z, [0, 2], steps=(0, -1)), [2, 3, 8, 9])
    assert is_correct(" 12 and", "12") and not is_correct("123", "12") and not is_correct("1", "12")
    problems = arithmetic_problems(20, seed=3)
    assert problems == arithmetic_problems(20, seed=3)
    for p in problems:
        a, op, b, _ = p.prompt.split()
        assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))


class CharTokenizer:
    """A stand-in tokenizer: one token per character."""

    def encode(self, text):
        return [ord(c) % 256 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def token_strings(self, ids):
        return [chr(i) for i in ids]


def test_arithmetic_dataset_answers_and_features_agree_with_the_model():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    with pytest.raises(ValueError, match="tokenizer"):
        arithmetic_dataset(model, arithmetic_problems(1), 2)
    model.tokenizer = CharTokenizer()
    problems = arithmetic_problems(3)
    frame, features = arithmetic_dataset(
        model, problems, 2, max_new_tokens=2, feature_steps=(0, -1)
    )
    assert list(frame.columns) == ["prompt", "answer", "generated", "correct"]
    assert features.shape == (3, 2 * 64) and frame.generated.str.len().eq(2).all()
    for row, problem, feature in zip(frame.itertuples(), problems, features):
        ids = model.tokenizer.encode(problem.prompt)
        out = model.generate(
            torch.tensor([ids]), 2, num_steps=2, generator=torch.Generator().manual_seed(0),
            stop_tokens=[],
        )  # fmt: skip
        assert row.generated == model.tokenizer.decode(out[0, len(ids) :].tolist())
        assert row.correct == is_correct(row.generated, problem.answer)
        # features: the re-run trajectory of prompt + answer at the last prompt token and the answer
        states = wb.collect(model, out[0].tolist(), 2, seeds=(0,), progress=False).states[0]
        expected = trajectory_features(states, range(len(ids) - 1, len(ids) + 2), (0, -1))
        np.testing.assert_allclose(feature, expected, rtol=1e-6)
        assert not np.allclose(states[0], states[-1])  # step 0 and the last step both enter
