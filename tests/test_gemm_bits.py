"""CPU products give the same bits on one thread and on two once ``recurrent_model`` is imported
(MKL's strict reproducibility mode), and a mode the user chose is kept."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO

from recurrent_model.gemm_bits import request_thread_independent_products

# An (11, 192) × (192, 4096) product: MKL's default mode splits its sums between threads.
PROBE = """
import recurrent_model, torch
g = torch.Generator().manual_seed(0)
x, w = torch.randn(11, 192, generator=g), torch.randn(4096, 192, generator=g)
torch.set_num_threads(1)
one = torch.nn.functional.linear(x, w)
torch.set_num_threads(2)
two = torch.nn.functional.linear(x, w)
print(torch.equal(one, two))
"""


def test_products_are_the_same_bits_on_one_and_two_threads():
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert run.stdout.strip() == "True"


def test_a_mode_the_user_set_is_kept():
    assert request_thread_independent_products({}) == "AUTO,STRICT"
    assert request_thread_independent_products({"MKL_CBWR": "AVX2"}) == "AVX2"
