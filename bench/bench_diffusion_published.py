"""Token agreement of generate_diffusion with the published ``generate_diffusion_style``.

Same random weights in both implementations, greedy, init_scale = 0 (deterministic), no stop tokens,
several parameter sets. The published side runs through bench/bench_decode.py's ``Published`` loader
(``bench/published_runner.py`` in its own virtual environment with ``transformers<4.58``, from a
directory holding the published ``recpre`` package), so this project's environment never imports it:

    python bench/bench_diffusion_published.py --published-python /tmp/pubvenv/bin/python \
        --published-src /tmp/pubsrc

Two shapes: the "small" preset (l_P, l_R, l_C) = (1, 2, 1), compared with the "full" cache lookup
(the published "latest-m4-compress-s4" lookup hard-codes Huginn's l_P = 2, l_R = 4 layout), and a
(2, 4, 2) model compared with both lookups.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from bench_decode import Published

import recurrent_model as rm

CASES = [
    {"num_steps": 8, "inner_recurrence": 4},
    {"num_steps": 8, "inner_recurrence": 2, "exit_t": 0.1},
    {"num_steps": 6, "inner_recurrence": 4, "max_wavefront": 4},
    {"num_steps": 8, "inner_recurrence": 4, "continuous_compute": True},
    {"num_steps": 8, "inner_recurrence": 4, "ema_embeds": 0.0, "state_noise_mixing": 0.0},
    {"num_steps": 8, "inner_recurrence": 2, "freeze_strategy": "fixed"},
    {"num_steps": 8, "inner_recurrence": 2, "freeze_strategy": "latent-acceleration-1"},
]


def compare(name: str, config: rm.RecurrentConfig, lookups: list[str], args) -> None:
    torch.manual_seed(0)
    model = rm.RecurrentLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    published = Published(args.published_python, args.published_src, model, ids, 1)
    for lookup in lookups:
        cases = [{**c, "cache_lookup_strategy": lookup} for c in CASES]
        published.request.update(new=args.new, diffusion=cases)
        theirs_all = published.run()["diffusion"]
        for kw, theirs in zip(cases, theirs_all):
            ours = model.generate_diffusion(ids, args.new, init_scale=0.0, stop_tokens=(),
                                            return_details=True, **kw)  # fmt: skip
            mine = ours.frozen[0].tolist()
            verdict = "same" if mine == theirs else "DIFFERENT"
            shown = {k: v for k, v in kw.items() if k != "cache_lookup_strategy"}
            print(f"{name:15} {lookup:22} {json.dumps(shown):72} {len(mine) - 16:4d} "
                  f"{len(theirs) - 16:4d} {verdict}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--published-python", default=None,
                        help="python of a venv with transformers<4.58")  # fmt: skip
    parser.add_argument("--published-src", default=None,
                        help="directory holding the published recpre package")  # fmt: skip
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--shapes", default="small,huginn", help="small and/or huginn")
    args = parser.parse_args()
    paths = (args.published_python, args.published_src)
    if not all(p and os.path.exists(p) for p in paths):
        print("(published implementation not given or not found: --published-python "
              f"{args.published_python}, --published-src {args.published_src}; skipped)")  # fmt: skip
        return
    torch.set_num_threads(1)
    print(f"tokens of generate_diffusion vs the published generate_diffusion_style: random weights, "
          f"16-token prompt, {args.new} new tokens, greedy, init_scale 0, float32; columns: shape, "
          "cache lookup, parameters, new tokens frozen (ours, published), verdict")  # fmt: skip
    if "small" in args.shapes:
        compare("small (1,2,1)", rm.preset("small"), ["full"], args)
    if "huginn" in args.shapes:
        huginn = rm.preset("small", n_layers_in_prelude=2, n_layers_in_recurrent_block=4,
                           n_layers_in_coda=2)  # fmt: skip
        compare("Huginn (2,4,2)", huginn, ["full", "latest-m4-compress-s4"], args)


if __name__ == "__main__":
    main()
