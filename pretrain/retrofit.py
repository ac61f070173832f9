"""Convert a pretrained Llama checkpoint into the retrofitted-recurrence family.

Retrofitted recurrence (McLeish et al. 2025, arXiv 2511.07384): chosen source layers become the
prelude, recurrent block and coda of a :class:`recurrent_model.retrofit.RetrofitLM`, in the layout
the published conversion writes.

    python -m pretrain.retrofit --from SRC --out OUT --prelude P --core C --coda D \\
        [--layers PRELUDE:CORE:CODA] [--adapter published|identity] [--seed N]

SRC is a Hugging Face ``LlamaForCausalLM`` directory (config.json with model_type "llama",
model.safetensors or an index with its shards; read with safetensors, never unpickled) or a hub id.
OUT must not exist; it is written atomically (through ``RetrofitLM.save_pretrained``), checked with
``recurrent_model.load_model`` before it appears, and holds config.json, model.safetensors and the
source's tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) unchanged.
Those go beside the weights when ``load_model`` accepts the tokenizer (a Llama's own is read with its
special ids and chat template); one it would refuse goes to ``OUT/source_tokenizer/`` (with a
warning) and the model still loads.

What is copied, bit for bit and in the source's dtype (the fork's ``weight_mapping``,
``convert_pretrained_model/convert_llama.py`` lines 55-95 at LoopedLMs/retrofitting-recurrence
@3797dedd): ``embed_tokens`` -> ``transformer.wte``, ``model.norm`` -> ``transformer.ln_f``,
``lm_head`` -> ``lm_head`` (a tied source's embedding, as an untied copy: the config records
``tie_embeddings: false``, as the fork's does), and per chosen layer q/k/v joined as rows [q; k; v]
into ``attn.Wqkv`` (no RoPE permutation: both sides use rotate-half RoPE), ``o_proj`` ->
``attn.proj``, gate/up joined (gate first) into ``mlp.fc``, ``down_proj`` -> ``mlp.proj``,
``input_layernorm`` -> ``norm_1``, ``post_attention_layernorm`` -> ``norm_2``.

Default layer choice: prelude = the first P layers, coda = the last D layers, core = the C layers
just before the coda; the layers between prelude and core are dropped. The fork has no rule in code:
``convert_llama.py`` lines 170-182 set it by hand for TinyLlama's 22 layers (prelude_size 4,
start_index 10, block_size 8, coda_size 4; mapping_cfg prelude 0-3, core 10-17, coda 18-21), and
``looped_llama.py`` lines 119-134 (``get_split``) read it as prelude = layers[:P], core =
layers[start:start + C], coda = the first D layers after the core. Its OLMo-2 settings
(``shells/preprocess/convert_olmo.sh``: prelude 7, core 4, coda 5, start 7 on 16 layers) also end
at the last layer, so the start is L - C - D here. ``--layers`` chooses by index instead.

Adapter (h x 2h over [state, e]): ``published`` is what the fork's Llama conversion leaves,
torch.nn.Linear's default init U(-1/sqrt(2h), 1/sqrt(2h)): ``weight_mapping`` never writes it and
``RavenPreTrainedModel._init_weights`` (``raven_modeling_minimal_llama.py`` lines 39-41) initialises
nothing. The fork draws it from the global RNG; here a generator seeded with ``--seed`` draws it.
``identity`` is [0 | I] (``convert_olmo.py`` lines 76-81): at r = 1 the model then computes the
source's chosen layer sequence exactly, whatever s_0.

Differences from the fork's config: ``norm_eps`` is the source's ``rms_norm_eps`` (the fork's
Llama conversion writes 1e-5, TinyLlama's and Llama-3.2's value), ``rope_base`` repeats
``rope_theta`` (the fork writes 500000, a Huginn field the retrofit forward never reads), and
``retrofit_conversion`` records the source, layers, adapter and tokenizer. The other Huginn-0125
fields (``init_values.std`` 0.0087 included, not recomputed for the source's width) are written as
the fork leaves them. A source with ``rope_scaling`` (Llama-3.1/3.2) is refused, as the family
refuses it. OLMo-2 is refused: its blocks norm after attention and after the MLP and add q/k norms,
so it differs from Llama in more than names.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from recurrent_model import atomic_directory, load_model
from recurrent_model.checkpoint import (
    CheckpointError,
    TensorHeader,
    checkpoint_directory,
    family_tokenizer,
    read_config_json,
    read_headers,
    set_parameter,
    weight_files,
)
from recurrent_model.config import ConfigError
from recurrent_model.retrofit import RetrofitConfig, RetrofitLM
from recurrent_model.saving import TOKENIZER_FILE
from recurrent_model.tokenizer import TokenizerError

__all__ = ["ADAPTERS", "LayerChoice", "convert", "default_layers", "main", "parse_layers"]

ADAPTERS = ("published", "identity")
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")
#: Where tokenizer files go that load_model would refuse beside the weights.
SOURCE_TOKENIZER = "source_tokenizer"
#: Huginn-0125's init std (width 5280) and effective depth (prelude 2 + coda 2 + 4 core layers
#: x mean recurrence 32), which the fork's conversion keeps whatever the source's shape.
HUGINN_STD = math.sqrt(2 / (5 * 5280))
HUGINN_DEPTH = 2 + 2 + 4 * 32
#: The fields the fork's config keeps from Huginn-0125's (tests/data/retrofit/checkpoint/).
HUGINN_FIELDS: dict[str, Any] = {
    "activation_checkpoint_impl": "per-iteration",
    "architecture_class_name": "RecurrentGPT",
    "architectures": ["RavenForCausalLM"],
    "auto_map": {
        "AutoConfig": "raven_config_minimal.RavenConfig",
        "AutoModel": "raven_modeling_minimal.RavenForCausalLM",
        "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM",
    },
    "bias": False,
    "block_class_name": "SandwichBlock",
    "block_size": 4096,
    "effective_expected_depth": HUGINN_DEPTH,
    "init_orthogonal": False,
    "init_strategy": "takase",
    "initial_state_mode": "random",
    "injection_type": "linear",
    "mean_backprop_depth": 8,
    "mean_recurrence": 32,
    "mlp_class_name": "GatedMLP",
    "nonlin_name": "SiLU",
    "norm_class_name": "RMSNorm_llama",
    "padding_multiple": 4096,
    "qk_bias": False,
    "sampling_scheme": "poisson-lognormal-filling",
    "state_init": "like-init",
    "test_time_noise": 0,
    "test_time_noise_type": "fixed",
    "tie_embeddings": False,
}
#: Retrofit tensor of a layer -> the Llama tensors of that layer joined along rows, in order.
LAYER_TENSORS = {
    "attn.Wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attn.proj": ("self_attn.o_proj",),
    "mlp.fc": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.proj": ("mlp.down_proj",),
    "norm_1": ("input_layernorm",),
    "norm_2": ("post_attention_layernorm",),
}
EMBED, FINAL_NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
ADAPTER = "transformer.adapter.weight"


# Layer choice ------------------------------------------------------------------------------------
class LayerChoice(NamedTuple):
    """Source layer indices of the prelude, the recurrent block and the coda, in order."""

    prelude: tuple[int, ...]
    core: tuple[int, ...]
    coda: tuple[int, ...]

    def parts(self) -> dict[str, tuple[int, ...]]:
        """Retrofit part name -> source layers."""
        return {"prelude": self.prelude, "core_block": self.core, "coda": self.coda}

    def mapping(self) -> dict[str, list[int]]:
        """The fork's ``mapping_cfg`` form."""
        return {"prelude_idx": [*self.prelude], "core_idx": [*self.core], "coda_idx": [*self.coda]}


def default_layers(n_layers: int, prelude: int, core: int, coda: int) -> LayerChoice:
    """The first ``prelude`` layers, then the ``core`` layers before the last ``coda`` layers, then
    those (the rule of the fork's settings; see the module docstring)."""
    check_counts(prelude, core, coda)
    if prelude + core + coda > n_layers:
        raise ValueError(
            f"the source has {n_layers} layers, but prelude + core + coda = "
            f"{prelude + core + coda} asks for more"
        )
    start = n_layers - core - coda
    return LayerChoice(
        tuple(range(prelude)),
        tuple(range(start, start + core)),
        tuple(range(start + core, n_layers)),
    )


def parse_layers(text: str) -> LayerChoice:
    """``PRELUDE:CORE:CODA``, each a comma list of indices or inclusive ranges ``a-b``, e.g.
    "0-3:10-17:18-21" or "0,1,2:10,11:20,21"; the prelude and coda may be empty (":0-7:")."""
    groups = text.split(":")
    if len(groups) != 3:
        raise ValueError(f"--layers {text!r} must be PRELUDE:CORE:CODA, e.g. 0-3:10-17:18-21")
    prelude, core, coda = (_indices(group, text) for group in groups)
    return LayerChoice(prelude, core, coda)


def _indices(group: str, text: str) -> tuple[int, ...]:
    """The indices of one comma list of ``--layers``."""
    out: list[int] = []
    for item in filter(None, (part.strip() for part in group.split(","))):
        found = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if found is None:
            raise ValueError(f"--layers {text!r}: {item!r} is not an index or a range a-b")
        first, last = int(found[1]), int(found[2] or found[1])
        if last < first:
            raise ValueError(f"--layers {text!r}: the range {item!r} runs backwards")
        out += range(first, last + 1)
    return tuple(out)


def check_counts(prelude: int, core: int, coda: int) -> None:
    """ValueError unless prelude, coda >= 0 and core >= 1."""
    if prelude < 0 or coda < 0 or core < 1:
        raise ValueError(
            f"prelude, core and coda must be >= 0, >= 1 and >= 0 layers, got {prelude}, {core}, "
            f"{coda}"
        )


def choose_layers(
    n_layers: int, counts: tuple[int, int, int], layers: str | Sequence[Iterable[int]] | None
) -> LayerChoice:
    """The default choice for ``counts``, or ``layers`` ("P:C:D" or three index lists) checked."""
    if layers is None:
        return default_layers(n_layers, *counts)
    if isinstance(layers, str):
        return checked_layers(parse_layers(layers), n_layers, counts)
    parts = [tuple(part) for part in layers]
    if len(parts) != 3:
        raise ValueError(f"layers must be three index lists (prelude, core, coda), got {layers!r}")
    return checked_layers(LayerChoice(*parts), n_layers, counts)


def checked_layers(choice: LayerChoice, n_layers: int, counts: tuple[int, int, int]) -> LayerChoice:
    """``choice`` when its sizes are ``counts``, every index is a source layer and none repeats."""
    sizes = tuple(map(len, choice))
    if sizes != counts:
        raise ValueError(
            f"--layers gives {sizes[0]}, {sizes[1]}, {sizes[2]} layers, but prelude, core, coda "
            f"are {counts[0]}, {counts[1]}, {counts[2]}"
        )
    indices = [i for part in choice for i in part]
    outside = sorted({i for i in indices if i >= n_layers})
    if outside:
        raise ValueError(
            f"--layers names layer(s) {outside}, but the source has {n_layers} (0-{n_layers - 1})"
        )
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise ValueError(f"--layers uses layer(s) {repeated} more than once (parts overlap)")
    return choice


# The source --------------------------------------------------------------------------------------
def llama_config(directory: Path) -> dict[str, Any]:
    """The source's config.json, refused unless it is a Llama the retrofit family can run."""
    raw = read_config_json(directory)
    if raw.get("model_type") != "llama":
        raise ConfigError(
            f"{directory} has model_type {raw.get('model_type')!r}, not 'llama': only Llama-layout "
            "sources (LlamaForCausalLM) are converted"
        )
    required = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
    missing = [k for k in (*required, "vocab_size") if k not in raw]
    if missing:
        raise ConfigError(f"{directory}/config.json lacks {', '.join(missing)}")
    invalid = [k for k in (*required, "vocab_size") if type(raw[k]) is not int or raw[k] <= 0]
    if invalid:
        raise ConfigError(f"{directory}/config.json has {invalid[0]}={raw[invalid[0]]!r}")
    h, heads = raw["hidden_size"], raw["num_attention_heads"]
    refusals = {
        "rope_scaling": raw.get("rope_scaling") is not None,
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
        "head_dim": raw.get("head_dim", h // heads) != h // heads or h % heads != 0,
    }
    for key, refused in refusals.items():
        if refused:
            raise ConfigError(
                f"{directory}/config.json has {key}={raw.get(key)!r}, which the retrofitted family "
                "does not implement"
            )
    return raw


class SourceWeights:
    """The tensors of a safetensors checkpoint, by name, read one at a time on demand."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.headers: dict[str, TensorHeader] = read_headers(directory, weight_files(directory))

    def get(self, name: str) -> torch.Tensor:
        with safe_open(self.directory / self.headers[name].file, framework="pt") as f:
            return f.get_tensor(name)


def expected_shapes(llama: dict[str, Any], choice: LayerChoice) -> dict[str, tuple[int, ...]]:
    """Every source tensor the conversion reads, with the shape the source's config implies."""
    h, inter, vocab = llama["hidden_size"], llama["intermediate_size"], llama["vocab_size"]
    kv = llama.get("num_key_value_heads") or llama["num_attention_heads"]
    kv_width = kv * (h // llama["num_attention_heads"])
    per_layer = {
        "self_attn.q_proj": (h, h),
        "self_attn.k_proj": (kv_width, h),
        "self_attn.v_proj": (kv_width, h),
        "self_attn.o_proj": (h, h),
        "mlp.gate_proj": (inter, h),
        "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
    }
    shapes = {EMBED: (vocab, h), FINAL_NORM: (h,)}
    if not llama.get("tie_word_embeddings", False):
        shapes[HEAD] = (vocab, h)
    for i in (i for part in choice for i in part):
        shapes |= {f"model.layers.{i}.{name}.weight": shape for name, shape in per_layer.items()}
    return shapes


def check_layout(source: Path, headers: dict[str, TensorHeader], shapes: dict[str, tuple]) -> None:
    """ConfigError, one line, for a tensor the conversion needs that is missing or misshapen, or a
    bias of a chosen layer (the family has none)."""
    missing = [name for name in shapes if name not in headers]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"{source} is not a Llama layout: it lacks {missing[0]}{more}")
    layers = {name.rsplit(".", 2)[0] for name in shapes if name.startswith("model.layers.")}
    biases = sorted(k for k in headers if k.endswith(".bias") and k.rsplit(".", 2)[0] in layers)
    if biases:
        raise ConfigError(f"{source} has bias tensors ({biases[0]}), which the family lacks")
    wrong = [f"{k} is {list(headers[k].shape)}, not {list(v)}" for k, v in shapes.items()
             if tuple(headers[k].shape) != v]  # fmt: skip
    if wrong:
        raise ConfigError(f"{source} does not match its config.json: {'; '.join(wrong[:3])}")


# The conversion ----------------------------------------------------------------------------------
def retrofit_tensors(
    weights: SourceWeights, choice: LayerChoice, tied: bool
) -> dict[str, torch.Tensor]:
    """Every retrofit tensor but the adapter, from the source's (copied bit for bit)."""
    tensors = {
        "transformer.wte.weight": weights.get(EMBED),
        "transformer.ln_f.weight": weights.get(FINAL_NORM),
        "lm_head.weight": weights.get(EMBED if tied else HEAD),
    }
    for part, layers in choice.parts().items():
        for j, i in enumerate(layers):
            for target, names in LAYER_TENSORS.items():
                joined = [weights.get(f"model.layers.{i}.{name}.weight") for name in names]
                tensors[f"transformer.{part}.{j}.{target}.weight"] = torch.cat(joined, dim=0)
    return tensors


def adapter_weight(kind: str, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The (h, 2h) adapter: ``published`` nn.Linear's default init drawn from ``seed``, or
    ``identity`` [0 | I]."""
    if kind == "identity":
        weight = torch.zeros(width, 2 * width)
        weight[:, width:] = torch.eye(width)
        return weight.to(dtype)
    if kind != "published":
        raise ValueError(f"adapter must be one of {', '.join(ADAPTERS)}, got {kind!r}")
    weight = torch.empty(width, 2 * width)
    generator = torch.Generator().manual_seed(seed)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)  # as nn.Linear does
    return weight.to(dtype)


def retrofit_config(
    llama: dict[str, Any], choice: LayerChoice, name: str, provenance: dict[str, Any]
) -> RetrofitConfig:
    """The config in the fork's layout: Huginn-0125's fields, the source's sizes, the choice."""
    h, heads = llama["hidden_size"], llama["num_attention_heads"]
    rope_theta = float(llama.get("rope_theta", 10000.0))
    init_values = {"embed_scale": 1.0, "embedding": HUGINN_STD, "std": HUGINN_STD,
                   "out_proj": HUGINN_STD / math.sqrt(2 * HUGINN_DEPTH)}  # fmt: skip
    raw = {
        **HUGINN_FIELDS,
        "model_type": "huginn_raven",
        "n_embd": h,
        "n_heads": heads,
        "num_key_value_heads": llama.get("num_key_value_heads") or heads,
        "head_dim": h // heads,
        "intermediate_size": llama["intermediate_size"],
        "vocab_size": llama["vocab_size"],
        "padded_vocab_size": llama["vocab_size"],
        "n_layers": sum(map(len, choice)),
        "n_layers_in_prelude": len(choice.prelude),
        "n_layers_in_recurrent_block": len(choice.core),
        "n_layers_in_coda": len(choice.coda),
        "norm_eps": llama.get("rms_norm_eps", 1e-6),
        "rope_theta": rope_theta,
        "rope_base": rope_theta,
        "max_position_embeddings": llama.get("max_position_embeddings", 2048),
        "init_values": init_values,
        "name": name,
        "retrofit_conversion": provenance,
    }
    return RetrofitConfig.from_dict(raw)


def build_model(config: RetrofitConfig, tensors: dict[str, torch.Tensor]) -> RetrofitLM:
    """A RetrofitLM holding exactly ``tensors`` (no init drawn: built on the meta device)."""
    with torch.device("meta"):
        model = RetrofitLM(config)
    expected = set(model.state_dict())
    if set(tensors) != expected:
        raise ValueError(f"internal: tensors differ from the model's: {set(tensors) ^ expected}")
    for key, tensor in tensors.items():
        set_parameter(model, key, tensor)
    return model


def tokenizer_refusal(source: Path, config: RetrofitConfig) -> str | None:
    """Why ``load_model`` would refuse the source's tokenizer beside these weights (one with more
    ids than the vocabulary, or an unreadable file); None if it would not, or there is none."""
    try:
        family_tokenizer(source, read_config_json(source), config.vocab_size, required=False)
    except (CheckpointError, TokenizerError, ConfigError) as exc:
        return " ".join(str(exc).split())
    return None


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    """Copy the source's tokenizer files present into ``target`` (bytes unchanged); their names."""
    present = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if present:
        target.mkdir(exist_ok=True)
    for name in present:
        shutil.copyfile(source / name, target / name)
    return present


def refuse_existing(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise ValueError(
            f"{out} already exists; the conversion never overwrites, choose a new --out"
        )


def convert(
    src: str | Path,
    out: str | Path,
    prelude: int,
    core: int,
    coda: int,
    layers: str | Sequence[Iterable[int]] | None = None,
    adapter: str = "published",
    seed: int = 0,
) -> Path:
    """Convert the Llama checkpoint ``src`` (directory or hub id) into a retrofitted one at ``out``
    with ``prelude``/``core``/``coda`` layers: the default choice, or ``layers`` ("P:C:D" as
    :func:`parse_layers` reads, or three index lists). ValueError (ConfigError, CheckpointError),
    one line, for anything refused; nothing is written then."""
    out = Path(out)
    refuse_existing(out)
    check_counts(prelude, core, coda)
    if adapter not in ADAPTERS:
        raise ValueError(f"adapter must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
    directory, _ = checkpoint_directory(src)
    llama = llama_config(directory)
    n_layers = int(llama["num_hidden_layers"])
    choice = choose_layers(n_layers, (prelude, core, coda), layers)
    weights = SourceWeights(directory)
    check_layout(directory, weights.headers, expected_shapes(llama, choice))
    tensors = retrofit_tensors(weights, choice, bool(llama.get("tie_word_embeddings", False)))
    embedding = tensors["transformer.wte.weight"]
    tensors[ADAPTER] = adapter_weight(adapter, embedding.shape[1], embedding.dtype, seed)
    provenance = {"source": str(src), "source_layers": n_layers, **choice.mapping(),
                  "adapter": adapter, "seed": seed if adapter == "published" else None}  # fmt: skip
    config = retrofit_config(llama, choice, out.name, provenance)
    refusal = tokenizer_refusal(directory, config)
    place = TOKENIZER_FILE if refusal is None else f"{SOURCE_TOKENIZER}/ ({refusal})"
    has_tokenizer = (directory / TOKENIZER_FILE).is_file()
    config.extra["retrofit_conversion"]["tokenizer"] = place if has_tokenizer else None
    model = build_model(config, tensors)
    with atomic_directory(out) as staging:
        model.save_pretrained(staging)
        copy_tokenizer(directory, staging if refusal is None else staging / SOURCE_TOKENIZER)
        load_model(staging)  # the result loads (names, shapes, tokenizer size) before it appears
        refuse_existing(out)
    if refusal is not None:
        where = out / SOURCE_TOKENIZER
        note = f"load_model would refuse them ({refusal})"
        warnings.warn(f"the source's tokenizer files are in {where}: {note}", stacklevel=2)
    return out


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", required=True, help="Llama directory or hub id")
    parser.add_argument("--out", required=True, help="the new directory (must not exist)")
    for part in ("prelude", "core", "coda"):
        parser.add_argument(f"--{part}", type=int, help=f"layers in the {part} (or from --layers)")
    parser.add_argument("--layers", help="source layers as PRELUDE:CORE:CODA, e.g. 0-3:10-17:18-21")
    parser.add_argument("--adapter", choices=ADAPTERS, default="published")
    parser.add_argument("--seed", type=int, default=0, help="seed of the published adapter's draw")
    args = parser.parse_args(argv)
    try:
        counts = [args.prelude, args.core, args.coda]
        if None in counts:
            if args.layers is None:
                raise ValueError("give --prelude, --core and --coda, or --layers")
            given = parse_layers(args.layers)
            counts = [len(part) if n is None else n for n, part in zip(counts, given, strict=True)]
        out = convert(args.source, args.out, *counts, args.layers, args.adapter, args.seed)
    except ValueError as exc:
        raise SystemExit(f"error: {' '.join(str(exc).split())}") from None
    print(f"converted {args.source} into {out}")
    return out


if __name__ == "__main__":
    main()
