"""Decode and prefill speed: KV-cached, compiled and the published implementation, in one run.

A random model of the "small" preset: h = 256, (l_P, l_R, l_C) = (1, 2, 1), 4 heads of 64, MLP 704,
V = 4096, r = 8; a 32-token prompt, 64 new tokens, 2 threads, greedy with init_scale = 0 so that
every method must produce the same tokens (checked). Every method runs once per round for
``--repeats`` rounds and its best round is kept (the machines are shared); decode tokens/s counts the
tokens after the first, from the first token's arrival to the last one's; CPU ms/token is the process
CPU time over the same span, less sensitive to other processes than wall time.

The compiled decode's share of the weight-read floors comes from rounds of their own: each times one
compiled generate call, then each floor as the mean of as many consecutive calls as the call timed
tokens, so that the decode and its floors meet the same load with the same estimator; it prints the
best decode over the best floor and the per-round ratios (median and range).

Side by side in the same run (each when its prerequisites are there):
- ``generate(..., compile=True)`` (static-shape compiled decode, one-time compile cost printed);
- the published implementation's ``generate_minimal`` on the same weights, run by
  ``bench/published_runner.py`` in its own virtual environment (``--published-python``, with
  ``transformers<4.58``) from a directory holding its ``recpre`` package (``--published-src``).
  Set-up used: ``python -m venv $TMPDIR/pubvenv`` with a .pth line pointing at this project's
  site-packages (for torch), ``$TMPDIR/pubvenv/bin/pip install "transformers<4.58"``, and
  ``recpre/{raven_modeling_minimal,raven_config_minimal}.py`` taken from
  github.com/seal-rg/recurrent-pretraining into ``--published-src`` beside an empty
  ``recpre/__init__.py`` (the published one imports its training modules);
- prefill of 4 × 256 tokens at r = 32: our cached chunk eager and compiled, the published forward,
  and torch.mm's FLOP/s on exactly the model's matmul shapes (the fraction of the machine reached),
  all four once per round for 2 × ``--repeats`` rounds;
- bfloat16 decode, and with ``--huginn-shape`` a few bf16 tokens of the 3.5B Huginn-0125 shape
  beside their torch.sum read floor (``--huginn-compiled``: compiled too).

With a trained checkpoint (``--checkpoint``, default ``checkpoints/default`` when it exists) it also
measures speculative decoding and adaptive exit there, where drafts and exits mean something.

    python bench/bench_decode.py [--repeats 3] [--threads 2] [--checkpoint DIR]
        [--published-python /tmp/pubvenv/bin/python --published-src /tmp/pubsrc] [--huginn-shape T]
        [--huginn-compiled]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

# OpenMP's default (spinning) wait policy is the faster one on an idle machine; on a loaded shared
# machine spinning threads collapse against the other load: there, export OMP_WAIT_POLICY=PASSIVE
# before running this script.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
# ACTIVE alone spins idle threads for ~30e9 iterations (libgomp), so this process's two threads would
# keep both cores busy while the published runner (a child process) is timed, and slow it down. A
# finite spin count (a few ms) keeps spinning between our own kernels and lets the threads sleep
# while the child runs.
os.environ.setdefault("GOMP_SPINCOUNT", "10000000")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

import recurrent_model as rm  # noqa: E402
from recurrent_model import hook_names  # noqa: E402
from recurrent_model import inductor_serial_chains as chains  # noqa: E402
from recurrent_model.cached_forward import ChunkRunner  # noqa: E402
from recurrent_model.compiled import (  # noqa: E402
    CompiledDecode,
    choose_product,
    compile_state,
    cpu_options,
)
from recurrent_model.functional import linear  # noqa: E402
from recurrent_model.loop_compiled import layer_weights  # noqa: E402
from recurrent_model.ouro import OuroConfig, OuroLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_forward import attention_flops, matmul_shapes, matmul_time  # noqa: E402

PROMPT, NEW, STEPS = 32, 64, 8
Result = tuple[
    float, float, float, object
]  # wall s of the call, decode tok/s, CPU ms/token, output


def timed_generate(model: rm.RecurrentLM, ids: torch.Tensor, steps: int = STEPS, **kw) -> Result:
    """One generate call: decode speed from the first token's arrival to the last one's."""
    stamps: list[tuple[float, float]] = []
    start = time.perf_counter()
    out = model.generate(ids, NEW, num_steps=steps, init_scale=0.0, stop_tokens=(),
                         streamer=lambda t, s: stamps.append((time.perf_counter(), time.process_time())),
                         return_details=True, **kw)  # fmt: skip
    total = time.perf_counter() - start
    n = len(stamps) - 1
    wall, cpu = stamps[-1][0] - stamps[0][0], stamps[-1][1] - stamps[0][1]
    return total, n / wall, 1e3 * cpu / n, out


def recompute(model: rm.RecurrentLM, ids: torch.Tensor) -> Result:
    """Greedy decoding that reruns the whole sequence for every token (no cache)."""
    start, cpu0 = time.perf_counter(), time.process_time()
    seq = ids
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(seq, num_steps=STEPS, init_scale=0.0).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    total = time.perf_counter() - start
    return total, NEW / total, 1e3 * (time.process_time() - cpu0) / NEW, seq


def best_interleaved(repeats: int, methods: dict[str, Callable[[], Result]]) -> dict[str, Result]:
    """Run every method once per round (so load changes hit all alike); keep each one's best."""
    best: dict[str, Result] = {}
    for _ in range(repeats):
        for name, fn in methods.items():
            result = fn()
            if name not in best or result[1] > best[name][1]:
                best[name] = result
    return best


def with_hook(model: rm.RecurrentLM, ids: torch.Tensor) -> Result:
    with model.hooks([(hook_names.STATE, lambda x, hook: None)]):
        return timed_generate(model, ids)


def print_table(results: dict[str, Result], base: str, reference: torch.Tensor) -> None:
    head = (f"{'method':40} {'total s':>7} {'tok/s':>7} {'speed-up':>8} {'cpu ms/tok':>10} "
            f"{'cpu speed-up':>12} {'same':>5} {'steps':>5} {'accept':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    _, base_rate, base_cpu, _ = results[base]
    for name, (total, rate, cpu, out) in results.items():
        seq = out if isinstance(out, torch.Tensor) else out.sequences
        steps = f"{out.mean_steps:5.2f}" if not isinstance(out, torch.Tensor) else f"{STEPS:5.2f}"
        acc = getattr(out, "acceptance_rate", None)
        acc_s = f"{acc:.2f}" if acc is not None else "-"
        print(f"{name:40} {total:7.2f} {rate:7.1f} {rate / base_rate:7.1f}x {cpu:10.2f} "
              f"{base_cpu / cpu:11.1f}x {str(torch.equal(seq, reference)):>5} {steps} {acc_s:>6}")  # fmt: skip


def bench_checkpoint(path: str, repeats: int) -> None:
    """Speculative decoding and adaptive exit on a trained checkpoint, against plain cached greedy."""
    model = rm.load_model(path)
    if model.tokenizer is None:
        print(f"\n(checkpoint {path} has no tokenizer.json: skipped)")
        return
    steps = model.config.mean_recurrence
    text = "The history of the city begins"
    ids = torch.tensor([model.tokenizer.encode(text)])
    timed_generate(model, ids, steps)
    variants = {
        f"KV cache, r={steps}": {},
        "speculative, draft 4 / lookahead 8": {"draft_steps": 4, "lookahead": 8},
        "speculative, draft 2 / lookahead 8": {"draft_steps": 2, "lookahead": 8},
        "adaptive exit kl 5e-4": {"exit_criterion": "kl"},
        "adaptive exit kl 5e-4 + continuous": {"exit_criterion": "kl", "continuous_compute": True},
    }
    methods = {
        n: (lambda kw=kw: timed_generate(model, ids, steps, **kw)) for n, kw in variants.items()
    }
    results = best_interleaved(repeats, methods)
    print(f"\ncheckpoint {path}: prompt {text!r} ({ids.shape[1]} tokens), {NEW} new tokens")
    base = f"KV cache, r={steps}"
    print_table(results, base, results[base][3].sequences)


class Published:
    """The published ``generate_minimal`` on our model's weights, in its own virtual environment."""

    def __init__(self, python: str, src: str, model: rm.RecurrentLM, ids: torch.Tensor,
                 threads: int) -> None:  # fmt: skip
        from safetensors.torch import save_file

        cfg = model.config
        self.dir = tempfile.mkdtemp(prefix="published-bench-")
        atexit.register(shutil.rmtree, self.dir, True)
        weights = os.path.join(self.dir, "model.safetensors")
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, weights)
        self.python = python
        self.request = {
            "src": src, "weights": weights, "ids": ids.tolist(), "new": NEW, "steps": STEPS,
            "threads": threads, "repeats": 1, "prefill": None,
            "config": {
                "n_embd": cfg.n_embd, "n_heads": cfg.n_heads, "n_layers": cfg.n_layers,
                "block_size": cfg.block_size, "vocab_size": cfg.vocab_size,
                "padding_multiple": cfg.padding_multiple,
                "intermediate_size": cfg.intermediate_size,
                "n_layers_in_recurrent_block": cfg.n_layers_in_recurrent_block,
                "n_layers_in_prelude": cfg.n_layers_in_prelude,
                "n_layers_in_coda": cfg.n_layers_in_coda, "mean_recurrence": cfg.mean_recurrence,
                "mean_backprop_depth": cfg.mean_backprop_depth, "rope_base": cfg.rope_base,
                "norm_eps": cfg.norm_eps,
            },
        }  # fmt: skip

    def run(self, prefill: list[int] | None = None, decode: bool = True) -> dict:
        request = {**self.request, "prefill": prefill, "decode": decode}
        runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published_runner.py")
        out = subprocess.run([self.python, runner, json.dumps(request)], capture_output=True,
                             text=True, check=False, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"published runner failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def decode(self) -> Result:
        d = self.run()["decode"]
        return d["total"], d["rate"], d["cpu_ms"], torch.tensor(d["tokens"])


def compiled_generate(model: rm.RecurrentLM, ids: torch.Tensor, steps: int = STEPS) -> Result:
    return timed_generate(model, ids, steps, compile=True)


def prefill_runner(model: rm.RecurrentLM, ids: torch.Tensor, steps: int,
                   compiled: bool) -> Callable[[], None]:  # fmt: skip
    """One cached chunk over the whole prompt (what generate's prefill runs), eager or compiled."""
    B, T = ids.shape
    cache = rm.KVCache(model.config, B, T, steps, device=model.device, dtype=model.dtype)
    runner = ChunkRunner(model, cache)
    decode = CompiledDecode(model, cache, steps) if compiled else None
    state = torch.zeros(B, T, model.config.n_embd, dtype=model.dtype)

    @torch.inference_mode()
    def once() -> None:
        if decode is not None:
            decode(ids, 0, state)
            return
        runner.run(ids, 0, steps, lambda e: state)

    return once


def bench_prefill(model: rm.RecurrentLM, published: Published | None, rounds: int) -> None:
    """4 × 256 tokens at r = 32: ours eager / compiled, published, torch.mm on the same shapes, each
    once per round (one run is ~1 s, and this machine's speed drifts by tens of percent)."""
    B, T, r = 4, 256, 32
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(3))
    eager, compiled = prefill_runner(model, ids, r, False), prefill_runner(model, ids, r, True)
    t0 = time.perf_counter()
    compiled()
    print(f"\nprefill {B} x {T} tokens at r={r} (compile and first run {time.perf_counter() - t0:.0f} s); "
          f"best of {rounds} interleaved rounds of all four")  # fmt: skip
    shapes = matmul_shapes(cfg, B * T, r)
    best = dict.fromkeys(("eager", "compiled", "mm", "pub"), float("inf"))
    mm_flops = 0.0
    for _ in range(rounds):
        for name, fn in (("eager", eager), ("compiled", compiled)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
        mm_s, mm_flops = matmul_time(shapes, 1)
        best["mm"] = min(best["mm"], mm_s)
        if published is not None:  # its own process: a warm-up forward, then one timed
            best["pub"] = min(best["pub"], published.run([B, T, r], decode=False)["prefill_s"])
    pub = best["pub"] if published is not None else None
    all_logits = mm_flops + B * attention_flops(cfg, T, r)
    last_logits = all_logits - 2 * (B * T - B) * cfg.n_embd * cfg.vocab_size  # our head: last only
    mm_rate = mm_flops / best["mm"]
    rows = [("ours, cached chunk (eager)", best["eager"], last_logits),
            ("ours, compiled", best["compiled"], last_logits)]  # fmt: skip
    if pub is not None:
        rows.append(("published forward (all logits)", pub, all_logits))
    print(f"{'method':32} {'s':>7} {'tok/s':>8} {'vs published':>12} {'of matmul FLOP/s':>16}")
    for name, sec, flops in rows:  # each counted with the FLOPs it does
        vs = f"{pub / sec:11.2f}x" if pub is not None else f"{'-':>12}"
        print(f"{name:32} {sec:7.3f} {B * T / sec:8.0f} {vs} {flops / sec / mm_rate:16.1%}")
    print(f"torch.mm on the model's matmul shapes: {mm_rate / 1e9:.1f} GFLOP/s "
          f"({best['mm']:.3f} s for the forward's matmuls)")  # fmt: skip


def token_weights(model: rm.RecurrentLM, steps: int) -> list[torch.Tensor]:
    """Every weight matrix one decoded token multiplies, in forward order (prelude, ``steps`` × adapter
    and core, coda, head): the bytes a batch-1 token has to read."""
    t = model.transformer

    def block(b) -> list[torch.Tensor]:
        w = b.weights()
        return [w.wqkv, w.attn_proj, w.mlp_fc, w.mlp_proj]

    calls = [w for b in t.prelude for w in block(b)]
    for _ in range(steps):
        calls += [t.adapter.weight, *(w for b in t.core_block for w in block(b))]
    return calls + [w for b in t.coda for w in block(b)] + [model.lm_head.weight]


def floor_calls(model: rm.RecurrentLM, steps: int) -> tuple[dict[str, Callable[[], None]], int]:
    """Four floors for one token on the model's own weights, in forward order, as calls: its
    matrix-vector products alone with torch's kernels ("torch"), the same products as the compiled
    decode writes them (``functional.linear`` in one compiled graph, each input taken from the
    previous output so that nothing is shared or skipped: "compiled"), reading each weight once in one
    compiled graph ("read") and with one ``torch.sum`` per weight ("torch.sum"); plus the bytes one
    token reads.

    "torch" is ``F.linear`` of a (1, 1, ·) input with nothing between the products: 1 / that is the
    decode speed a perfect fusion of everything else would reach with torch's kernels. "compiled" is
    the part of a compiled token that is projections; the rest of the token is attention, norms and the
    host's per-token work. "read" is the floor the decode is measured against: a row sum of every
    weight, all in one compiled kernel as the token's products are (vectorised, rows split between the
    threads, one barrier per weight, no per-weight dispatch), the same cache reuse as the forward (the
    core weights are read ``steps`` times). Each read takes its own view of its weight, so the graph
    cannot merge the reads of a reused weight into one. "torch.sum" is the same reads dispatched one
    op at a time from Python: the host's per-op work and torch's full reduction on top of the bytes,
    so the compiled products can beat it and it is no floor; printed as the reference of older rows.
    Both compiled floors take the compiled decode's inductor options (``compiled.cpu_options``: the
    same launcher, memory pool and ISA), so neither pays host work the decode does not.
    """
    calls = token_weights(model, steps)
    inputs = {n: torch.randn(1, 1, n) for n in {w.shape[1] for w in calls}}

    @torch.inference_mode()
    def products() -> None:
        for w in calls:
            F.linear(inputs[w.shape[1]], w)

    # Each product scales a random input's norm by about ‖w‖_F / √in; undone after each, so that
    # the chain's values stay normal floats (dozens of products shrink them into the subnormal
    # range, where some CPUs take a slow path for every multiply)
    gains = [w.shape[1] ** 0.5 / w.float().norm().item() for w in calls]

    def chain(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for w, gain in zip(weights, gains, strict=True):
            n = w.shape[1]
            x = torch.cat([x] * -(-n // x.shape[-1]), dim=-1)[..., :n]
            x = linear(x, w) * gain
        return x

    compiled = torch.compile(chain, fullgraph=True, options=cpu_options())
    start = torch.randn(1, 1, model.config.n_embd)

    @torch.inference_mode()
    def compiled_products() -> None:
        compiled(calls, start)

    def row_sums(weights: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([w.sum(1) for w in weights])

    compiled_reads = torch.compile(row_sums, fullgraph=True, options=cpu_options())
    views = [w[:] for w in calls]  # one input per read: a reused weight is read at each use

    @torch.inference_mode()
    def reads() -> None:
        compiled_reads(views)

    @torch.inference_mode()
    def torch_sums() -> None:
        for w in calls:
            w.sum()

    compiled_products()  # compile outside the timing
    reads()
    nbytes = sum(w.numel() * w.element_size() for w in calls)
    floors = {
        "torch": products,
        "compiled": compiled_products,
        "read": reads,
        "torch.sum": torch_sums,
    }
    return floors, nbytes


def mean_time(call: Callable[[], None], n: int) -> float:
    """Seconds per call over ``n`` consecutive calls (the span a decode round's tokens take)."""
    call()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def floor_rounds(
    model: rm.RecurrentLM, ids: torch.Tensor, rounds: int
) -> tuple[list[tuple[float, dict[str, float]]], int]:
    """Per round, the compiled decode's tokens/s and then each floor's seconds per token, each
    averaged over as many consecutive calls as the decode has timed tokens: the decode and its
    floors measured side by side, under the same load and with the same estimator. Also the bytes
    of weights one token reads."""
    calls, nbytes = floor_calls(model, STEPS)
    out = []
    for _ in range(rounds):
        rate = compiled_generate(model, ids)[1]
        out.append((rate, {name: mean_time(call, NEW - 1) for name, call in calls.items()}))
    return out, nbytes


def bench_dtype(model: rm.RecurrentLM, ids: torch.Tensor, repeats: int) -> None:
    """Greedy decode in bfloat16: eager cached and compiled."""
    bf = rm.RecurrentLM(model.config).eval()
    bf.load_state_dict(model.state_dict())
    bf = bf.to(torch.bfloat16)
    methods = {"bfloat16 KV cache": lambda: timed_generate(bf, ids),
               "bfloat16 compiled": lambda: compiled_generate(bf, ids)}  # fmt: skip
    t0 = time.perf_counter()
    compiled_generate(bf, ids)  # compile outside the timed rounds
    print(f"\nbfloat16 (compile {time.perf_counter() - t0:.0f} s)")
    results = best_interleaved(repeats, methods)
    print_table(results, "bfloat16 KV cache", results["bfloat16 KV cache"][3].sequences)


def random_bf16(model: torch.nn.Module) -> None:
    """Fill a model materialised with ``to_empty`` with normal weights (std 0.02, seed 0), in
    place, in its dtype."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def huginn_shape_model() -> rm.RecurrentLM:
    """A bf16 model of the 3.5B Huginn-0125 shape with random weights (normal, std 0.02)."""
    cfg = rm.preset("huginn-0125")
    with torch.device("meta"):
        model = rm.RecurrentLM(cfg, init_weights=False)
    model = model.to_empty(device="cpu").to(torch.bfloat16).eval()
    model.lm_head.weight = model.transformer.wte.weight
    random_bf16(model)
    return model


#: Ouro-1.4B's published shape (/work/shared/spec/families.md): 24 layers looped 4 times, h = 2048,
#: 16 heads, MLP 5632, V = 49152, untied head.
OURO_SHAPE = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 16, "intermediate_size": 5632, "vocab_size": 49152,
              "total_ut_steps": 4, "max_position_embeddings": 4096, "name": "ouro-1.4b-shape"}  # fmt: skip


def ouro_shape_model() -> OuroLM:
    """A bf16 model of Ouro-1.4B's shape with random weights (normal, std 0.02)."""
    with torch.device("meta"):
        model = OuroLM(OuroConfig(**OURO_SHAPE))
    model = model.to_empty(device="cpu").to(torch.bfloat16).eval()
    random_bf16(model)
    return model


def ouro_token_weights(model: OuroLM, steps: int) -> list[torch.Tensor]:
    """Every weight matrix one Ouro token multiplies: ``steps`` times each layer's seven
    projections, then the head (the exit gate's one row and the norms are left out)."""
    projections = [w for layer in model.model.layers for w in layer_weights(layer)
                   if w.dim() == 2]  # fmt: skip
    return projections * steps + [model.lm_head.weight.detach()]


def bench_huginn_shape(tokens: int, compiled: bool, rounds: int) -> None:
    """bf16 tokens of a random model of the 3.5B Huginn-0125 shape against their read floor."""
    model = huginn_shape_model()
    steps = model.config.mean_recurrence
    title = f"Huginn-0125 shape ({model.num_parameters() / 1e9:.2f}B parameters, random)"
    bench_shape(title, model, steps, token_weights(model, steps), tokens, compiled, rounds)


def bench_ouro_shape(tokens: int, compiled: bool, rounds: int) -> None:
    """bf16 tokens of a random model of Ouro-1.4B's shape against their read floor."""
    model = ouro_shape_model()
    steps = model.config.total_ut_steps
    title = f"Ouro-1.4B shape ({model.num_parameters() / 1e9:.2f}B parameters, random)"
    bench_shape(title, model, steps, ouro_token_weights(model, steps), tokens, compiled, rounds)


def bench_shape(title: str, model: torch.nn.Module, steps: int, weights: list[torch.Tensor],
                tokens: int, compiled: bool, rounds: int) -> None:  # fmt: skip
    """bf16 tokens of a large random ``model``, eager and (``compiled``) compiled: per round one
    generate call, then the torch.sum read floor of ``weights``, those one token reads (the
    machine's bandwidth drifts between rounds; with megabytes per weight the per-op dispatch that
    keeps torch.sum off the floor on the small preset, :func:`floor_calls`, is a small share
    here); eager and compiled each ``rounds`` calls, the compiled ones after a first (compiling)
    call. Greedy from the same prompt, so both must give
    the same tokens (printed)."""
    ids = torch.randint(
        0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1)
    )
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    print(f"\n{title}, bf16, r={steps}, 8-token prompt, {tokens} new tokens, "
          f"{torch.get_num_threads()} threads; one token reads {nbytes / 1e9:.2f} GB of weights")  # fmt: skip

    @torch.inference_mode()
    def read_floor() -> float:
        t0 = time.perf_counter()
        for w in weights:
            w.sum()
        return time.perf_counter() - t0

    def per_token(compile_: bool) -> tuple[float, float, list[int]]:
        """(seconds to the first token, seconds per token after it, the tokens) of one call."""
        stamps: list[float] = []
        t0 = time.perf_counter()
        out = model.generate(ids, tokens, num_steps=steps, init_scale=0.0, stop_tokens=(),
                             compile=compile_, streamer=lambda t, s: stamps.append(time.perf_counter()))  # fmt: skip
        return (
            stamps[0] - t0,
            (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1),
            out[0, 8:].tolist(),
        )

    for name, compile_ in [("eager", False), ("compiled", True)][: 1 + compiled]:
        if compile_:
            first, token, out = per_token(True)
            print(f"compiled, first call: {first:.0f} s to the first token (compile and product "
                  f"timing), then {token:.2f} s per token -> {out}")  # fmt: skip
        measured = []
        for _ in range(rounds):
            _, token, out = per_token(compile_)
            measured.append((token, read_floor()))
        best_token, best_floor = min(t for t, _ in measured), min(f for _, f in measured)
        shares = sorted(f / t for t, f in measured)
        print(f"{name}: {best_token:.3f} s per token (best of {len(measured)} calls), torch.sum read "
              f"floor {best_floor:.3f} s ({nbytes / best_floor / 1e9:.1f} GB/s): "
              f"{best_floor / best_token:.1%} of it best over best; per call (each floor read right "
              f"after its tokens) {shares[len(shares) // 2]:.1%} median, {shares[0]:.1%} to "
              f"{shares[-1]:.1%} -> {out}")  # fmt: skip
    if compiled:
        print_product_choice(model)


def report_floors(
    model: rm.RecurrentLM, ids: torch.Tensor, results: dict[str, Result], rounds: int
) -> None:
    """The weight floors of one token and the compiled decode's share of them, from rounds that
    time the decode and its floors side by side (:func:`floor_rounds`); the published rate (when it
    ran), and the product chosen per projection shape, all from this run."""
    measured, nbytes = floor_rounds(model, ids, rounds)
    rate = max(r for r, _ in measured)
    floor = {name: min(t[name] for _, t in measured) for name in measured[0][1]}
    shares = sorted(r * t["read"] for r, t in measured)
    print(f"one token's {nbytes / 1e6:.1f} MB of weights, best of {rounds} rounds that each time "
          f"{NEW} compiled decode tokens then {NEW - 1} calls of each floor: torch's matrix-vector "
          f"products alone {1e3 * floor['torch']:.2f} ms ({1 / floor['torch']:.0f} tokens/s), the "
          f"sum-written products alone {1e3 * floor['compiled']:.2f} ms "
          f"({1 / floor['compiled']:.0f} tokens/s), a read of each weight in one compiled kernel "
          f"{1e3 * floor['read']:.2f} ms ({1 / floor['read']:.0f} tokens/s, "
          f"{nbytes / floor['read'] / 1e9:.1f} GB/s), one torch.sum per weight "
          f"{1e3 * floor['torch.sum']:.2f} ms ({1 / floor['torch.sum']:.0f} tokens/s)")  # fmt: skip
    print(f"weight-read floor {1 / floor['read']:.0f} tokens/s; compiled decode {rate:.0f} tokens/s "
          f"({1e3 / rate:.2f} ms per token) = {rate * floor['read']:.1%} of the read floor "
          f"(goal >= 90%; per round {shares[len(shares) // 2]:.1%} median, {shares[0]:.1%} to "
          f"{shares[-1]:.1%}), {rate * floor['torch']:.1%} of the torch-products floor, "
          f"{rate * floor['compiled']:.1%} of the sum-written-products floor, "
          f"{rate * floor['torch.sum']:.1%} of the torch.sum reads")  # fmt: skip
    published = results.get("published generate_minimal")
    if published is not None:
        print(f"published generate_minimal {published[1]:.0f} tokens/s: ours compiled "
              f"{rate / published[1]:.1f}x; the read floor is {1 / floor['read'] / published[1]:.1f}x "
              "the published rate")  # fmt: skip
    else:
        print("published implementation not run (no --published-python / --published-src)")
    print_product_choice(model)


def print_token_regions(source: str) -> None:
    """The OpenMP regions of the token's kernel (the largest graph compiled): its loops shared
    between the threads, its serial ones, and the barriers a token waits at, with and without
    serial loops chained (``recurrent_model.inductor_serial_chains``): each region's own spinning
    barriers and OpenMP's (a region's end, a shared loop's end, ``omp barrier``)."""
    pragmas = re.findall(r"#pragma omp (\w+)", source)
    shared, serial = pragmas.count("for"), pragmas.count("single") + pragmas.count("master")
    spinning = len(re.findall(r"\bbarrier_\d+\(\);", source))
    regions = pragmas.count("parallel")  # each ends in a barrier
    waits = regions + pragmas.count("barrier") + pragmas.count("single") + spinning
    waits += len(re.findall(r"#pragma omp for(?! nowait)", source))  # ends in a barrier
    if pragmas.count("master"):
        waits_text = (f"{waits} barriers per token, {spinning} of them the kernel's own spinning "
                      f"ones (serial loops chained; one per loop would be {regions + shared + serial})")  # fmt: skip
    else:
        waits_text = f"{waits} barriers per token (one per loop: serial loops not chained"
        waits_text += ")" if chains.supported() else f" on torch {torch.__version__})"
    print(
        f"token kernel: {shared} loops shared between the threads, {serial} serial loops, "
        f"{waits_text}"
    )


def print_product_choice(model: torch.nn.Module) -> None:
    """Per projection shape, the compiled decode's timing of both products (best round, and the
    weight bytes each streams per second), the one it picked and why; and where torch's product was
    faster alone, the check on whole tokens that kept it or not."""
    names = {"sum": "sum-written", "matvec": "torch matvec"}
    for (shape, dtype), timing in sorted(compile_state(model).products.items(), key=str):
        choice = choose_product(timing)
        nbytes = shape[0] * shape[1] * dtype.itemsize
        best = ", ".join(f"{names[n]} {1e6 * t:.1f} us ({nbytes / t / 1e9:.1f} GB/s)"
                         for n, t in timing.best.items())  # fmt: skip
        print(f"  projection {shape[0]}x{shape[1]} {str(dtype).removeprefix('torch.')}: {best} "
              f"-> {names[choice.product]} ({choice.reason})")  # fmt: skip
    for check in compile_state(model).token_checks.values():
        best = ", ".join(f"{names[n]} {1e6 * t:.0f} us" for n, t in check.timing.best.items())
        print(f"  whole tokens with torch's products at {list(check.shapes)}: {best} per token "
              f"-> {names[check.choice.product]} ({check.choice.reason})")  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument(
        "--published-python",
        default=os.environ.get("PUBLISHED_PYTHON"),
        help="python of a venv with transformers<4.58 (published implementation)",
    )
    parser.add_argument(
        "--published-src",
        default=os.environ.get("PUBLISHED_SRC"),
        help="directory holding the published recpre package",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only re-computation, KV cache, compiled and published decode",
    )
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument(
        "--huginn-shape",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also decode TOKENS bf16 tokens of the 3.5B shape (about 8 GB)",
    )
    parser.add_argument(
        "--huginn-compiled",
        action="store_true",
        help="with --huginn-shape, also the compiled decode (its compile takes minutes)",
    )
    parser.add_argument(
        "--ouro-shape",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also decode TOKENS bf16 tokens of Ouro-1.4B's shape (about 3 GB), eager",
    )
    parser.add_argument(
        "--ouro-compiled",
        action="store_true",
        help="with --ouro-shape, also the compiled decode",
    )
    parser.add_argument(
        "--only-shapes",
        action="store_true",
        help="run only the --huginn-shape / --ouro-shape benchmarks",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.only_shapes:
        if args.huginn_shape:
            bench_huginn_shape(args.huginn_shape, args.huginn_compiled, args.repeats)
        if args.ouro_shape:
            bench_ouro_shape(args.ouro_shape, args.ouro_compiled, args.repeats)
        return
    load0 = os.getloadavg()[0]
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("small")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    timed_generate(model, ids)  # warm-up
    t0 = time.perf_counter()
    first, sources = run_and_get_code(compiled_generate, model, ids)
    print(f"one-time compile of the decode step and the {PROMPT - 1}-token prefill: "
          f"{first[3].compile_seconds:.1f} s (first compiled generate call {time.perf_counter() - t0:.1f} s)")  # fmt: skip
    print_token_regions(max(sources, key=len))
    published = None
    if args.published_python and args.published_src:
        published = Published(args.published_python, args.published_src, model, ids, args.threads)
    variants = {"KV cache, fast path": {}}
    if not args.quick:
        variants.update({
            "KV cache, cache_budget=4": {"cache_budget": 4},
            "speculative, draft 4 / lookahead 4": {"draft_steps": 4, "lookahead": 4},
            "speculative, draft 2 / lookahead 8": {"draft_steps": 2, "lookahead": 8},
            "adaptive exit kl 5e-4": {"exit_criterion": "kl"},
            "adaptive exit minp-kl 1e-5": {"exit_criterion": "minp-kl"},
            "adaptive exit latent-diff 0.03": {"exit_criterion": "latent-diff"},
        })  # fmt: skip
    methods: dict[str, Callable[[], Result]] = {}
    if published is not None:
        methods["published generate_minimal"] = published.decode
    methods["full re-computation (no cache)"] = lambda: recompute(model, ids)
    methods.update(
        {n: (lambda kw=kw: timed_generate(model, ids, **kw)) for n, kw in variants.items()}
    )
    methods["KV cache, compiled (compile=True)"] = lambda: compiled_generate(model, ids)
    if not args.quick:
        methods["KV cache, model layers (hook attached)"] = lambda: with_hook(model, ids)
    results = best_interleaved(args.repeats, methods)

    print(f"decode benchmark: h=256 (1,2,1) r={STEPS}, V=4096, prompt {PROMPT}, {NEW} new tokens, "
          f"float32, {args.threads} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
          f"best of {args.repeats} interleaved rounds; load average at start {load0:.1f}, at end "
          f"{os.getloadavg()[0]:.1f}; cpu = process CPU time (all threads) per decoded token")  # fmt: skip
    base = (
        "published generate_minimal" if published is not None else "full re-computation (no cache)"
    )
    print(f"speed-up relative to: {base}; 'same' = identical tokens to full re-computation")
    print_table(results, base, results["full re-computation (no cache)"][3])
    report_floors(model, ids, results, 2 * args.repeats)
    kb = rm.KVCache(model.config, 1, PROMPT + NEW, STEPS).memory_bytes
    kb4 = rm.KVCache(model.config, 1, PROMPT + NEW, STEPS, 4).memory_bytes
    print(f"KV cache memory: full {kb / 2**20:.2f} MiB, budget 4: {kb4 / 2**20:.2f} MiB")
    if not args.no_prefill:
        bench_prefill(model, published, 2 * args.repeats)
    if not args.no_bf16:
        bench_dtype(model, ids, args.repeats)
    if args.huginn_shape:
        bench_huginn_shape(args.huginn_shape, args.huginn_compiled, args.repeats)
    if args.ouro_shape:
        bench_ouro_shape(args.ouro_shape, args.ouro_compiled, args.repeats)
    if args.quick:
        return
    if os.path.isdir(args.checkpoint):
        bench_checkpoint(args.checkpoint, args.repeats)
    else:
        print(f"\n(no checkpoint at {args.checkpoint}: speculative / adaptive exit on a trained "
              "model skipped)")  # fmt: skip


if __name__ == "__main__":
    main()
