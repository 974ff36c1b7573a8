"""Spec + target -> plan: the choices that depend on the machine rather than on the model alone.

For now the CPU decode step's one knob: how many sequential weight streams each thread walks side by
side in the matvecs. Measured on the 16-core Emerald Rapids slice of the GPU machine
(PERFORMANCE.md, tests/bench/cpu_shapes.sh): Llama-3.2-1B shape 34.5 tok/s with one stream against
31.2 with four; Mistral-7B shape 5.5 against 7.5. Until a model in between tells us where the
crossover really lies, four streams are used from 4 GB of weights per token up.
The GPU plan: the blocks each matvec needs (a warp per row, or per pair of rows); the runtime caps them at one wave of
resident blocks from the occupancy the compiled kernel allows (warps then stride over the rows),
which lets the next kernel's blocks start early under programmatic dependent launch; and the least
number of attention splits, from the target GPU's multiprocessor count.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import Spec

CPU_MULTI_STREAM_FROM_BYTES = 4 * 10**9

GPU_SMS = {"90": 132, "89": 128, "80": 108}  # H100/H200 SXM, RTX 4090 / L40, A100
MV_WARPS = 8  # warps per matvec block (runtime/cuda_kernels.cuh)


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
    att_min_splits: int  # attention splits per KV head, at least; more for long contexts


def _grid(warps_needed: int, sms: int) -> int:
    return max(1, -(-warps_needed // MV_WARPS))


def make_plan(spec: Spec, cuda_arch: str = "90") -> Plan:
    sms = GPU_SMS.get(cuda_arch, 132)
    return Plan(
        cpu_streams=4 if spec.weight_bytes >= CPU_MULTI_STREAM_FROM_BYTES else 1,
        cuda_arch=cuda_arch,
        gpu_sms=sms,
        grid_qkv=_grid((spec.q_dim + 2 * spec.kv_dim) // 2, sms),
        grid_o=_grid(spec.dim, sms),
        grid_gate_up=_grid(spec.hidden_dim, sms),
        grid_down=_grid(spec.dim, sms),
        grid_lm_head=_grid(spec.vocab_size, sms),
        att_min_splits=max(1, -(-2 * sms // spec.n_kv_heads)),
    )


def make_generic_plan(cuda_arch: str = "90") -> Plan:
    """The same choices for a generic build, whose dimensions are known only at run time: each field
    the C expression of make_plan's formula over the generated MODEL_* names."""
    sms = GPU_SMS.get(cuda_arch, 132)

    def grid(warps: str) -> str:  # _grid; warps >= 1, so at least one block
        return f"(({warps} + MV_WARPS - 1) / MV_WARPS)"

    return Plan(
        cpu_streams=f"(MODEL_WEIGHT_BYTES_PER_TOKEN >= {CPU_MULTI_STREAM_FROM_BYTES}ULL ? 4 : 1)",
        cuda_arch=cuda_arch,
        gpu_sms=sms,
        grid_qkv=grid("MODEL_Q_DIM + 2 * MODEL_KV_DIM"),
        grid_o=grid("MODEL_DIM"),
        grid_gate_up=grid("2 * MODEL_HIDDEN_DIM"),
        grid_down=grid("MODEL_DIM"),
        grid_lm_head=grid("MODEL_VOCAB_SIZE"),
        att_min_splits=f"((2 * {sms} + MODEL_N_KV_HEADS - 1) / MODEL_N_KV_HEADS)",
    )
