"""Token agreement of generate_diffusion with the published ``generate_diffusion_style``.

Same random weights in both implementations, greedy, init_scale = 0 (deterministic), no stop tokens,
several parameter sets. The published modeling file is read from the fetched mirror of
seal-rg/recurrent-pretraining (``--mirror``, a bare git directory) and run in a separate process
whose ``PYTHONPATH`` holds ``transformers<4.58`` (``--published-env``: a venv's site-packages or a
``pip install --target`` directory), so this project's environment never imports it:

    pip install --target "$TMPDIR/published_env" "transformers<4.58"
    python bench/bench_diffusion_published.py [--mirror DIR] [--published-env DIR]

Two shapes: the "small" preset (l_P, l_R, l_C) = (1, 2, 1), compared with the "full" cache lookup
(the published "latest-m4-compress-s4" lookup hard-codes Huginn's l_P = 2, l_R = 4 layout), and a
(2, 4, 2) model compared with both lookups.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import recurrent_model as rm

TMP = Path(os.environ.get("TMPDIR", tempfile.gettempdir()))
MIRROR = Path("/work/.mirror/seal-rg+recurrent-pretraining/repo")
FILES = ("recpre/raven_config_minimal.py", "recpre/raven_modeling_minimal.py")

# Runs in the published environment: load the checkpoint into RavenForCausalLM, sample, print JSON.
PUBLISHED_RUNNER = """
import json, sys
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig
from raven_published.raven_config_minimal import RavenConfig
from raven_published.raven_modeling_minimal import RavenForCausalLM

ckpt, ids, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
config = RavenConfig(**json.load(open(f"{ckpt}/config.json")))
torch.set_default_dtype(torch.float32)
model = RavenForCausalLM(config).float().eval()
state = load_file(f"{ckpt}/model.safetensors")
missing, unexpected = model.load_state_dict(state, strict=False)
missing = [k for k in missing if k not in ("lm_head.weight", "freqs_cis")]  # tied; a buffer
assert not missing and not unexpected, (missing, unexpected)
model.lm_head.weight = model.transformer.wte.weight
results = []
for case in cases:
    new = case.pop("max_new_tokens")
    gc = GenerationConfig(do_sample=False, return_dict_in_generate=True, eos_token_id=None)
    out = model.generate_diffusion_style(torch.tensor([ids]), generation_config=gc, init_scale=0.0,
                                         max_new_tokens=new, **case)
    results.append(out.sequences[0].tolist())
print(json.dumps(results))
"""


def published_package(mirror: Path, into: Path) -> Path:
    """The two published modeling files as the package ``raven_published`` under ``into``."""
    package = into / "raven_published"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in FILES:
        text = subprocess.run(["git", "--git-dir", str(mirror), "show", f"HEAD:{name}"],
                              check=True, capture_output=True, text=True).stdout  # fmt: skip
        (package / Path(name).name).write_text(text)
    return into


def run_published(env: Path, package_root: Path, ckpt: Path, ids: list[int], cases: list[dict]):
    path = os.pathsep.join([str(package_root), str(env)])
    proc = subprocess.run([sys.executable, "-c", PUBLISHED_RUNNER, str(ckpt), json.dumps(ids),
                           json.dumps(cases)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path})  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the published implementation failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = [
    {"num_steps": 8, "inner_recurrence": 4},
    {"num_steps": 8, "inner_recurrence": 2, "exit_t": 0.1},
    {"num_steps": 6, "inner_recurrence": 4, "max_wavefront": 4},
    {"num_steps": 8, "inner_recurrence": 4, "continuous_compute": True},
    {"num_steps": 8, "inner_recurrence": 4, "ema_embeds": 0.0, "state_noise_mixing": 0.0},
    {"num_steps": 8, "inner_recurrence": 2, "freeze_strategy": "fixed"},
    {"num_steps": 8, "inner_recurrence": 2, "freeze_strategy": "latent-acceleration-1"},
]


def compare(name: str, config: rm.RecurrentConfig, lookups: list[str], args, root: Path) -> None:
    torch.manual_seed(0)
    model = rm.RecurrentLM(config).eval()
    ckpt = root / name.replace(" ", "_")
    model.save_pretrained(ckpt)
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    for lookup in lookups:
        cases = [{**c, "cache_lookup_strategy": lookup, "max_new_tokens": args.new} for c in CASES]
        published = run_published(args.published_env, root, ckpt, ids[0].tolist(),
                                  [dict(c) for c in cases])  # fmt: skip
        for case, theirs in zip(cases, published):
            kw = {k: v for k, v in case.items() if k != "max_new_tokens"}
            ours = model.generate_diffusion(ids, args.new, init_scale=0.0, stop_tokens=(),
                                            return_details=True, **kw)  # fmt: skip
            mine = ours.frozen[0].tolist()
            n = min(len(mine), len(theirs))
            same = mine[:n] == theirs[:n] and len(mine) == len(theirs)
            shown = {k: v for k, v in kw.items() if k != "cache_lookup_strategy"}
            print(f"{name:18} {lookup:22} {json.dumps(shown):78} {len(mine) - 16:4d} "
                  f"{len(theirs) - 16:4d} {'same' if same else 'DIFFERENT'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--published-env", type=Path, default=TMP / "published_env")
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--shapes", default="small,huginn", help="small and/or huginn")
    args = parser.parse_args()
    if not args.mirror.is_dir() or not args.published_env.is_dir():
        raise SystemExit(f"needs the mirror at {args.mirror} and transformers<4.58 installed at "
                         f"{args.published_env} (see the module docstring)")  # fmt: skip
    torch.set_num_threads(1)
    print(f"tokens of generate_diffusion vs the published generate_diffusion_style: random weights, "
          f"16-token prompt, {args.new} new tokens, greedy, init_scale 0, float32; columns: shape, "
          "cache lookup, parameters, new tokens frozen (ours, published), verdict")  # fmt: skip
    small = rm.preset("small")
    huginn = rm.preset("small", n_layers_in_prelude=2, n_layers_in_recurrent_block=4,
                       n_layers_in_coda=2)  # fmt: skip
    with tempfile.TemporaryDirectory(dir=TMP) as tmp:
        root = published_package(args.mirror, Path(tmp))
        if "small" in args.shapes:
            compare("small (1,2,1)", small, ["full"], args, root)
        if "huginn" in args.shapes:
            compare("Huginn (2,4,2)", huginn, ["full", "latest-m4-compress-s4"], args, root)


if __name__ == "__main__":
    main()
