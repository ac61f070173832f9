"""Checks a training run makes before its first step, so a wrong assumption stops the run at once
with one line instead of costing an allocation.

Fused attention: the memory plan (pretrain/plan.py) counts attention as a fused kernel, which keeps
one log-sum-exp per head and query. If ``scaled_dot_product_attention`` fell back to its math path at
the run's dtype, head size and sequence length, it would store the T x T probabilities of every head
(for T = 4096 and 55 heads, about 1.7 GiB per sequence and layer in bf16) and the plan would be wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from recurrent_model import RecurrentConfig

from .precision import Precision

FUSED_KERNELS = ("flash", "efficient", "cudnn")


class StartupError(RuntimeError):
    """A start-up check refused the run; the message is one line naming what to change."""


def fused_kernels_on_gpu(
    device: torch.device, dtype: torch.dtype, n_heads: int, head_dim: int, seq_len: int
) -> dict[str, bool]:
    """Which fused SDPA kernels torch would pick for causal training attention of one sequence at
    this shape on ``device`` (CUDA or ROCm), each also enabled in ``torch.backends.cuda``."""
    cuda = torch.backends.cuda
    shape = (1, n_heads, seq_len, head_dim)
    q, k, v = (torch.empty(shape, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")
    params = cuda.SDPAParams(q, k, v, None, 0.0, True, False)
    checks: dict[str, tuple[Callable[[], bool], Callable[..., bool] | None]] = {
        "flash": (cuda.flash_sdp_enabled, getattr(cuda, "can_use_flash_attention", None)),
        "efficient": (
            cuda.mem_efficient_sdp_enabled,
            getattr(cuda, "can_use_efficient_attention", None),
        ),
        "cudnn": (cuda.cudnn_sdp_enabled, getattr(cuda, "can_use_cudnn_attention", None)),
    }
    return {
        name: bool(enabled() and usable is not None and usable(params, False))
        for name, (enabled, usable) in checks.items()
    }


def fused_attention_verdict(
    device_type: str,
    kernels: Mapping[str, bool],
    dtype: torch.dtype,
    head_dim: int,
    seq_len: int,
) -> str:
    """One line saying which fused kernel serves the run; raises ``StartupError`` when on a GPU
    none would (the math path). On the CPU it says what applies instead of checking."""
    dtype_name = str(dtype).removeprefix("torch.")
    if device_type != "cuda":
        return (
            f"attention on {device_type}: torch's CPU kernel serves causal {dtype_name} attention; "
            "the fused-kernel check applies on GPUs only"
        )
    usable = [name for name in FUSED_KERNELS if kernels.get(name)]
    if not usable:
        raise StartupError(
            f"scaled_dot_product_attention would use its math path (T x T probabilities per head) "
            f"for {dtype_name}, head size {head_dim}, {seq_len} tokens on this GPU; the memory plan "
            "assumes a fused kernel: change train.precision, the head size or the torch build"
        )
    return (
        f"attention: fused SDPA kernel(s) {', '.join(usable)} at {dtype_name}, head size {head_dim}"
    )


def check_fused_attention(
    device: torch.device, precision: Precision, config: RecurrentConfig, seq_len: int
) -> str:
    """The start-up check of the module docstring for this run; returns its one-line note."""
    kernels: dict[str, bool] = {}
    if device.type == "cuda":
        kernels = fused_kernels_on_gpu(
            device, precision.matmul_dtype, config.n_heads, config.head_dim, seq_len
        )
    return fused_attention_verdict(
        device.type, kernels, precision.matmul_dtype, config.head_dim, seq_len
    )
