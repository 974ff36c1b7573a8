"""Spec + target -> plan: every launch decision, one rule a function with the measurement behind it
in its docstring. The generator writes the plan as generated/<model>/model_plan.h (header_constants),
the one interface between it and the hand-written CUDA sources; `codegen --set FIELD=N` (make PLAN=)
sets a decision by hand, `--set generic` takes the generic build's.

The CPU decode step's one decision: how many sequential weight streams each thread walks side by
side in the matvecs. Measured on the 16-core Emerald Rapids slice of the GPU machine
(docs/performance.md, D101; tests/bench/cpu_shapes.sh): Llama-3.2-1B shape 34.5 tok/s with one stream against
31.2 with four; Mistral-7B shape 5.5 against 7.5. Until a model in between tells us where the
crossover really lies, four streams are used from 4 GB of weights per token up.
The GPU plan: the blocks each matvec needs (a warp per row, or per pair of rows); the runtime caps them at one wave of
resident blocks from the occupancy the compiled kernel allows (warps then stride over the rows),
which lets the next kernel's blocks start early under programmatic dependent launch; and the least
number of attention splits, from the target GPU's multiprocessor count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .spec import Spec

CPU_MULTI_STREAM_FROM_BYTES = 4 * 10**9

GPU_SMS = {"90": 132, "89": 128, "80": 108}  # H100/H200 SXM, RTX 4090 / L40, A100
MV_WARPS = 8  # warps per matvec block (runtime/cuda_matvec.cuh)
MV_UNROLL = 8  # 16-byte chunks a lane loads a row step (runtime/cuda_matvec.cuh)
MV_STEP_VALUES = 8 * 32 * MV_UNROLL  # weights a warp's row step covers: MV_UNROLL chunks of 8 per lane


@dataclass(frozen=True)
class Plan:
    cpu_streams: int  # sequential weight streams per thread in the CPU matvecs: 1 or 4
    cuda_arch: str  # "90", ...
    gpu_sms: int
    grid_qkv: int  # blocks of rmsnorm_qkv_rope_kernel (a pair of rows per warp)
    grid_o: int  # o_proj_residual_kernel
    grid_gate_up: int  # rmsnorm_gate_up_silu_kernel (a gate row and an up row per warp)
    grid_down: int  # down_residual_kernel
    grid_lm_head: int  # rmsnorm_lm_head_argmax_kernel
    att_min_splits: int  # attention splits per KV head up to depth ATT_TILE * this (two blocks an SM); more past it
    o_proj_min_blocks: int  # blocks an SM o_proj's registers must allow: 4 when its rows take one step (64 registers,
    # no spill), so that a gate/up block fits beside its two; 2 otherwise (the double-buffered rows need ~126)
    residual_pairs: int  # 1: o_proj and down take their rows in pairs (p, p + dim / 2) a warp (_residual_pairs)
    prefill_att_tokens: int  # prompt tokens a prefill attention block takes beside its group's heads (_prefill_att_tokens)
    prefill_flash: int  # 1: a prefill batch's attention with all its query rows in a block (_prefill_flash)
    att_mma: int  # 1: the decode step's attention on the tensor cores (_att_mma)
    att_stage_values: int  # 1: that attention's first round of values staged with its keys (_att_stage_values)
    att_short: int  # 1: a short context's decode attention in one block a KV head (_att_short)
    att_combine_early: int  # splits' partial sums the combine loads with their (max, sum); 0: after (_att_combine_early)
    att_o_short: int  # 1: a short context's attention and o_proj in one grid (_att_o_short)
    pair_unroll: int  # the paired norm'd matvecs' (QKV, gate/up) 16-byte chunks a lane loads a step (_pair_unroll)
    pair_early: int  # of their first step, the chunks a lane loads before the wait; 0: all of them (_pair_early)
    qkv_async: int  # QKV's row steps after the first copied into shared memory on cp.async (_qkv_async)
    pair_lot: int  # QKV's and gate/up's early loads in lots of this many chunks; 0: one lot (_pair_lot)
    res_lot: int  # o_proj's and down's (launched on their own) the same, of MV_UNROLL chunks (_res_lot)
    down_poll: int  # 1: down polls gate/up's outputs instead of waiting for its grid's end (_down_poll)
    gemm_wgmma: int  # 1: the prefill GEMMs on Hopper's warpgroup MMA, built for sm_90a (_gemm_wgmma)
    mlp_fused: int  # 1: the decode step's gate/up and down run as one kernel (_mlp_fused_fits)
    smem_carveout: int  # every decode kernel's shared-memory carveout, percent; -1: the driver's (_smem_carveout)
    att_trigger_early: int  # decode attention lets o_proj launch before its wait: 1 short kernel, 2 split, 3 both (_att_trigger_early)
    o_proj_trigger_shortest: int  # 1: in the one-split graphs o_proj lets the MLP launch before its wait (_o_proj_trigger_shortest)
    att_o_poll: int  # 1: the joined short grid's o_proj polls attention's outputs, not its count (_att_o_poll)
    # Fixed values that tests set otherwise to reach a path the tiny models would not take (make
    # PLAN="att_min_chunk=5"); each one's measurement is in the kernel header that reads it.
    att_min_chunk: int = 256  # fewest positions a decode attention block takes (D41); 5: many splits
    fmma_min_chunk: int = 1024  # fewest positions a prompt flash-attention split takes (ATT_TILE: D83); 5: many splits
    fmma_tile: int = 64  # positions a prompt flash-attention tile takes (a multiple of 16)
    poll_vec: int = 8  # float4s a polling thread loads at once (poll_each_group); 2: rounds of polls
    prefill_batch: int = 0  # prompt tokens a prefill batch takes at most: 8 to 256; 0: 256 on wgmma, else 64 (D94, D122)
    prefill_gate_up_gemm: int = 1  # gate/up's prompt GEMM: 1 where its tiles fill 3/4 of the SMs, 2 always
    gate_up_tma_wide: int = 1  # gate/up's TMA GEMM at two warpgroups a block: 1 by its rule (D92), 2 always


class CExpr:
    """A C expression over the generated MODEL_* names, built with +, * and // as the plan's
    formulas are (a generic build's plan: the same formulas written as C, evaluated at run time).
    // of positive values is C's /."""

    def __init__(self, text: str):
        self.text = text

    def _op(self, op: str, other, swap: bool = False) -> "CExpr":
        a, b = (other, self) if swap else (self, other)
        return CExpr(f"({a} {op} {b})")

    def __add__(self, o): return self._op("+", o)
    def __radd__(self, o): return self._op("+", o, True)
    def __sub__(self, o): return self._op("-", o)
    def __mul__(self, o): return self._op("*", o)
    def __rmul__(self, o): return self._op("*", o, True)
    def __floordiv__(self, o): return self._op("/", o)
    def __rfloordiv__(self, o): return self._op("/", o, True)
    def __str__(self): return self.text


class _GenericDims:
    """The spec's fields a plan reads, as C expressions: spec.dim is MODEL_DIM, ..."""

    def __getattr__(self, field: str) -> CExpr:
        return CExpr(f"MODEL_{field.upper()}")


def _ceil_div(a, b):
    return (a + b - 1) // b


def _gpu_plan(d, sms: int) -> dict:
    """The GPU plan's formulas over d, a Spec or _GenericDims; every operand is positive."""
    return dict(
        grid_qkv=_ceil_div((d.q_dim + 2 * d.kv_dim) // 2, MV_WARPS),  # a pair of rows per warp
        grid_o=_ceil_div(d.dim, MV_WARPS),
        grid_gate_up=_ceil_div(d.hidden_dim, MV_WARPS),  # a gate row and an up row per warp
        grid_down=_ceil_div(d.dim, MV_WARPS),
        grid_lm_head=_ceil_div(d.vocab_size, MV_WARPS),
        att_min_splits=_ceil_div(2 * sms, d.n_kv_heads),
    )


def _o_proj_min_blocks(q_dim: int) -> int:
    return 4 if q_dim <= MV_STEP_VALUES else 2


def _residual_pairs(dim: int, sms: int, o_proj_min_blocks: int) -> int:
    """Pairs of rows in o_proj and down where their dim rows pass one round of a wave's warps (two
    blocks an SM): a warp then holds both of its rows' loads at once instead of taking a second row
    after the first. Measured on the H200 (docs/performance.md, D18): Mistral-7B (4096 rows,
    2112 warps) +1.0%; Llama-3.2-1B (2048 rows, one round already) -15% with them, most of it o_proj
    spilling at the 64 registers of o_proj_min_blocks 4, which the rule also excludes."""
    return int(dim % 2 == 0 and dim > 2 * sms * MV_WARPS and o_proj_min_blocks == 2)


ATT_MAX_GROUP = 8  # query rows an attention block takes at most (runtime/cuda_attention.cuh)


def _prefill_att_tokens(head_dim: int, kv_mul: int) -> int:
    """A prefill attention block takes this many of the batch's tokens, their queries as rows beside
    the KV group's heads (ATT_MAX_GROUP rows at most), so each key and value is read once for them.
    Measured on the H200 (docs/performance.md, D81), 128-token prompt: Llama-3.2-1B (heads of 64,
    2 tokens) +4.4% at depth 0 and +4.2% at 4096; Mistral-7B (heads of 128) -1.3% / -1.7%, so 1
    token where heads are wider than 64."""
    return 1 if head_dim > 64 else max(1, ATT_MAX_GROUP // kv_mul)


FLASH_HEAD_DIMS = (64, 128)  # head widths prefill_flash_body is written for (runtime/cuda_prefill.cuh)


def _prefill_flash(head_dim: int) -> int:
    """A prefill batch's attention with every query row of a KV head in one block, keys and values
    staged in shared memory a tile at a time and read once for all rows (prefill_flash_body), where
    heads are 64 or 128 wide; other widths keep attention_body's prefill (_prefill_att_tokens).
    Measured on the H200 (docs/performance.md, D82), 128-token prompt against the grouped
    attention_body: Llama-3.2-1B +72% at depth 4096 and +109% at 16384, -2.5% at depth 0 (a short
    context's few blocks); Mistral-7B +20% and +57%, -1% at depth 0."""
    return int(head_dim in FLASH_HEAD_DIMS)


def _generic_prefill_flash() -> CExpr:
    """_prefill_flash as the generic build's C expression over the head width it reads"""
    return CExpr("(" + " || ".join(f"MODEL_HEAD_DIM == {w}" for w in FLASH_HEAD_DIMS) + ")")


MMA_HEAD_DIMS = (64, 128)  # head widths attention_body's tensor-core path is written for


def _att_mma(head_dim: int, kv_mul: int) -> int:
    """The decode step's attention on the tensor cores (attention_body with MMA_HD: fp16 mma with
    fp32 sums, the query and probabilities as two fp16 terms each), where heads are 64 or 128 wide and
    a KV group's query heads fit the mma's 8 columns. The fp32 path spends most of its time at depth
    in shuffles and conversions (ncu; docs/performance.md, D39)."""
    return int(head_dim in MMA_HEAD_DIMS and kv_mul <= ATT_MAX_GROUP)


STAGE_VALUES_MIN_DIM = 2048  # the smallest hidden size staged values were measured to pay on (below)


def _generic_att_mma() -> CExpr:
    """_att_mma as the generic build's C expression over the dimensions it reads"""
    widths = " || ".join(f"MODEL_HEAD_DIM == {w}" for w in MMA_HEAD_DIMS)
    return CExpr(f"(({widths}) && MODEL_KV_MUL <= {ATT_MAX_GROUP})")


def _att_stage_values(head_dim: int, kv_mul: int, dim: int) -> int:
    """The tensor-core decode attention's first round of values copied into shared memory with its
    keys (MODEL_ATT_STAGE_VALUES), where heads are 64 wide and the model is no smaller than the 1B
    shape. Measured on the H200 (docs/performance.md, D43): Llama-3.2-1B +1.3-1.4% to depth
    4096; the SmolLM2 shape (hidden size 576, 3 KV heads of 64) -2.8% at depth 0, its stages ~2 us
    each, where the 32 KB more shared memory a block costs more than the round trip it saves (not
    traced); heads of 128 (Mistral-7B) spill in the joined attention/o_proj grid and lost 0.7-2.3%."""
    return int(_att_mma(head_dim, kv_mul) == 1 and head_dim == 64 and dim >= STAGE_VALUES_MIN_DIM)


def _att_short(head_dim: int, kv_mul: int) -> int:
    """A short context's decode attention (at most one round of tiles a warp: 128 positions on heads
    of 128, 256 on heads of 64) in a kernel of its own, one block a KV head (attention_short_body),
    where the tensor-core attention runs; on heads of 64 in splits of 256 up to ATT_MIN_SPLITS of them.
    Measured on the H200 (docs/performance.md, D55, D56): Llama-3.2-1B +2.2%, Mistral-7B
    +1.1%, the SmolLM2 shape +11.6% at depth 0; the 1B +1.8% at 1024, +0.4% at 4096."""
    return _att_mma(head_dim, kv_mul)


def _att_o_short(att_short: int, o_proj_min_blocks: int) -> int:
    """A short context's steps (those attention_short_body takes) with attention and o_proj in one
    grid (attention_o_proj_kernel), so that o_proj is QKV's programmatic dependent and lands
    with attention instead of after it lets o_proj launch, where o_proj keeps 2 blocks an SM anyway
    (the joined grid's registers: 126 on the 7B). Measured on the H200 (docs/performance.md, D58):
    Mistral-7B +0.6% and +0.5% at depth 0 (two calls); Llama-3.2-1B -2.3%
    (its o_proj loses 4 blocks an SM). Llama-3.1-8B and Qwen2.5-7B by the same rule, not measured."""
    return int(att_short == 1 and o_proj_min_blocks == 2)


ATT_THREADS = 256  # an attention block's threads (runtime/cuda_attention.cuh)
COMBINE_EARLY_MAX = 64  # the most partial sums a combining thread holds in registers (SmolLM2 shape: 88 took 125)


def _att_combine_early(head_dim: int, kv_mul: int, att_min_splits: int) -> int:
    """The splits' partial sums that the combine's plain form (a KV group's heads times the head
    width within ATT_THREADS: one output a thread) loads before the splits' (max, sum), both in flight
    at once, one L2 round trip fewer on the chain: the first ATT_MIN_SPLITS (a short context's splits,
    all of them up to ATT_MIN_SPLITS tiles), at most COMBINE_EARLY_MAX; 0 where the combine takes its
    float4 form. Measured on the H200 (docs/performance.md, D57), Llama-3.2-1B with 33:
    +1.1% at depth 4096, +1.6% at 16384, even at 0 and 1024."""
    return min(att_min_splits, COMBINE_EARLY_MAX) if kv_mul * head_dim <= ATT_THREADS else 0


PAIR_UNROLL_SHORT_MAX_DIM = 2048  # the largest hidden size measured to gain from 4 chunks a step (below)


def _pair_unroll(dim: int) -> int:
    """Chunks of 16 bytes a lane of the paired kernels (QKV, gate/up: two rows a warp) loads a step:
    4 up to a hidden size of 2048, 8 past it (MV_UNROLL elsewhere). Measured on the H200
    (docs/performance.md, D45): Llama-3.2-1B +4.5% at depth 0 and +3.2% at 4096 with 4
    (the 1B trace: gate/up's wait returns 1.2 us and its input lands 1.8 us sooner, with half the
    bytes in flight when o_proj ends); Mistral-7B -0.9% (its rows of 4096
    take 4 steps); the SmolLM2 shape even (its rows of 576 take one step either way)."""
    return 4 if dim <= PAIR_UNROLL_SHORT_MAX_DIM else 8


def _pair_early(dim: int) -> int:
    """Where the paired kernels keep 8 chunks a step, half of the first step's loads go out before
    the wait and half after it, behind the input's: Mistral-7B +0.3% (both depths, two rounds);
    a quarter lost 0.5% (docs/performance.md, D46). 0 (all before the wait) where the step is 4
    chunks: on the 1B, half of 8 gained 1.6% where 4 a step gained 4.5%."""
    return 4 if _pair_unroll(dim) == 8 else 0


def _pair_lot(dim: int) -> int:
    """The paired kernels' early loads (before the programmatic-dependent-launch wait) in two lots,
    the second issued once the first is in, where a lane's row fills them (rows of dim / 256 chunks
    of 16 bytes a lane); 0 (one lot) where it does not. Bytes in flight at a kernel boundary delay
    the previous kernel's completion and this one's input behind them; a lot at a time keeps memory
    busy without that queue, but where a row's first step is short there is little to pace and the
    wait for the first lot is a round trip more. Measured on the H200 (docs/performance.md, D53):
    with _res_lot's lots, Mistral-7B +1.1% / +1.5% at depths 0 / 4096, Llama-3.2-1B
    +1.6-1.8% / +2.5% (lots of one chunk lost), the SmolLM2 shape (rows of 2.25 chunks a lane)
    -2.4% / -4.9% with this alone and -5% with both."""
    early = _pair_early(dim) or _pair_unroll(dim)
    return early // 2 if dim // 256 >= early else 0


def _res_lot(q_dim: int, hidden_dim: int) -> int:
    """o_proj's and down's early loads, launched on their own, in four lots of MV_UNROLL's 8 chunks
    where both kernels' rows (q_dim and hidden_dim wide) fill a step of them; 0 (one lot) where they
    do not (as _pair_lot; o_proj in the generic build's joined attention/o_proj grid paces its own,
    MV_RES_PACE)."""
    return MV_UNROLL // 4 if min(q_dim, hidden_dim) // 256 >= MV_UNROLL else 0


DOWN_POLL_MIN_HIDDEN = 8192  # the smallest intermediate size down's polling was measured on (below)


def _down_poll(hidden_dim: int) -> int:
    """Down's blocks stage gate/up's outputs polling them (words that read "unwritten" until gate/up
    writes them; MODEL_DOWN_POLL in forward_cuda.cu) instead of waiting for gate/up's grid to end, where
    the intermediate size is at least that of the shapes it was measured on. Measured on the H200
    (docs/performance.md, D61): Llama-3.2-1B (8192) +0.3% / +0.9%, +0.5% / +1.0%,
    +0.6% / +1.0% at depths 0 / 1024 in three calls, +0.5-0.8% at 0 to 32768 in a fourth;
    Mistral-7B (14336) -0.1% / +0.0% at 0 / 16384. Not measured on the SmolLM2 shape (1536) nor in
    the generic build, which keep the wait."""
    return int(hidden_dim >= DOWN_POLL_MIN_HIDDEN)


def _qkv_async(spec: Spec, sms: int) -> int:
    """1 (QKV's second step of a pair copied into shared memory on cp.async when the input is staged,
    so both steps are in flight at once) where QKV's pairs take one round of a wave's warps (two
    blocks of 8 an SM, the paired kernels' registers) and a row more than one step; else 0.
    Measured on the H200 (docs/performance.md, D50): Llama-3.2-1B (1,536 pairs, rows of
    two steps) +0.9% at depth 0, +0.2% at 4096; Mistral-7B (3,072 pairs, 1.45 rounds) -0.2% /
    -0.4%; in gate/up (many rounds) -0.7% to -1.8% on both. Dense q/k/v only: the copies take a
    row's 16-byte chunks as they lie, and a block format's scales lie apart."""
    pairs = (spec.q_dim + 2 * spec.kv_dim) // 2
    steps = -(-spec.dim // (8 * _pair_unroll(spec.dim) * 32))
    return int(pairs <= 16 * sms and steps > 1 and spec.formats["wq"] == spec.dtype)


def _gemm_wgmma(cuda_arch: str) -> int:
    """The prefill GEMMs (runtime/cuda_prefill.cuh, prefill_gemm_body) on wgmma where the target has
    it: Hopper, which the Makefile builds as sm_90a for it. Against mma.sync at batches of 64
    (H200; docs/performance.md, D89): prompt 1B +17%, 7B +24%, SmolLM2 +4%."""
    return 1 if cuda_arch == "90" else 0


def _mlp_fused_fits(dim: int, hidden_dim: int, cuda_arch: str, quantized: bool = False) -> int:
    """Whether the decode step's MLP runs as one kernel (runtime/cuda_mlp_fused.cuh, mlp_fused_body:
    gate/up and down's transpose in batches of hidden units a block, the blocks' partial sums added
    in L2), the build's default where it fits (the plan's mlp_fused=0, make PLAN="mlp_fused=0", keeps
    gate/up and down): a hidden size
    of 2048 (a unit's rows to a warp, 8 chunks a lane, 16 units a batch, 4 output columns a lane) or
    4096 (to two warps, 8 units a batch, 8 columns a lane), an intermediate size of whole 32-value
    tiles (the transpose), and sm_90 (bulk copies on mbarriers). Measured on the H200
    (docs/performance.md, D64, D65): alone, 16 chained Llama-3.2-1B-shaped
    MLPs 24.2 us a layer against 26.6 for two kernels (tests/bench/fused_mlp.cu); in the 1B's step,
    with its input by a bulk copy and every decode kernel's carveout alike, +0.2% at depth 0 and
    +1.9% at 4096. Its sums' order is not fixed: a build with it is not reproducible to the last
    bit. Dense matrices only: a quantized model (any matrix in a block format) runs gate/up and
    down apart (runtime/forward_cuda.cu)."""
    return int(cuda_arch == "90" and dim in (2048, 4096) and hidden_dim % 32 == 0 and not quantized)


def _smem_carveout(mlp_fused: int) -> int:
    """Every decode kernel's preferred split of the SM's L1 and shared memory, set alike, in percent
    of the most to shared memory (-1: the driver's choice a kernel): 72 (164 KB of 228) with the
    fused MLP, whose 145-160 KB blocks otherwise meet SMs split for their neighbours and land only
    once those leave. Measured on the H200 (docs/performance.md, D35, D65), Llama-3.2-1B: the fused
    build +0.6% with it, the split
    build -0.1%; 100 (the most) cost the fused build 2.9%, its neighbours' L1 taken."""
    return 72 if mlp_fused else -1


def _att_trigger_early(mlp_fused: int) -> int:
    """The decode attention lets o_proj launch as its blocks start, before their wait (1: the short
    context's kernel; 0: after the wait), where the MLP is fused: the fused MLP's block an SM lands
    only as o_proj's blocks leave, so o_proj's end is its start. Measured on the H200, Llama-3.2-1B:
    +1.2-1.3% at depth 0, even at 4096; without the fused MLP -0.2% / -0.0% / -0.1% at 0 / 1024 /
    16384 (gate/up, which fits beside o_proj, lands no sooner)."""
    return 1 if mlp_fused else 0


def _o_proj_trigger_shortest(mlp_fused: int) -> int:
    """In the one-split graphs (steps that read at most 256 positions), o_proj lets the fused MLP
    launch once its blocks have issued their early loads, before their wait. Llama-3.2-1B: +1.1% at
    depth 0 on the H200, +1.5% on an H100, even at 4096. In every step it lost at depth (-1.4% to
    -3.5% at 4096), with or without the MLP holding its first loads on a flag."""
    return 1 if mlp_fused else 0


def _att_o_poll(att_o_short: int) -> int:
    """In the joined short grid, o_proj's blocks poll attention's outputs themselves (words that
    read "unwritten" until stored) instead of waiting for a count: the count costs attention a fence
    and an atomic and o_proj a poll's round trip. Mistral-7B +0.4% at depth 0 on the H200 (o_proj's
    first block past its wait 1.09 us after attention's last, against 1.65)."""
    return att_o_short


PLAN_FIELDS_DERIVED = ("smem_carveout", "att_trigger_early", "o_proj_trigger_shortest", "att_o_poll")


def _derive(fields: dict) -> dict:
    """The decisions that follow from others (mlp_fused, att_o_short), unless already set."""
    derived = dict(smem_carveout=_smem_carveout(fields["mlp_fused"]),
                   att_trigger_early=_att_trigger_early(fields["mlp_fused"]),
                   o_proj_trigger_shortest=_o_proj_trigger_shortest(fields["mlp_fused"]),
                   att_o_poll=_att_o_poll(fields["att_o_short"]))
    return {**derived, **fields}


class PlanError(ValueError):
    """A plan setting that names no decision, or one the model or target cannot take."""


def generic_plan_sets(cuda_arch: str = "90") -> dict:
    """The generic build's decisions as settings for a specialized build ({field: value}): the same
    algorithm with the dimensions as literals, so that comparing the two measures the constants
    alone (make compare). The grids and split counts are the same formulas in both and stay."""
    plan = make_generic_plan(cuda_arch)
    return {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)
            if f.name not in ("cuda_arch", "gpu_sms") and isinstance(getattr(plan, f.name), int)}


def parse_sets(items: list[str], cuda_arch: str = "90") -> dict:
    """`--set field=value` items (value a whole number) into {field: value}, the word `generic`
    standing for every decision as the generic build takes it (generic_plan_sets; a later item
    overrides it); PlanError names a bad one."""
    names = {f.name for f in dataclasses.fields(Plan)} - {"cuda_arch", "gpu_sms"}
    sets = {}
    for item in items:
        if item == "generic":
            sets.update(generic_plan_sets(cuda_arch))
            continue
        field, eq, value = item.partition("=")
        if not eq or field not in names:
            raise PlanError(f"--set {item}: expected generic or FIELD=N with FIELD one of {', '.join(sorted(names))}")
        try:
            sets[field] = int(value)
        except ValueError:
            raise PlanError(f"--set {item}: {value!r} is not a whole number") from None
    return sets


def _apply_sets(plan: Plan, spec: Spec, sets: dict) -> Plan:
    """The plan with some decisions set by hand (a test or a measurement builds the other path of a
    decision on the same model); the decisions that follow from them are derived again unless set
    too. A setting the model or target cannot take is refused here, naming it, rather than by the
    CUDA compiler."""
    if not sets:
        return plan
    fields = dataclasses.asdict(plan)
    base = {k: v for k, v in fields.items() if k not in PLAN_FIELDS_DERIVED}
    base.update(sets)
    fields = _derive({**base, **{k: v for k, v in sets.items() if k in PLAN_FIELDS_DERIVED}})
    if fields["mlp_fused"] and not _mlp_fused_fits(spec.dim, spec.hidden_dim, plan.cuda_arch, spec.quantized):
        raise PlanError(f"--set mlp_fused=1: this model's shape or target does not fit the fused MLP (_mlp_fused_fits)")
    if (fields["att_short"] or fields["att_stage_values"]) and not fields["att_mma"]:
        raise PlanError("--set att_short / att_stage_values: they run on the tensor-core attention (att_mma=1)")
    if fields["att_o_short"] and not fields["att_short"]:
        raise PlanError("--set att_o_short=1: the short context's kernel (att_short=1)")
    if fields["prefill_batch"] > 64 and not fields["gemm_wgmma"]:
        raise PlanError(f"--set prefill_batch={fields['prefill_batch']}: batches over 64 are built and tested"
                        " on the wgmma GEMMs only (gemm_wgmma=1); mma.sync takes 8 to 64")
    for name, ok, what in (("att_min_chunk", 1 <= fields["att_min_chunk"] <= 1024, "1 to 1024 (ATT_TILE)"),
                           ("fmma_min_chunk", 1 <= fields["fmma_min_chunk"] <= 1024, "1 to 1024 (ATT_TILE)"),
                           ("fmma_tile", fields["fmma_tile"] in (16, 32, 64, 128), "16, 32, 64 or 128"),
                           ("poll_vec", 1 <= fields["poll_vec"] <= 8, "1 to 8"),
                           ("prefill_batch", fields["prefill_batch"] in (0, 8, 16, 32, 64, 128, 256), "8, 16, 32, 64, 128 or 256 (0: the rule)"),
                           ("prefill_gate_up_gemm", fields["prefill_gate_up_gemm"] in (1, 2), "1 (the rule) or 2 (always)"),
                           ("gate_up_tma_wide", fields["gate_up_tma_wide"] in (1, 2), "1 (the rule) or 2 (always)")):
        if not ok:
            raise PlanError(f"--set {name}={fields[name]}: expected {what}")
    return Plan(**fields)


def make_plan(spec: Spec, cuda_arch: str = "90", sets: dict | None = None) -> Plan:
    """The plan for spec on cuda_arch; sets: decisions set by hand (parse_sets)."""
    return _apply_sets(_make_plan(spec, cuda_arch), spec, sets or {})


def _make_plan(spec: Spec, cuda_arch: str) -> Plan:
    sms = GPU_SMS.get(cuda_arch, 132)
    gpu = _gpu_plan(spec, sms)
    return Plan(
        cpu_streams=4 if spec.weight_bytes >= CPU_MULTI_STREAM_FROM_BYTES else 1,
        cuda_arch=cuda_arch,
        gpu_sms=sms,
        o_proj_min_blocks=_o_proj_min_blocks(spec.q_dim),
        residual_pairs=_residual_pairs(spec.dim, sms, _o_proj_min_blocks(spec.q_dim)),
        prefill_att_tokens=_prefill_att_tokens(spec.head_dim, spec.kv_mul),
        prefill_flash=_prefill_flash(spec.head_dim),
        att_mma=_att_mma(spec.head_dim, spec.kv_mul),
        att_stage_values=_att_stage_values(spec.head_dim, spec.kv_mul, spec.dim),
        att_short=_att_short(spec.head_dim, spec.kv_mul),
        att_combine_early=_att_combine_early(spec.head_dim, spec.kv_mul, gpu["att_min_splits"]),
        pair_unroll=_pair_unroll(spec.dim),
        pair_early=_pair_early(spec.dim),
        qkv_async=_qkv_async(spec, sms),
        pair_lot=_pair_lot(spec.dim),
        res_lot=_res_lot(spec.q_dim, spec.hidden_dim),
        down_poll=_down_poll(spec.hidden_dim),
        gemm_wgmma=_gemm_wgmma(cuda_arch),
        **_derive(dict(mlp_fused=_mlp_fused_fits(spec.dim, spec.hidden_dim, cuda_arch, spec.quantized),
                       att_o_short=_att_o_short(_att_short(spec.head_dim, spec.kv_mul), _o_proj_min_blocks(spec.q_dim)))),
        **gpu,
    )


def make_generic_plan(cuda_arch: str = "90") -> Plan:
    """The same plan for a generic build, whose dimensions are known only at run time: each value
    the C expression of make_plan's formula over the generated MODEL_* names."""
    sms = GPU_SMS.get(cuda_arch, 132)
    return Plan(
        cpu_streams=f"(MODEL_WEIGHT_BYTES_PER_TOKEN >= {CPU_MULTI_STREAM_FROM_BYTES}ULL ? 4 : 1)",
        cuda_arch=cuda_arch,
        gpu_sms=sms,
        o_proj_min_blocks=2,  # a launch bound is a literal; the generic build keeps the double-buffered rows
        residual_pairs=0,  # one row a warp: a run-time choice would hold both paths' registers
        prefill_att_tokens=1,  # a template argument is a literal; the group size is known only at run time
        # prefill_flash_kernel for both head widths, one picked at start (cuda_step_kernels.cuh: prefill_flash)
        prefill_flash=_generic_prefill_flash(),
        # the kernels for every head width the tensor cores take, one picked at start
        # (forward_cuda.cu: decode_attention_kernel, short_attention_kernel)
        att_mma=_generic_att_mma(),
        att_stage_values=0,  # its shared memory and the values' stage are sized at build time
        att_short=_generic_att_mma(),
        att_combine_early=0,  # a register array's size is a literal
        pair_unroll=8,  # a register array's size is a literal
        pair_early=0,
        qkv_async=0,  # its shared memory is sized from the dimensions at build time
        pair_lot=0,  # a lot is a template argument; the rows' widths are known only at run time
        res_lot=0,
        down_poll=0,  # not measured
        gemm_wgmma=_gemm_wgmma(cuda_arch),
        **_derive(dict(mlp_fused=0,  # its shapes are template arguments
                       att_o_short=0)),  # the joined grid's roles are compiled in or out
        **{k: str(v) for k, v in _gpu_plan(_GenericDims(), sms).items()},
    )


def header_constants(plan: Plan, head_dim) -> list[tuple[str, object, str]]:
    """model_plan.h's entries, (MODEL_ name, value, the rule that chose it), in the order the header
    lists them: every decision the CUDA sources take from the generator, and the constants the
    plan's formulas and the kernels share. head_dim: the spec's (a number or, in a generic build,
    its C expression). A value of 0 that means "the whole" in the Plan (pair_early, pair_lot,
    res_lot) is written out as the count it stands for, so the kernels read no special case."""
    pair_early = plan.pair_early or plan.pair_unroll
    return [
        ("CPU_STREAMS", plan.cpu_streams, "sequential weight streams a CPU thread walks side by side: 4 from 4 GB of weights a token, else 1"),
        ("CUDA_ARCH", plan.cuda_arch, "the GPU target, compute capability x 10; an older GPU is refused at start"),
        ("MV_WARPS", MV_WARPS, "warps of a matvec block"),
        ("MV_UNROLL", MV_UNROLL, "16-byte chunks a lane holds in flight a row step in the unpaired matvecs (8 beat 16 and 4)"),
        ("ATT_THREADS", ATT_THREADS, "threads of a decode attention block"),
        ("ATT_MAX_GROUP", ATT_MAX_GROUP, "query rows an attention block takes at most (the mma's 8 columns)"),
        ("GRID_QKV", plan.grid_qkv, "blocks of QKV: a pair of rows a warp, ceil((q_dim + 2 kv_dim) / 2 / MV_WARPS)"),
        ("GRID_O", plan.grid_o, "blocks of o_proj: a row a warp, ceil(dim / MV_WARPS)"),
        ("GRID_GATE_UP", plan.grid_gate_up, "blocks of gate/up: a gate row and an up row a warp, ceil(hidden_dim / MV_WARPS)"),
        ("GRID_DOWN", plan.grid_down, "blocks of down: ceil(dim / MV_WARPS)"),
        ("GRID_LM_HEAD", plan.grid_lm_head, "blocks of the LM head: ceil(vocab_size / MV_WARPS)"),
        ("ATT_MIN_SPLITS", plan.att_min_splits, "attention splits a KV head up to depth ATT_TILE x this: two blocks an SM, ceil(2 SMs / n_kv_heads)"),
        ("O_PROJ_MIN_BLOCKS", plan.o_proj_min_blocks, "o_proj's blocks an SM: 4 where its rows take one step (q_dim <= 2048), else 2 (_o_proj_min_blocks)"),
        ("RESIDUAL_PAIRS", plan.residual_pairs, "o_proj and down a pair of rows a warp where their rows pass one wave (_residual_pairs)"),
        ("PAIR_UNROLL", plan.pair_unroll, "QKV's and gate/up's chunks a lane loads a step: 4 up to a hidden size of 2048, else 8 (_pair_unroll)"),
        ("PAIR_EARLY", pair_early, "of their first step, the chunks loaded before the wait: half where a step is 8 (_pair_early)"),
        ("PAIR_LOT", plan.pair_lot or pair_early, "those early loads in lots of this many chunks, each once the last is in (_pair_lot)"),
        ("RES_LOT", plan.res_lot or MV_UNROLL, "o_proj's and down's early loads in lots of this many chunks (_res_lot)"),
        ("QKV_ASYNC", plan.qkv_async, "QKV's row steps after the first copied to shared memory on cp.async where its pairs take one round (_qkv_async)"),
        ("ATT_MMA_HD", f"({plan.att_mma} ? {head_dim} : 0)" if isinstance(plan.att_mma, CExpr) else head_dim if plan.att_mma else 0, "the decode attention on the tensor cores: the head width (64 or 128), 0 for fp32 (_att_mma)"),
        ("ATT_STAGE_VALUES", plan.att_stage_values, "that attention's first round of values staged with its keys: heads of 64 from the 1B shape (_att_stage_values)"),
        ("ATT_SHORT", plan.att_short, "a short context's attention in a kernel of its own, one block a (KV head, split) (_att_short)"),
        ("ATT_COMBINE_EARLY", plan.att_combine_early, "the combine's partial sums loaded with the splits' (max, sum): this many splits (_att_combine_early)"),
        ("ATT_O_SHORT", plan.att_o_short, "a short context's attention and o_proj in one grid where o_proj keeps 2 blocks an SM (_att_o_short)"),
        ("ATT_O_POLL", plan.att_o_poll, "in that grid o_proj polls attention's outputs instead of a count (_att_o_poll)"),
        ("ATT_TRIGGER_EARLY", plan.att_trigger_early, "the short attention lets o_proj launch before its wait: with the fused MLP (_att_trigger_early)"),
        ("DOWN_POLL", plan.down_poll, "down polls gate/up's outputs instead of waiting for its grid: intermediate sizes from 8192 (_down_poll)"),
        ("MLP_FUSED", plan.mlp_fused, "gate/up, SiLU and down in one kernel: hidden sizes of 2048 and 4096 on sm_90 (_mlp_fused_fits)"),
        ("SMEM_CARVEOUT", plan.smem_carveout, "every decode kernel's shared-memory carveout, percent; -1 the driver's: 72 with the fused MLP (_smem_carveout)"),
        ("O_PROJ_TRIGGER_SHORTEST", plan.o_proj_trigger_shortest, "in the one-split graphs o_proj lets the fused MLP launch before its wait (_o_proj_trigger_shortest)"),
        ("PREFILL_ATT_TOKENS", plan.prefill_att_tokens, "prompt tokens a prefill attention block takes beside its group's heads: 1 on heads over 64 (_prefill_att_tokens)"),
        ("PREFILL_FLASH", plan.prefill_flash, "the prompt's attention as flash attention, all query rows of a KV head in a block: heads of 64 and 128 (_prefill_flash)"),
        ("GEMM_WGMMA", plan.gemm_wgmma, "the prompt's GEMMs on Hopper's warpgroup MMA (sm_90a), else mma.sync (_gemm_wgmma)"),
        ("ATT_MIN_CHUNK", plan.att_min_chunk, "fewest positions a decode attention block takes (D41; tests: 5)"),
        ("FMMA_MIN_CHUNK", plan.fmma_min_chunk, "fewest positions a prompt flash-attention split takes (D83; tests: 5)"),
        ("FMMA_TILE", plan.fmma_tile, "positions a prompt flash-attention tile takes"),
        ("POLL_VEC", plan.poll_vec, "float4s a polling thread loads at once (tests: 2)"),
        ("PREFILL_BATCH", plan.prefill_batch or (256 if plan.gemm_wgmma else 64),
         "prompt tokens a prefill batch takes at most: 256 on wgmma, else 64 (D94, D122)"),
        ("PREFILL_GATE_UP_GEMM", plan.prefill_gate_up_gemm, "gate/up's prompt GEMM: 1 where its tiles fill 3/4 of the SMs, 2 always (tests)"),
        ("GATE_UP_TMA_WIDE", plan.gate_up_tma_wide, "gate/up's TMA GEMM at two warpgroups a block: 1 by its rule (D92), 2 always (tests)"),
    ]
