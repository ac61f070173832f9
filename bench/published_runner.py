"""Run the published implementation (seal-rg/recurrent-pretraining, recpre/raven_modeling_minimal.py)
on given weights and report its decode and prefill speed as JSON. Used by bench/bench_decode.py.

It runs in its own virtual environment (the published code needs ``transformers<4.58``, which this
project does not depend on); it never runs in tests or CI. Input: one JSON argument with
``src`` (a directory holding the package ``recpre`` with the two published files), ``weights``
(safetensors in the Huginn layout), ``config`` (RavenConfig fields), ``ids`` (the prompt),
``new``, ``steps``, ``threads``, ``repeats``, ``prefill`` ([batch, tokens, steps] or null), ``decode``
(default true; false times the prefill only);
with ``diffusion`` (a list of ``generate_diffusion_style`` keyword sets) it reports only their
greedy init_scale = 0 tokens (used by bench/bench_diffusion_published.py).
"""

from __future__ import annotations

import json
import sys
import time

import torch
from safetensors.torch import load_file


def main() -> None:
    req = json.loads(sys.argv[1])
    torch.set_num_threads(req["threads"])
    sys.path.insert(0, req["src"])
    from recpre.raven_config_minimal import RavenConfig
    from recpre.raven_modeling_minimal import RavenForCausalLM
    from transformers import GenerationConfig

    config = RavenConfig(**req["config"])
    model = RavenForCausalLM(config).eval()
    state = load_file(req["weights"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in ("freqs_cis", "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"weights do not match: missing {missing}, unexpected {unexpected}")
    dtype = getattr(torch, req.get("dtype", "float32"))
    model = model.to(dtype)
    ids = torch.tensor(req["ids"])
    gen = GenerationConfig(max_new_tokens=req["new"], do_sample=False, use_cache=True,
                           return_dict_in_generate=False)  # fmt: skip
    if req.get("diffusion"):  # bench_diffusion_published.py: generate_diffusion_style's tokens
        runs = []
        for case in req["diffusion"]:
            greedy = GenerationConfig(do_sample=False, return_dict_in_generate=True)
            out = model.generate_diffusion_style(ids, greedy, init_scale=0.0,
                                                 max_new_tokens=req["new"], **case)  # fmt: skip
            runs.append(out.sequences[0].tolist())
        print(json.dumps({"diffusion": runs}))
        return

    class Stamps:
        def __init__(self) -> None:
            self.t: list[tuple[float, float]] = []

        def put(self, value) -> None:
            self.t.append((time.perf_counter(), time.process_time()))

        def end(self) -> None:
            pass

    best = None
    for _ in range(req["repeats"] if req.get("decode", True) else 0):
        stamps = Stamps()
        t0 = time.perf_counter()
        out = model.generate_minimal(ids, gen, streamer=stamps, num_steps=req["steps"],
                                     init_scale=0.0, max_new_tokens=req["new"])  # fmt: skip
        total = time.perf_counter() - t0
        n = len(stamps.t) - 1
        wall = stamps.t[-1][0] - stamps.t[0][0]
        cpu = stamps.t[-1][1] - stamps.t[0][1]
        result = {"total": total, "rate": n / wall, "cpu_ms": 1e3 * cpu / n,
                  "tokens": out.tolist() if isinstance(out, torch.Tensor) else out.sequences.tolist()}  # fmt: skip
        if best is None or result["rate"] > best["rate"]:
            best = result
    report = {"decode": best} if best is not None else {}
    if req.get("prefill"):
        batch, tokens, steps = req["prefill"]
        x = torch.randint(0, config.vocab_size, (batch, tokens),
                          generator=torch.Generator().manual_seed(3))  # fmt: skip
        times = []
        with torch.no_grad():
            for _ in range(req["repeats"] + 1):
                t0 = time.perf_counter()
                model(x, num_steps=steps, init_scale=0.0, use_cache=False)
                times.append(time.perf_counter() - t0)
        report["prefill_s"] = min(times[1:])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
