"""Regenerate the retrofitted-recurrence parity oracle in this folder (offline data, not a test).

What it is
    A tiny model in the layout that "retrofitted recurrence" (McLeish et al. 2025, arXiv 2511.07384)
    writes when it converts a Llama model, built, saved, reloaded and run by that project's own code.
    Nothing recorded here is computed by this workbench: the numbers come from the fork's
    ``RavenForCausalLM.forward`` (returned outputs and forward hooks on its modules) and, for the
    source-model check, from ``transformers.LlamaForCausalLM``.

Source code used (read from a git mirror, never copied into this repository)
    repository  github.com/LoopedLMs/retrofitting-recurrence (fork of mcleish7/retrofitting-recurrence,
                which cannot be fetched here)
    commit      3797dedd3854f40d8ace983971573ed9aace0562 (2026-03-01)
    files       convert_pretrained_model/convert_llama.py   (get_llama_huginn_config, weight_mapping)
                convert_pretrained_model/raven_modeling_minimal_llama.py  (the modeling code a converted
                    Llama model runs; README step 6 installs it as raven_modeling_minimal.py)
                convert_pretrained_model/raven_config_minimal.py  (RavenConfig, model_type "huginn_raven")
                convert_pretrained_model/common.py, __init__.py  (imported by convert_llama.py)
    The Llama modeling file is unchanged in substance since the upstream initial commit c9405b3
    (formatting and type hints only).

Versions used for the committed files
    transformers 4.51.0 (the fork pins it in pyproject.toml/uv.lock), torch 2.13.0+cpu, python 3.11,
    safetensors 0.8.0, CPU, float32.

How to run
    1. Bring the fork here (the workbench's ``fetch`` tool gives
       /work/.mirror/LoopedLMs+retrofitting-recurrence/repo, a bare git dir), or
       ``git clone --bare https://github.com/LoopedLMs/retrofitting-recurrence``.
    2. ``/work/main/.venv/bin/python -m pip install --target $TMPDIR/retro_hf "transformers==4.51.0"``
       (a private directory: it must not replace the workbench venv's transformers), then
       ``pip install --no-deps --target $TMPDIR/retro_hf accelerate``: without it 4.51.0's
       ``from_pretrained`` fails with "name 'init_empty_weights' is not defined".
    3. ``/work/main/.venv/bin/python tests/data/retrofit/regenerate.py \
            --fork-git-dir /work/.mirror/LoopedLMs+retrofitting-recurrence/repo \
            --hf-target $TMPDIR/retro_hf --work $TMPDIR/retro_regen``
    Everything fetched or generated as scratch goes under --work; only checkpoint/config.json,
    checkpoint/model.safetensors, source/config.json, source/model.safetensors,
    reference.safetensors and reference.json are written here. To check that a rerun reproduces the
    committed files, pass ``--out $TMPDIR/retro_out`` and compare them (``cmp``) before copying
    anything back.

What is built (the fork's conversion recipe, tiny sizes)
    * A fake ``models/huginn-0125`` directory: config.json = the fork's RavenConfig defaults (Huginn-0125's
      values) plus Huginn's auto_map; beside it the fork's raven_config_minimal.py and its
      raven_modeling_minimal_llama.py saved as raven_modeling_minimal.py (README step 6's end state).
    * A source Llama (transformers LlamaForCausalLM, float32, torch.manual_seed(0), initializer_range
      0.1): hidden 64, 4 heads, 2 KV heads (GQA), intermediate 96, vocab 128, 4 layers, context 64,
      rope_theta 10000, untied embeddings; every RMSNorm weight set to 1 + 0.1 * normal. Its
      ``save_pretrained`` output (config.json, model.safetensors) is kept as ``source/``: the exact
      input of the conversion, for checking a converter against the fork's.
    * ``get_llama_huginn_config(source)`` (the fork's function), then the layer counts edited as its
      main() docstring says to (prelude 1, core 2, coda 1, n_layers 4); ``AutoModelForCausalLM.from_config
      (config, trust_remote_code=True)``; ``weight_mapping(source_sd, huginn_sd, {prelude [0], core [1, 2],
      coda [3]})``; ``load_state_dict``; ``save_pretrained`` -- the body of the fork's get_llama_huginn.
      The adapter keeps the initialisation from_config gives it (the fork's Llama conversion never sets
      it; nn.Linear's default uniform init), so it is random.
    * save_pretrained also copies the two remote-code .py files next to the weights; they are published
      code and are not kept here (a loader of this folder must not need them).

What is recorded (reference.safetensors; reference.json lists every key with its meaning)
    The checkpoint is reloaded with ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True,
    torch_dtype=float32)`` as the fork's train.py does, put in eval mode, and run with no cache on
    input_ids (2, 10). s_0 is fixed: the fork's rule is random (``initialize_state``: truncated normal,
    std = config.init_values["std"], times emb_scale when that is not 1); we draw it once with that
    very function after torch.manual_seed(1) and pass it as ``input_states`` (the forward's own
    argument for a given initial state). For r in (config.mean_recurrence = 32, 1, 3):
    logits, the states s_0..s_r (s_0 and s_{i-1} from a pre-hook on transformer.adapter, the first half
    of its input; s_i from a hook on the last core block's output; s_r cross-checked against the returned
    latent_states), the prelude output e (second half of the adapter input) and the returned
    ``hidden_states`` (= ln_f(coda(s_r)), output_details return_head=True). The code never applies ln_f
    to a recurrent state, so no normalised states exist to record.
    Also, for question 3 of the investigation: the same checkpoint with the adapter set to [0 | I]
    (what the fork's convert_olmo.py does) run at r = 1, and the source Llama's own logits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

FORK_REPO = "LoopedLMs/retrofitting-recurrence"
FORK_COMMIT = "3797dedd3854f40d8ace983971573ed9aace0562"
FORK_FILES = (
    "convert_pretrained_model/__init__.py",
    "convert_pretrained_model/common.py",
    "convert_pretrained_model/convert_llama.py",
    "convert_pretrained_model/raven_config_minimal.py",
    "convert_pretrained_model/raven_modeling_minimal_llama.py",
)
HERE = Path(__file__).resolve().parent

SIZES = dict(hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=128, context=64)
MAPPING = {"prelude_idx": [0], "core_idx": [1, 2], "coda_idx": [3]}
RECURRENCES_EXTRA = (1, 3)


def git_show(git_dir: str, commit: str, path: str) -> bytes:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tmp = os.environ.get("TMPDIR") or "/tmp"
    parser.add_argument(
        "--fork-git-dir", default="/work/.mirror/LoopedLMs+retrofitting-recurrence/repo"
    )
    parser.add_argument("--commit", default=FORK_COMMIT)
    parser.add_argument("--hf-target", default=os.path.join(tmp, "retro_hf"))
    parser.add_argument("--work", default=os.path.join(tmp, "retro_regen"))
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()

    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "src" / "convert_pretrained_model").mkdir(parents=True)
    os.environ["HF_HOME"] = str(work / "hf_home")
    os.environ["HF_MODULES_CACHE"] = str(work / "hf_modules")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    sys.path.insert(0, str(Path(args.hf_target).resolve()))
    sys.path.insert(0, str(work / "src"))

    resolved = subprocess.run(
        ["git", f"--git-dir={args.fork_git_dir}", "rev-parse", args.commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for rel in FORK_FILES:
        (work / "src" / rel).write_bytes(git_show(args.fork_git_dir, resolved, rel))

    import torch
    import transformers
    from safetensors.torch import save_file

    if transformers.__version__ != "4.51.0":
        print(
            f"warning: transformers {transformers.__version__}; the committed files used 4.51.0",
            file=sys.stderr,
        )
    torch.set_num_threads(1)

    # The fake Huginn-0125 snapshot the fork's conversion reads (README step 1, with step 6's modeling file).
    from convert_pretrained_model.raven_config_minimal import RavenConfig

    huginn_dir = work / "models" / "huginn-0125"
    huginn_dir.mkdir(parents=True)
    huginn_cfg = RavenConfig(
        auto_map={
            "AutoConfig": "raven_config_minimal.RavenConfig",
            "AutoModel": "raven_modeling_minimal.RavenForCausalLM",
            "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM",
        },
        architectures=["RavenForCausalLM"],
    )
    (huginn_dir / "config.json").write_text(huginn_cfg.to_json_string())
    shutil.copy(
        work / "src/convert_pretrained_model/raven_config_minimal.py",
        huginn_dir / "raven_config_minimal.py",
    )
    shutil.copy(
        work / "src/convert_pretrained_model/raven_modeling_minimal_llama.py",
        huginn_dir / "raven_modeling_minimal.py",
    )

    # The tiny source Llama.
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    n_src_layers = 1 + max(max(v) for v in MAPPING.values())
    src_cfg = LlamaConfig(
        vocab_size=SIZES["vocab"],
        hidden_size=SIZES["hidden"],
        intermediate_size=SIZES["intermediate"],
        num_hidden_layers=n_src_layers,
        num_attention_heads=SIZES["heads"],
        num_key_value_heads=SIZES["kv_heads"],
        max_position_embeddings=SIZES["context"],
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.1,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    src = LlamaForCausalLM(src_cfg).float().eval()
    with torch.no_grad():
        for name, p in src.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    src_dir = work / "models" / "tiny-llama-source"
    src.save_pretrained(src_dir)

    # The fork's conversion (body of convert_llama.get_llama_huginn, with the documented edits).
    cwd = os.getcwd()
    os.chdir(work)  # get_llama_huginn_config reads the relative path "models/huginn-0125"
    try:
        from convert_pretrained_model import convert_llama as conv

        config = conv.get_llama_huginn_config(str(src_dir))
        config.n_layers = sum(len(v) for v in MAPPING.values())
        config.n_layers_in_prelude = len(MAPPING["prelude_idx"])
        config.n_layers_in_recurrent_block = len(MAPPING["core_idx"])
        config.n_layers_in_coda = len(MAPPING["coda_idx"])
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
        huginn_sd = conv.weight_mapping(
            llama_state_dict=src.state_dict(),
            huginn_state_dict=model.state_dict(),
            mapping_cfg=MAPPING,
        )
        model.load_state_dict(huginn_sd)
        saved = work / "converted"
        model.save_pretrained(saved)
    finally:
        os.chdir(cwd)
    saved_files = sorted(p.name for p in saved.iterdir())

    out = Path(args.out).resolve()
    (out / "checkpoint").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(saved / name, out / "checkpoint" / name)
    (out / "source").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src_dir / name, out / "source" / name)

    # Reload as train.py does and record the fork's own forward.
    model = AutoModelForCausalLM.from_pretrained(
        saved, trust_remote_code=True, torch_dtype=torch.float32
    ).eval()
    in_memory = {k: v for k, v in huginn_sd.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, in_memory[k].to(v.dtype)), k

    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, SIZES["vocab"], (2, 10), generator=gen)
    torch.manual_seed(1)
    s0 = model.initialize_state(torch.empty(2, 10, SIZES["hidden"]), scale=1.0)

    captured: dict[str, list[torch.Tensor]] = {"adapter_in": [], "core_out": []}
    h1 = model.transformer.adapter.register_forward_pre_hook(
        lambda mod, inp: captured["adapter_in"].append(inp[0].detach().clone())
    )
    h2 = model.transformer.core_block[-1].register_forward_hook(
        lambda mod, inp, outp: captured["core_out"].append(outp.detach().clone())
    )
    details = {
        "return_logits": True,
        "return_latents": True,
        "return_head": True,
        "return_stats": False,
    }

    def run(m, r: int, states: torch.Tensor):
        for v in captured.values():
            v.clear()
        with torch.no_grad():
            o = m(input_ids, input_states=states, num_steps=r, output_details=details)
        h = SIZES["hidden"]
        prev = [a[..., :h] for a in captured["adapter_in"]]
        embeds = [a[..., h:] for a in captured["adapter_in"]]
        assert len(prev) == r and len(captured["core_out"]) == r
        for i in range(1, r):
            assert torch.equal(prev[i], captured["core_out"][i - 1])
        assert torch.equal(prev[0], states)
        for e in embeds[1:]:
            assert torch.equal(e, embeds[0])
        states_seq = torch.stack([prev[0]] + list(captured["core_out"]))
        assert torch.equal(states_seq[-1], o.latent_states)
        return o, states_seq, embeds[0]

    mean_r = int(model.config.mean_recurrence)
    recurrences = (mean_r, *RECURRENCES_EXTRA)
    tensors: dict[str, torch.Tensor] = {"input_ids": input_ids.to(torch.int64), "s0": s0.clone()}
    prelude_out = None
    for r in recurrences:
        o, states_seq, e = run(model, r, s0)
        tensors[f"logits_r{r}"] = o.logits.float().contiguous()
        tensors[f"states_r{r}"] = states_seq.contiguous()
        tensors[f"final_hidden_r{r}"] = o.hidden_states.contiguous()
        if prelude_out is None:
            prelude_out = e
        assert torch.equal(prelude_out, e)
    tensors["prelude_output"] = prelude_out.contiguous()
    h1.remove()
    h2.remove()

    # Question 3: adapter [0 | I] at r = 1 against the source Llama's layers (prelude 0, core 1-2, coda 3).
    with torch.no_grad():
        h = SIZES["hidden"]
        eye_adapter = torch.zeros(h, 2 * h)
        eye_adapter[:, h:] = torch.eye(h)
        saved_adapter = model.transformer.adapter.weight.detach().clone()
        model.transformer.adapter.weight.copy_(eye_adapter)
        o_eye = model(input_ids, input_states=s0, num_steps=1, output_details=details)
        model.transformer.adapter.weight.copy_(saved_adapter)
        src_logits = src(input_ids).logits.float()
    tensors["identity_adapter_r1_logits"] = o_eye.logits.float().contiguous()
    tensors["source_llama_logits"] = src_logits.contiguous()
    diff_eye = (o_eye.logits.float() - src_logits).abs().max().item()

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "reference.safetensors"))

    cfg = json.loads((out / "checkpoint" / "config.json").read_text())
    meta = {
        "what": "Parity oracle for the retrofitted-recurrence (McLeish et al. 2025) converted-Llama layout",
        "source": {
            "repository": f"https://github.com/{FORK_REPO}",
            "commit": resolved,
            "files": list(FORK_FILES),
            "upstream": "mcleish7/retrofitting-recurrence (not fetchable here); the Llama modeling file is "
            "unchanged in substance since its initial commit c9405b3c864e257e7481c42e587061c655a5b29d",
        },
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "build": {
            "source_llama": src_cfg.to_diff_dict(),
            "norm_weights": "1 + 0.1 * normal, every RMSNorm of the source (and so of the converted model)",
            "seed": "torch.manual_seed(0) before LlamaForCausalLM(...); adapter left at from_config's init",
            "mapping_cfg": MAPPING,
            "conversion": "convert_llama.get_llama_huginn_config + edited layer counts; "
            "AutoModelForCausalLM.from_config(trust_remote_code=True); convert_llama.weight_mapping; "
            "load_state_dict; save_pretrained",
            "files_written_by_save_pretrained": saved_files,
            "files_kept": ["checkpoint/config.json", "checkpoint/model.safetensors"],
        },
        "run": {
            "reload": "AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True, torch_dtype=float32).eval()",
            "call": "model(input_ids, input_states=s0, num_steps=r (a Python int), output_details={return_logits, "
            "return_latents, return_head: True, return_stats: False}), torch.no_grad(), no cache",
            "s0": "fork's RavenForCausalLM.initialize_state(torch.empty(2,10,64), scale=1.0) after "
            "torch.manual_seed(1): truncated normal, std = config.init_values['std'] = "
            f"{cfg['init_values']['std']!r} (Huginn-0125's value, not recomputed), times emb_scale "
            f"(= {cfg['init_values']['embed_scale']!r}) only when that is not 1",
            "recurrences": list(recurrences),
            "mean_recurrence": mean_r,
        },
        "keys": {
            "input_ids": "(2, 10) int64, torch.Generator().manual_seed(0), randint(0, 128)",
            "s0": "(2, 10, 64) the initial state passed as input_states",
            "prelude_output": "(2, 10, 64) e = prelude(wte(ids)) (no sqrt(h) scale: emb_scale 1.0); "
            "second half of the adapter's input",
            "logits_r{r}": "(2, 10, 128) returned logits at recurrence r",
            "states_r{r}": "(r+1, 2, 10, 64) raw states s_0..s_r (s_i = core(adapter([s_{i-1}, e])); "
            "captured by hooks; s_r equals returned latent_states)",
            "final_hidden_r{r}": "(2, 10, 64) returned hidden_states = ln_f(coda(s_r)) (no ln_f before the coda)",
            "identity_adapter_r1_logits": "(2, 10, 128) the same checkpoint with adapter weight [0 | I], r = 1",
            "source_llama_logits": "(2, 10, 128) transformers LlamaForCausalLM (the source, layers 0..3)",
        },
        "checks": {
            "max_abs_diff_identity_adapter_r1_vs_source_llama": diff_eye,
        },
    }
    (out / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(out)}\t{p.stat().st_size}")
    print(f"identity-adapter r=1 vs source Llama: max abs diff {diff_eye:.3e}")


if __name__ == "__main__":
    main()
