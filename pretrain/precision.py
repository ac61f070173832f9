"""``train.precision`` resolved once: the one object autocast, the FSDP policy and the memory plan
read, so the three can never disagree.

The recipe's numerics: matrix products in bf16 (autocast casts their inputs), everything else in
float32 — the residual stream, the norms and their weights, the embedding output e, the noise s_0 and
every recurrent state s_i. A state iterated 32-132 times in bf16 is a different model.

Under FSDP/HSDP that decides the MixedPrecisionPolicy. A policy has one ``param_dtype`` per
``fully_shard`` unit, and a sandwich block reads its norm weights and its matrices from the block
itself (no sub-module is called, so no smaller unit could gather the norms on its own). Gathering a
block in bf16 would make its norm weights bf16 and turn the residual stream bf16; so the units are
gathered in float32 and autocast casts the matrices for the products, exactly as under DDP. Gradients
are reduced in float32 in both precisions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

PRECISIONS = ("auto", "bf16", "fp32")


class PrecisionError(ValueError):
    """A ``train.precision`` value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Precision:
    """How one run computes: ``name`` is "bf16" (bf16 matmuls under autocast) or "fp32"."""

    name: str
    device_type: str

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    @property
    def matmul_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype of the residual stream, norms, e, s_0 and every s_i: float32 in both."""
        return torch.float32

    @property
    def gather_dtype(self) -> torch.dtype:
        """The dtype FSDP gathers weights in (see the module docstring for why not bf16)."""
        return torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on this device type for "bf16"; nothing for "fp32"."""
        if self.bf16:
            return torch.autocast(device_type=self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def fsdp_policy(self) -> Any:
        """FSDP2's MixedPrecisionPolicy: float32 gathered weights, float32 gradient reduction, and
        forward inputs left as they come (the float32 residual stream is never cast down)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(
            param_dtype=self.gather_dtype,
            reduce_dtype=torch.float32,
            cast_forward_inputs=False,
        )


def resolve_precision(setting: str, device_type: str) -> Precision:
    """The run's precision from ``train.precision`` and the device type ("cuda" covers ROCm):
    "auto" is bf16 on a GPU and fp32 on the CPU; "bf16" and "fp32" are taken as given."""
    if setting not in PRECISIONS:
        raise PrecisionError(f"train.precision={setting!r}; choose from {', '.join(PRECISIONS)}")
    name = setting
    if setting == "auto":
        name = "bf16" if device_type == "cuda" else "fp32"
    return Precision(name, device_type)
