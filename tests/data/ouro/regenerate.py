"""Regenerate the Ouro parity oracle from the PUBLISHED Ouro modeling code.

Every number written by this script comes out of the published
``modeling_ouro.py`` (ByteDance's remote code for ByteDance/Ouro-1.4B and
ByteDance/Ouro-2.6B, run with ``trust_remote_code``); this script only builds a
tiny configuration, puts random weights into the published model, runs the
published forward and reads its results (return values, forward hooks on
published modules, and the published forward's own local variables read with
``sys.settrace``).  Nothing of the published code is copied into this
repository; it is fetched into a temporary directory.

Published code used
-------------------
The hub file itself cannot be fetched offline; two public GitHub copies exist.

* primary: ``Eagle4398/ouro-nixpkgs``, path ``modeling_ouro.py``, commit
  ``d4f815eca3d1f9c7dcde6b5e274bd45fd67a5af6`` (the first commit that holds the
  file, which replaces the hub file of the pinned ByteDance/Ouro-2.6B@1ed04250;
  the same repository also pins ByteDance/Ouro-1.4B@574fa66c, and a public
  sha256 audit lists one modeling_ouro.py for both revisions).
  sha256 79715b202b8ec0f51a40344ee12038edbfa5cd964c16360567f4009458b1dda3.
  It keeps the hub style (black formatting, ``typing.Optional``,
  ``@auto_docstring``, the original comments); compared with the ouro_rl copy
  its only non-formatting edits are inside ``UniversalTransformerCache``
  (``key_cache``/``value_cache`` properties and a ``get_mask_sizes`` override),
  a class that a forward with ``use_cache=False`` never builds.  Byte-exact hub
  text was not available (undoing those edits does not give the audited hub
  sha256 c5c68fbb...f413, so some other small textual difference remains).
* configuration: ``LoopedLMs/ouro_rl``, path
  ``ouro_rl/modeling/configuration_ouro.py``, commit
  ``3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b`` (unchanged up to that repository's
  HEAD 531187ba); sha256
  61ebf88ccd9ab921717bb2509872d3e394796c0b5afb7c1f337872126d4f04b2.  The Eagle
  repository has no configuration file.
* cross-check (``--crosscheck-src``): ``LoopedLMs/ouro_rl``, path
  ``ouro_rl/modeling/modeling_ouro.py``, commit
  ``3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b`` (the first vendored copy; later
  commits add ``use_early_exit_gate`` and an fp32 lm_head); sha256
  89b40b7be8592b2d8a86a3811cde7cce5053375914600161e75add98661a856b.  Reformatted
  (ruff, PEP 604 hints, no ``@auto_docstring``) and with a fixed
  ``UniversalTransformerCache.get_mask_sizes``; otherwise the same statements.
  The recorded tensors are bitwise equal with either copy.

transformers: 4.54.1 (the version the Ouro model cards recommend; the published
code needs ``transformers<4.58``).  Install it outside the repository together
with the versions of its runtime-checked dependencies that it accepts
(the project's venv has newer tokenizers / huggingface_hub)::

    export OURO_TMP=${TMPDIR:-/tmp}/ouro_oracle
    .venv/bin/python -m pip install --no-deps --target $OURO_TMP/hf \
        "transformers==4.54.1" "tokenizers>=0.21,<0.22" "huggingface_hub>=0.34,<1.0" regex

Fetch the published code (the files import each other relatively, so they go
in one directory, which this script loads as a package)::

    mkdir -p $OURO_TMP/src $OURO_TMP/src_rl
    git clone -q https://github.com/Eagle4398/ouro-nixpkgs $OURO_TMP/eagle
    git clone -q https://github.com/LoopedLMs/ouro_rl $OURO_TMP/ouro_rl
    git -C $OURO_TMP/eagle show d4f815eca3d1f9c7dcde6b5e274bd45fd67a5af6:modeling_ouro.py \
        > $OURO_TMP/src/modeling_ouro.py
    git -C $OURO_TMP/ouro_rl show \
        3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b:ouro_rl/modeling/configuration_ouro.py \
        > $OURO_TMP/src/configuration_ouro.py
    git -C $OURO_TMP/ouro_rl show \
        3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b:ouro_rl/modeling/modeling_ouro.py \
        > $OURO_TMP/src_rl/modeling_ouro.py
    cp $OURO_TMP/src/configuration_ouro.py $OURO_TMP/src_rl/

Run (from the repository root)::

    PYTHONPATH=$OURO_TMP/hf:$OURO_TMP/src .venv/bin/python tests/data/ouro/regenerate.py \
        --src $OURO_TMP/src --crosscheck-src $OURO_TMP/src_rl

``--src`` defaults to the first PYTHONPATH entry holding ``modeling_ouro.py``.
The script checks the sha256 of the published files (``--allow-other-source``
skips that) and writes, next to itself: ``checkpoint/config.json``,
``checkpoint/model.safetensors``, ``reference.safetensors``, ``reference.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import json
import os
import platform
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
CKPT_DIR = HERE / "checkpoint"
REF_TENSORS = HERE / "reference.safetensors"
REF_JSON = HERE / "reference.json"

PRIMARY = {
    "modeling_ouro.py": {
        "repo": "Eagle4398/ouro-nixpkgs",
        "path": "modeling_ouro.py",
        "commit": "d4f815eca3d1f9c7dcde6b5e274bd45fd67a5af6",
        "sha256": "79715b202b8ec0f51a40344ee12038edbfa5cd964c16360567f4009458b1dda3",
    },
    "configuration_ouro.py": {
        "repo": "LoopedLMs/ouro_rl",
        "path": "ouro_rl/modeling/configuration_ouro.py",
        "commit": "3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b",
        "sha256": "61ebf88ccd9ab921717bb2509872d3e394796c0b5afb7c1f337872126d4f04b2",
    },
}
CROSSCHECK = {
    "modeling_ouro.py": {
        "repo": "LoopedLMs/ouro_rl",
        "path": "ouro_rl/modeling/modeling_ouro.py",
        "commit": "3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b",
        "sha256": "89b40b7be8592b2d8a86a3811cde7cce5053375914600161e75add98661a856b",
    },
    "configuration_ouro.py": PRIMARY["configuration_ouro.py"],
}

# The tiny model.  Everything else keeps the published OuroConfig defaults.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    # OuroConfig sets sliding_window = sliding_window if use_sliding_window else None,
    # so the window only exists with use_sliding_window=True.
    use_sliding_window=True,
    sliding_window=6,
    layer_types=["full_attention", "sliding_attention"],
    total_ut_steps=4,
)
AUTO_MAP = {
    "AutoConfig": "configuration_ouro.OuroConfig",
    "AutoModel": "modeling_ouro.OuroModel",
    "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM",
}
DEPTHS = (4, 2, 6)
SEED_MODEL = 0
SEED_INPUT = 1234
BATCH, SEQ = 2, 10
THRESHOLD = 0.5  # an extra exit_threshold run, next to the config's default (1.0)

# Initialisation of every parameter (after the published init, which it replaces).
MATRIX_STD = 0.02
NORM_STD = 0.1  # norm weights: 1 + NORM_STD * N(0, 1)
GATE_WEIGHT_STD = 0.1  # early_exit_gate.weight: wider than 0.02 so that lambda varies
GATE_BIAS_STD = 0.5


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_src(arg: str | None) -> Path:
    if arg:
        return Path(arg).resolve()
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "modeling_ouro.py").is_file():
            return Path(entry).resolve()
    raise SystemExit("no --src given and no PYTHONPATH entry holds modeling_ouro.py")


def check_source(src: Path, expected: dict, allow_other: bool) -> dict:
    out = {}
    for name, meta in expected.items():
        path = src / name
        if not path.is_file():
            raise SystemExit(f"{path} is missing")
        digest = sha256(path)
        if digest != meta["sha256"] and not allow_other:
            raise SystemExit(
                f"{path}: sha256 {digest} is not the pinned {meta['sha256']} ({meta['repo']}@{meta['commit']}:{meta['path']})"
            )
        out[name] = {**meta, "sha256": digest, "pinned_sha256_matches": digest == meta["sha256"]}
    return out


def load_published(src: Path, package: str):
    """Import src/modeling_ouro.py (which does ``from .configuration_ouro import``) as a package."""
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(src)]
    sys.modules[package] = pkg
    cfg = importlib.import_module(f"{package}.configuration_ouro")
    mod = importlib.import_module(f"{package}.modeling_ouro")
    return cfg, mod


def build_config(cfg_mod, attn: str):
    config = cfg_mod.OuroConfig(**TINY)
    config.architectures = ["OuroForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    config.torch_dtype = torch.float32
    config._attn_implementation = attn
    return config


@torch.no_grad()
def randomize_(model) -> dict:
    """Replace every parameter by a random value (global RNG, seeded before model construction)."""
    scheme = {}
    for name, p in model.named_parameters():
        if name == "model.early_exit_gate.weight":
            p.copy_(torch.randn_like(p) * GATE_WEIGHT_STD)
            scheme[name] = f"normal(0, {GATE_WEIGHT_STD})"
        elif name == "model.early_exit_gate.bias":
            p.copy_(torch.randn_like(p) * GATE_BIAS_STD)
            scheme[name] = f"normal(0, {GATE_BIAS_STD})"
        elif p.ndim == 1 and ("norm" in name.split(".")[-2]):
            p.copy_(1.0 + NORM_STD * torch.randn_like(p))
            scheme[name] = f"1 + {NORM_STD} * normal(0, 1)"
        elif p.ndim == 2:
            p.copy_(torch.randn_like(p) * MATRIX_STD)
            scheme[name] = f"normal(0, {MATRIX_STD})"
        else:
            raise RuntimeError(f"unhandled parameter {name} {tuple(p.shape)}")
    return scheme


@contextlib.contextmanager
def trace_locals(code, record: dict):
    """Read the published OuroForCausalLM.forward's own locals while it runs.

    record["lambda"][idx] <- the local ``lambda_i`` of loop step ``idx`` (the last
    value seen in that step is the one the published loop assigned); at the frame's
    return: ``stacked_exit_pdf`` and ``exit_steps`` (the threshold path's per-token step).
    """

    def local(frame, event, arg):
        f_locals = frame.f_locals
        if "lambda_i" in f_locals and "idx" in f_locals:
            record.setdefault("lambda", {})[int(f_locals["idx"])] = f_locals["lambda_i"]
        if event == "return":
            for key in ("stacked_exit_pdf", "exit_steps"):
                if f_locals.get(key) is not None:
                    record[key] = f_locals[key].clone()
        return local

    def glob(frame, event, arg):
        return local if frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(glob)
    try:
        yield record
    finally:
        sys.settrace(previous)


@contextlib.contextmanager
def hooks(model, record: dict):
    handles = [
        model.model.embed_tokens.register_forward_hook(
            lambda m, a, o: record.__setitem__("embed", o.detach().clone())
        ),
        model.model.register_forward_hook(lambda m, a, o: record.__setitem__("model_out", o)),
        model.lm_head.register_forward_hook(
            lambda m, a, o: record.setdefault("lm_head", []).append(o.detach().clone())
        ),
    ]
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


def set_depth(model, r: int) -> None:
    # OuroModel.forward loops `for current_ut in range(self.total_ut_steps)`; the attribute is
    # read from the config once, in OuroModel.__init__.  config.total_ut_steps only sizes the KV
    # cache (max_cache_size = num_hidden_layers * config.total_ut_steps), so both are set.
    model.model.total_ut_steps = r
    model.config.total_ut_steps = r


@torch.no_grad()
def run_depth(mod, model, ids: torch.Tensor, r: int) -> tuple[dict, dict]:
    set_depth(model, r)
    code = inspect.unwrap(mod.OuroForCausalLM.forward).__code__
    out: dict[str, torch.Tensor] = {}
    info: dict = {}

    # 1) the default call: logits as returned, plus states / gates / exit pdf from the same call.
    rec: dict = {}
    with hooks(model, rec), trace_locals(code, rec):
        res = model(input_ids=ids, use_cache=False)
    base_out, states_list, gate_list = rec["model_out"]
    assert len(states_list) == r and len(gate_list) == r
    assert torch.equal(base_out.last_hidden_state, states_list[-1])
    out["logits"] = res.logits
    out["states"] = torch.stack([rec["embed"], *states_list], dim=0)
    out["gate_logits"] = torch.stack([g.squeeze(-1) for g in gate_list], dim=0)
    out["gate"] = torch.stack([rec["lambda"][i] for i in range(r)], dim=0)
    out["exit_pdf"] = rec["stacked_exit_pdf"]
    out["default_exit_step"] = rec["exit_steps"]
    assert len(rec["lm_head"]) == 1

    # 2) labels given: the published code computes lm_head on every loop's normed state
    #    (compute_expected_logits), returns the pdf-weighted logits and the loss on them.
    rec2: dict = {}
    with hooks(model, rec2):
        res2 = model(input_ids=ids, labels=ids, use_cache=False)
    assert len(rec2["lm_head"]) == r
    out["loop_logits"] = torch.stack(rec2["lm_head"], dim=0)
    out["expected_logits"] = res2.logits
    out["loss"] = res2.loss.reshape(())

    # 3) exit_at_step=i returns lm_head(hidden_states_list[i]): must equal the hooked loop logits.
    for i in range(r):
        li = model(input_ids=ids, use_cache=False, exit_at_step=i).logits
        assert torch.equal(li, out["loop_logits"][i]), (r, i)

    # 4) use_weighted_exit=True is dead code while exit_threshold resolves to non-None
    #    (config.early_exit_threshold=1.0): the threshold branch comes first.
    w_default = model(input_ids=ids, use_cache=False, use_weighted_exit=True).logits
    info["use_weighted_exit_with_default_config_equals_default_logits"] = bool(
        torch.equal(w_default, out["logits"])
    )
    saved = model.early_exit_threshold
    model.early_exit_threshold = None
    try:
        w = model(input_ids=ids, use_cache=False, use_weighted_exit=True).logits
    finally:
        model.early_exit_threshold = saved
    info["use_weighted_exit_with_threshold_None_equals_expected_logits"] = bool(
        torch.equal(w, out["expected_logits"])
    )

    # 5) an explicit exit_threshold (per-token exit step = first step with cumulative pdf >= t).
    rec3: dict = {}
    with trace_locals(code, rec3):
        res3 = model(input_ids=ids, use_cache=False, exit_threshold=THRESHOLD)
    out["logits_thr0p5"] = res3.logits
    out["exit_step_thr0p5"] = rec3["exit_steps"]

    # Consistency reads (not recorded): which loop the default logits are.
    last = out["loop_logits"][-1]
    info["default_logits_equal_last_loop_logits"] = bool(torch.equal(out["logits"], last))
    info["default_exit_step_counts"] = torch.bincount(
        out["default_exit_step"].flatten(), minlength=r
    ).tolist()
    info["thr0p5_exit_step_counts"] = torch.bincount(
        out["exit_step_thr0p5"].flatten(), minlength=r
    ).tolist()
    info["exit_pdf_sum_minus_1_maxabs"] = float((out["exit_pdf"].sum(-1) - 1).abs().max())
    info["lambda_equals_sigmoid_gate_logits_per_step"] = all(
        bool(torch.equal(out["gate"][i], torch.sigmoid(gate_list[i].squeeze(-1)))) for i in range(r)
    )
    gathered = torch.gather(
        out["loop_logits"].permute(1, 2, 0, 3),
        2,
        out["exit_step_thr0p5"][..., None, None].expand(-1, -1, 1, out["logits"].shape[-1]),
    ).squeeze(2)
    info["thr0p5_logits_equal_selected_loop_logits"] = bool(
        torch.equal(gathered, out["logits_thr0p5"])
    )
    return out, info


def to_record(out: dict, r: int) -> dict:
    rec = {}
    for k, v in out.items():
        v = v.detach().contiguous()
        if k in ("default_exit_step", "exit_step_thr0p5"):
            rec[f"r{r}.{k}"] = v.to(torch.int64)
        else:
            rec[f"r{r}.{k}"] = v.to(torch.float32).clone()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--src", help="directory holding the published modeling_ouro.py and configuration_ouro.py"
    )
    ap.add_argument(
        "--crosscheck-src", help="directory holding a second published copy (ouro_rl@3bad4c1)"
    )
    ap.add_argument(
        "--allow-other-source", action="store_true", help="do not insist on the pinned sha256"
    )
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(1)
    src = find_src(args.src)
    sources = check_source(src, PRIMARY, args.allow_other_source)
    cfg_mod, mod = load_published(src, "ouro_published")

    # ---- model ---------------------------------------------------------------------------
    config = build_config(cfg_mod, "eager")
    torch.manual_seed(SEED_MODEL)
    model = mod.OuroForCausalLM(config).to(torch.float32).eval()
    assert model.config._attn_implementation == "eager"
    init_scheme = randomize_(model)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}

    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(CKPT_DIR)
    save_file(state, str(CKPT_DIR / "model.safetensors"), metadata={"format": "pt"})

    # The saved checkpoint must load into the published class unchanged and reproduce the model.
    config_json = json.loads((CKPT_DIR / "config.json").read_text())
    loaded = mod.OuroForCausalLM.from_pretrained(
        CKPT_DIR, attn_implementation="eager", torch_dtype=torch.float32
    ).eval()
    assert set(load_file(str(CKPT_DIR / "model.safetensors"))) == set(state)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, state[k]), k
    model = loaded

    # ---- inputs and the depths ---------------------------------------------------------
    gen = torch.Generator().manual_seed(SEED_INPUT)
    ids = torch.randint(3, TINY["vocab_size"], (BATCH, SEQ), generator=gen)
    tensors: dict[str, torch.Tensor] = {"input_ids": ids.clone()}
    infos = {}
    for r in DEPTHS:
        out, info = run_depth(mod, model, ids, r)
        tensors.update(to_record(out, r))
        infos[f"r{r}"] = info
    set_depth(model, TINY["total_ut_steps"])

    # ---- cross-checks --------------------------------------------------------------------
    checks = {}
    # SDPA (same published code, other attention backend): close, not bitwise.
    sdpa = mod.OuroForCausalLM.from_pretrained(
        CKPT_DIR, attn_implementation="sdpa", torch_dtype=torch.float32
    ).eval()
    assert sdpa.config._attn_implementation == "sdpa"
    diffs = {}
    for r in DEPTHS:
        set_depth(sdpa, r)
        with torch.no_grad():
            lg = sdpa(input_ids=ids, use_cache=False).logits
        diffs[f"r{r}"] = float((lg - tensors[f"r{r}.logits"]).abs().max())
    checks["sdpa_vs_eager_logits_maxabs"] = diffs

    # The sliding-window layer matters: same weights with both layers full attention.
    full = mod.OuroForCausalLM.from_pretrained(
        CKPT_DIR,
        attn_implementation="eager",
        torch_dtype=torch.float32,
        layer_types=["full_attention", "full_attention"],
    ).eval()
    with torch.no_grad():
        lg = full(input_ids=ids, use_cache=False).logits
    per_pos = (lg - tensors["r4.logits"]).abs().amax(dim=(0, 2))
    checks["r4_logits_maxabs_vs_all_full_attention_per_position"] = [float(x) for x in per_pos]
    W = TINY["sliding_window"]
    assert torch.all(per_pos[:W] == 0) and torch.all(per_pos[W:] > 0), per_pos

    if args.crosscheck_src:
        xsrc = Path(args.crosscheck_src).resolve()
        xsources = check_source(xsrc, CROSSCHECK, args.allow_other_source)
        _, xmod = load_published(xsrc, "ouro_published_crosscheck")
        xmodel = xmod.OuroForCausalLM.from_pretrained(
            CKPT_DIR, attn_implementation="eager", torch_dtype=torch.float32
        ).eval()
        equal = {}
        for r in DEPTHS:
            xout, _ = run_depth(xmod, xmodel, ids, r)
            for k, v in to_record(xout, r).items():
                equal[k] = bool(torch.equal(v, tensors[k]))
        checks["crosscheck_source"] = xsources
        checks["crosscheck_all_tensors_bitwise_equal"] = all(equal.values())
        if not all(equal.values()):
            checks["crosscheck_mismatches"] = [k for k, ok in equal.items() if not ok]

    save_file(tensors, str(REF_TENSORS), metadata={"format": "pt"})
    for path in (REF_TENSORS, CKPT_DIR / "model.safetensors"):
        path.chmod(0o644)

    # ---- provenance ----------------------------------------------------------------------
    published_defaults = {
        k: getattr(config, k, None)
        for k in (
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "early_exit_threshold",
            "use_cache",
            "initializer_range",
            "max_window_layers",
            "attention_dropout",
            "rope_scaling",
            "head_dim",
        )
    }
    published_defaults[
        "early_exit_step (OuroForCausalLM: getattr(config, 'early_exit_step', None))"
    ] = getattr(config, "early_exit_step", None)
    published_defaults["chunk_size (OuroForCausalLM: getattr(config, 'chunk_size', 2); unused)"] = (
        getattr(config, "chunk_size", 2)
    )
    meta = {
        "what": "Parity oracle for Ouro (ByteDance LoopLM): a tiny random Ouro model and the published code's outputs on it.",
        "source": sources,
        "source_note": (
            "The hub file (ByteDance/Ouro-1.4B@574fa66c / Ouro-2.6B@1ed04250 modeling_ouro.py) is used through the "
            "public copy Eagle4398/ouro-nixpkgs@d4f815e; against the ouro_rl copy its non-formatting edits are confined to "
            "UniversalTransformerCache (not built with use_cache=False). Byte-exact hub text was not available (audited hub "
            "sha256 c5c68fbb368ce2909c257ae2afc50719be8c91539333d3295e19312c4316f413). LoopedLMs/ouro_rl@3bad4c1 "
            "(reformatted, get_mask_sizes fix) is the cross-check: all tensors bitwise equal."
        ),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "torch_num_threads": 1,
        "dtype": "float32",
        "attn_implementation": "eager (primary); sdpa compared in checks",
        "config": config_json,
        "published_config_defaults_kept": published_defaults,
        "init": {
            "seed": f"torch.manual_seed({SEED_MODEL}) before OuroForCausalLM(config); then every parameter redrawn "
            "from the same global RNG in named_parameters() order",
            "per_parameter": init_scheme,
        },
        "input_ids": f"torch.randint(3, {TINY['vocab_size']}, ({BATCH}, {SEQ}), generator=torch.Generator().manual_seed({SEED_INPUT}))",
        "depths": list(DEPTHS),
        "how_r_was_set": (
            "model.model.total_ut_steps = r (the loop bound OuroModel.forward reads; set from config in __init__ only) "
            "and model.config.total_ut_steps = r (only sizes the KV cache). No forward kwarg exists."
        ),
        "calls": {
            "rN.logits / states / gate_logits / gate / exit_pdf / default_exit_step": "model(input_ids=ids, use_cache=False)",
            "rN.loop_logits / expected_logits / loss": "model(input_ids=ids, labels=ids, use_cache=False); loop logits = lm_head forward-hook outputs in call order",
            "rN.logits_thr0p5 / exit_step_thr0p5": f"model(input_ids=ids, use_cache=False, exit_threshold={THRESHOLD})",
        },
        "tensors": {
            "input_ids": "int64 (B=2, T=10)",
            "rN.logits": "float32 (B, T, V): logits returned by the default call; config.early_exit_threshold=1.0 makes it the threshold branch: per token the first step whose cumulative exit pdf >= 1.0, else the last step. Here every token takes the last loop (see checks.rN.default_exit_step_counts).",
            "rN.loop_logits": "float32 (r, B, T, V): lm_head(s_i) for i=1..r, from the published compute_expected_logits",
            "rN.states": "float32 (r+1, B, T, H): s_0 = embed_tokens output (no scaling), s_i = model.norm output of loop i = the state loop i+1 receives (= OuroModel's hidden_states_list)",
            "rN.gate_logits": "float32 (r, B, T): early_exit_gate(s_i) as returned in OuroModel's gate_list, squeezed",
            "rN.gate": "float32 (r, B, T): lambda_i = sigmoid(gate) read from the published forward's local lambda_i",
            "rN.exit_pdf": "float32 (B, T, r): the published local stacked_exit_pdf (p_i = lambda_i * prod_{j<i}(1-lambda_j), last step takes the remaining product)",
            "rN.default_exit_step": "int64 (B, T): the published local exit_steps of the default (threshold 1.0) call, 0-based",
            "rN.expected_logits": "float32 (B, T, V): sum_i exit_pdf[..., i] * loop_logits[i], returned as logits when labels are given",
            "rN.loss": "float32 (): the published loss with labels=input_ids (shifted CE on expected_logits)",
            "rN.logits_thr0p5": f"float32 (B, T, V): logits with exit_threshold={THRESHOLD}",
            "rN.exit_step_thr0p5": f"int64 (B, T): the published local exit_steps with exit_threshold={THRESHOLD}, 0-based",
        },
        "checks": {**infos, **checks},
        "quirks": [
            "Loop count is OuroModel.total_ut_steps, copied from config in __init__: changing config.total_ut_steps on a built model changes only the KV cache size, not the number of loops.",
            "The state carried into the next loop is the model.norm output (hidden_states = self.norm(hidden_states) inside the loop); model.norm runs once per loop and the final state is not normed again.",
            "config.early_exit_threshold defaults to 1.0 (OuroConfig), so the default call takes the exit_threshold branch; use_weighted_exit=True is then never reached (exit_at_step, then exit_threshold, then use_weighted_exit). It only works with model.early_exit_threshold = None.",
            "With labels, the returned logits are the exit-pdf-weighted mixture of the per-loop logits and the loss is cross-entropy of that mixture (not the expected per-step loss).",
            "exit_at_step is 0-based; a value outside [0, r) is silently ignored (falls through to the threshold branch).",
            "Threshold exit (cumsum(pdf) >= t, else last) is applied per token on the hidden states of the full forward; all loops still run.",
            "early_exit_step / chunk_size are read with getattr from the config but are not OuroConfig fields; chunk_size is unused.",
            "OuroConfig: sliding_window is forced to None unless use_sliding_window=True; layer_types defaults to sliding for i >= max_window_layers (28) when a window is set.",
            "The sliding window (transformers masking_utils) keeps kv_idx > q_idx - sliding_window: the query token and the sliding_window-1 before it.",
            "use_cache defaults to config.use_cache=True (check_model_inputs); a cached forward builds UniversalTransformerCache, whose original hub version assigns self.key_cache in __init__ (AttributeError on transformers 4.54/4.55) and lacks get_mask_sizes; both copies here patch that class. The reference uses use_cache=False.",
            "OuroModel.forward returns a tuple (BaseModelOutputWithPast, hidden_states_list, gate_list), not a ModelOutput; output_hidden_states=True would fail on it.",
            "embed_tokens has padding_idx = config.pad_token_id (None here); the published init zeroes that row (irrelevant here: all parameters are redrawn).",
        ],
    }
    REF_JSON.write_text(json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n")

    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(json.dumps({"checks": meta["checks"], "bytes_in_tests_data_ouro": total}, indent=1))


if __name__ == "__main__":
    main()
