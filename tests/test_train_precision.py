"""One precision setting for autocast, the FSDP policy and the plan; the recipe's float32 state under
FSDP with bf16 matmuls (parity with DDP's autocast); the model built on the meta device, sharded,
then initialised to today's weights bit for bit (1 rank in process, 2 gloo ranks spawned)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cluster.context import DistContext
from pretrain.config import TrainConfig
from pretrain.distributed import (
    build_model,
    flat_mesh,
    init_parameters,
    materialise,
    reshard_core,
    shard_model,
)
from pretrain.plan import DEVICES, plan_memory
from pretrain.precision import PrecisionError, resolve_precision
from pretrain.strategy import get_strategy
from recurrent_model import RecurrentLM, preset

SEED = 11


def tiny_config():
    return preset(
        "small",
        n_embd=32,
        n_heads=2,
        vocab_size=300,
        block_size=16,
        intermediate_size=64,
        n_layers_in_prelude=1,
        n_layers_in_recurrent_block=2,
        n_layers_in_coda=1,
    )


def todays_init(config) -> RecurrentLM:
    model = RecurrentLM(config, init_weights=False)
    model.reset_parameters(generator=torch.Generator().manual_seed(SEED))
    return model


def full(param: torch.Tensor) -> torch.Tensor:
    return param.full_tensor() if hasattr(param, "full_tensor") else param


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield DistContext(0, 0, 1, torch.device("cpu"), "gloo")
    dist.destroy_process_group()


def sharded_tiny(precision) -> RecurrentLM:
    """The tiny model, FSDP2-sharded over a one-rank mesh (what fsdp does on many), initialised."""
    with torch.device("meta"):
        model = RecurrentLM(tiny_config(), init_weights=False)
    shard_model(model, flat_mesh(DistContext()), precision)
    materialise(model, torch.device("cpu"))
    init_parameters(model, SEED)
    return model


def test_precision_is_resolved_once_for_autocast_policy_and_plan():
    assert resolve_precision("auto", "cuda").name == "bf16"
    assert resolve_precision("auto", "cpu").name == "fp32"
    fp32_gpu = resolve_precision("fp32", "cuda")
    with fp32_gpu.autocast():  # fp32 on a GPU: no autocast, float32 gathers
        assert not torch.is_autocast_enabled("cuda")
    assert fp32_gpu.fsdp_policy().param_dtype == torch.float32
    bf16 = resolve_precision("bf16", "cpu")
    with bf16.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled(
            "cpu"
        )
    policy = bf16.fsdp_policy()  # the state stays float32: weights gathered in float32
    assert policy.param_dtype == policy.reduce_dtype == torch.float32
    assert not policy.cast_forward_inputs
    with pytest.raises(PrecisionError, match="train.precision='fp16'"):
        resolve_precision("fp16", "cuda")
    raw = {"model": {"overrides": {"n_embd": 64, "n_heads": 2}}, "distributed": {}}
    for setting, copies in (("fp32", False), ("bf16", True)):
        raw["train"] = {"precision": setting}
        plan = plan_memory(TrainConfig.from_dict(raw), DEVICES["h100"], 1, 2, "ddp")
        assert any(r.name.startswith("bf16 weight copies") for r in plan.rows) is copies


def record_dtypes(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[dict, dict, torch.Tensor]:
    """Every hook's activation dtype and each block's norm-weight dtype during one bf16-autocast
    forward (read after FSDP's own pre-forward gather), and the loss."""
    acts: dict[str, set[str]] = {}
    norms: dict[str, set[torch.dtype]] = {}

    def on_activation(tensor: torch.Tensor, hook) -> None:
        acts.setdefault(hook.name, set()).add(str(tensor.dtype))

    handles = [
        block.register_forward_pre_hook(
            lambda b, args, i=i: norms.setdefault(f"block{i}", set()).update(
                {b.norm_1.weight.dtype, b.norm_4.weight.dtype}
            )
        )
        for i, block in enumerate(model.blocks())
    ]
    try:
        with (
            model.hooks([(lambda name: True, on_activation)]),
            torch.autocast("cpu", torch.bfloat16),
        ):
            loss = model(
                inputs, num_steps=3, labels=inputs, generator=torch.Generator().manual_seed(0)
            ).loss
    finally:
        for h in handles:
            h.remove()
    return acts, norms, loss


def train_one_step(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    with torch.autocast("cpu", torch.bfloat16):
        out = model(inputs, num_steps=3, labels=inputs, generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    reshard_core(model)  # as the trainer does: the core's gradients land on the shards
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        after = model(
            inputs, num_steps=3, labels=inputs, generator=torch.Generator().manual_seed(0)
        )
    return float(after.loss)


def test_fsdp_bf16_keeps_the_float32_state_and_matches_ddp_autocast(one_rank_group):
    inputs = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    plain = todays_init(tiny_config())  # what DDP runs: float32 weights under autocast
    sharded = sharded_tiny(resolve_precision("bf16", "cpu"))
    acts, norms, loss = record_dtypes(sharded, inputs)
    for name in ("hook_embed", "hook_e", "core.hook_state", "hook_latent", "hook_final_norm"):
        assert acts[name] == {"torch.float32"}, name
    assert acts["core.0.hook_resid_post"] == {"torch.float32"}  # every s_i's residual stream
    assert acts["core.0.hook_mlp_out"] == {"torch.bfloat16"}  # the matmuls are bf16
    assert all(d == {torch.float32} for d in norms.values())
    ddp_acts, _, ddp_loss = record_dtypes(plain, inputs)
    assert acts == ddp_acts
    torch.testing.assert_close(loss, ddp_loss)
    assert train_one_step(sharded, inputs) == pytest.approx(train_one_step(plain, inputs), rel=1e-5)


def test_meta_build_gives_todays_weights_on_one_rank(one_rank_group):
    reference = list(todays_init(tiny_config()).parameters())
    for strategy in ("ddp", "bucketed"):
        model, wrapped = build_model(
            tiny_config(),
            one_rank_group,
            resolve_precision("fp32", "cpu"),
            get_strategy(strategy),
            SEED,
        )
        assert wrapped is model and model.lm_head.weight is model.transformer.wte.weight
        assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))
    sharded = sharded_tiny(resolve_precision("bf16", "cpu"))
    assert all(torch.equal(a, full(b)) for a, b in zip(reference, sharded.parameters()))


def _two_rank_build(rank: int, store: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ctx = DistContext(rank, rank, 2, torch.device("cpu"), "gloo")
        reference = list(todays_init(tiny_config()).parameters())
        inputs = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
        report = {}
        for strategy, shard_size in (("fsdp", 0), ("hsdp", 1), ("ddp", 0)):
            precision = resolve_precision("bf16", "cpu")
            chosen = get_strategy(strategy, shard_size=shard_size)
            model, _ = build_model(tiny_config(), ctx, precision, chosen, SEED)
            same = all(torch.equal(a, full(b)) for a, b in zip(reference, model.parameters()))
            acts, norms, _ = record_dtypes(model, inputs)  # a collective forward under fsdp/hsdp
            state = acts["core.hook_state"] | acts["hook_e"] | acts["core.0.hook_resid_post"]
            float32 = state == {"torch.float32"} and all(
                d == {torch.float32} for d in norms.values()
            )
            report[strategy] = (same, float32)
        results[rank] = report
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_meta_build_gives_todays_weights_on_two_gloo_ranks(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_two_rank_build, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
    # (today's initial weights, float32 state and norms under bf16) for every strategy and rank
    want = {"fsdp": (True, True), "hsdp": (True, True), "ddp": (True, True)}
    assert dict(results) == {r: want for r in range(2)}
