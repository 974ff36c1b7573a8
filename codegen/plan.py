"""Spec + target -> plan: the choices that depend on the machine rather than on the model alone.

For now the CPU decode step's one knob: how many sequential weight streams each thread walks side by
side in the matvecs. Measured on the 16-core Emerald Rapids slice of the GPU machine
(PERFORMANCE.md, tests/bench/cpu_shapes.sh): Llama-3.2-1B shape 34.5 tok/s with one stream against
31.2 with four; Mistral-7B shape 5.5 against 7.5. Until a model in between tells us where the
crossover really lies, four streams are used from 4 GB of weights per token up.
The GPU plan (launch shapes, split counts, SM count) joins this when the CUDA backend lands.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import Spec

CPU_MULTI_STREAM_FROM_BYTES = 4 * 10**9


@dataclass(frozen=True)
class Plan:
    cpu_streams: int  # sequential weight streams per thread in the CPU matvecs: 1 or 4


def make_plan(spec: Spec) -> Plan:
    return Plan(cpu_streams=4 if spec.weight_bytes >= CPU_MULTI_STREAM_FROM_BYTES else 1)
