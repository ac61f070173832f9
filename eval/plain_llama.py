"""A plain (non-looped) Llama in Hugging Face's ``LlamaForCausalLM`` layout, trained on the
pipeline's prepared data: the source model of the retrofit demo (eval/retrofit_demo.py), which
``python -m pretrain.retrofit`` then converts.

The layers are those of ``recurrent_model.llama_layers`` (pre-norm blocks, rotate-half RoPE,
grouped-query attention, SwiGLU), the tensor names Hugging Face's, the weights initialised by
Huginn's rule (``init_weights``). The training loop is the pipeline's recipe on one process: its
data loader, optimizer (``ClippedAtanAdam``, decayed and undecayed groups), learning-rate schedule
and gradient clipping; its FLOPs are counted by the one cost model (``LlamaShape.cost``, a forward
with no recurrence: r = 0).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from pretrain.optimizer import ClippedAtanAdam, clip_grads_, global_grad_norm, parameter_groups
from pretrain.schedule import Schedule
from recurrent_model.cost import CostLayout, ModelCost
from recurrent_model.llama_layers import RMSNorm, attention, rope_table, split_heads, swiglu


@dataclass(frozen=True)
class LlamaShape:
    """The sizes of a small Llama (untied head, as the converted family keeps it)."""

    n_embd: int
    n_heads: int
    num_key_value_heads: int
    n_layers: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def cost(self) -> ModelCost:
        return ModelCost(self)  # type: ignore[arg-type]

    def cost_layout(self) -> CostLayout:
        """Every layer once (r = 0 runs no core), no adapter, an untied head, one final norm."""
        h, kv = self.n_embd, self.num_key_value_heads * self.head_dim
        block = {"wqkv": (h + 2 * kv, h), "attn_proj": (h, h),
                 "mlp_fc": (2 * self.intermediate_size, h), "mlp_proj": (h, self.intermediate_size)}  # fmt: skip
        return CostLayout(
            h, self.vocab_size, block, 2 * h, self.n_layers, 0, None, False, h, 2 * kv
        )

    def hf_config(self) -> dict:
        """config.json of ``LlamaForCausalLM`` with these sizes."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.n_embd,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.n_layers,
            "max_position_embeddings": self.block_size,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        }


class Attention(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        kv = s.num_key_value_heads * s.head_dim
        self.heads, self.kv_heads = s.n_heads, s.num_key_value_heads
        self.q_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.k_proj = nn.Linear(s.n_embd, kv, bias=False)
        self.v_proj = nn.Linear(s.n_embd, kv, bias=False)
        self.o_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.q_proj(x), self.heads)
        k, v = (
            split_heads(self.k_proj(x), self.kv_heads),
            split_heads(self.v_proj(x), self.kv_heads),
        )
        return self.o_proj(attention(q, k, v, rope))


class MLP(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.n_embd, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.n_embd, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(x, self.gate_proj.weight, self.up_proj.weight))


class Layer(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.n_embd, s.norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.n_embd, s.norm_eps)
        self.mlp = MLP(s)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.n_embd)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.n_layers))
        self.norm = RMSNorm(s.n_embd, s.norm_eps)


class PlainLlama(nn.Module):
    """``LlamaForCausalLM``'s computation and tensor names, nothing looped."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = Body(shape)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or the mean cross-entropy against ``labels``."""
        rope = rope_table(self.shape.head_dim, ids.shape[1], self.shape.rope_theta, ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, rope)
        logits = self.lm_head(self.model.norm(x)).float()
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


@torch.no_grad()
def init_weights(model: nn.Module, width: int, layers: int, seed: int) -> None:
    """Huginn's rule (``RecurrentLM.reset_parameters``): norms 1, every other weight
    trunc-normal σ² = 2/(5h) at ±3σ, the output projections (``o_proj``/``down_proj``, and the
    retrofitted family's ``attn.proj``/``mlp.proj``) σ/sqrt(2·layers); drawn in parameter order
    from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    std = math.sqrt(2.0 / (5.0 * width))
    out_std = std / math.sqrt(2.0 * layers)
    outputs = ("o_proj.weight", "down_proj.weight", "attn.proj.weight", "mlp.proj.weight")
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
            continue
        sigma = out_std if name.endswith(outputs) else std
        nn.init.trunc_normal_(param, 0.0, sigma, -3 * sigma, 3 * sigma, generator=generator)


@dataclass(frozen=True)
class Recipe:
    """The training settings of one stage (the pipeline's keys of the same names)."""

    steps: int
    micro_batch_size: int
    lr: float
    warmup_steps: int
    cooldown_steps: int
    weight_decay: float = 1e-4
    grad_clip: float = 1.0


def train_llama(
    model: PlainLlama, prepared, recipe: Recipe, seed: int
) -> tuple[list[float], float]:
    """Train on the prepared data's train split; (per-step losses, total model FLOPs)."""
    from pretrain.data import PackedLoader

    schedule = Schedule(recipe.lr, recipe.warmup_steps, recipe.steps, recipe.cooldown_steps, 0.0)
    groups = parameter_groups(model, recipe.weight_decay)
    optimizer = ClippedAtanAdam(groups, lr=recipe.lr, betas=(0.9, 0.95),
                                weight_decay=recipe.weight_decay)  # fmt: skip
    params = [p for p in model.parameters()]
    loader: Iterator = iter(PackedLoader(prepared, "train", recipe.micro_batch_size, 0, 1, seed))
    losses = []
    model.train()
    for step in range(recipe.steps):
        inputs, labels = next(loader)
        loss = model(inputs, labels)
        loss.backward()
        norm = global_grad_norm(params)
        schedule.apply(optimizer, step)
        clip_grads_(params, recipe.grad_clip, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    tokens = recipe.steps * recipe.micro_batch_size * prepared.block_size
    per_token = model.shape.cost.train_flops_per_token(prepared.block_size, 0, 0)
    return losses, per_token * tokens


@torch.no_grad()
def heldout_loss(model: PlainLlama, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy per token over the held-out batches."""
    model.eval()
    total = count = 0.0
    for inputs, labels in batches:
        total += float(model(inputs, labels)) * labels.numel()
        count += labels.numel()
    return total / count


def save_llama(model: PlainLlama, directory: Path, tokenizer: Path) -> Path:
    """A Hugging Face Llama directory: config.json, model.safetensors and the tokenizer."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(model.shape.hf_config(), indent=2) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    shutil.copyfile(tokenizer, directory / "tokenizer.json")
    return directory
