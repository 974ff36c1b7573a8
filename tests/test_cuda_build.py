"""The CUDA sources compile wherever nvcc is, GPU or not (CI has no GPU): the default model's
binary and the generic one link the CUDA backend, and the generated kernels of every tiny variant,
and the generic build's for each weight dtype, compile for each supported target (sm_90, the
default, built as sm_90a for the prefill's wgmma; sm_80 and sm_89 at least compile)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, build_generic, split_flags

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not installed: the CUDA backend is not built here")


def gencode(arch: str) -> str:
    """nvcc's target for a --cuda-arch, as the Makefile builds it: 90 as sm_90a (the plan's wgmma)"""
    sm = "90a" if arch == "90" else arch
    return f"-gencode=arch=compute_{sm},code=sm_{sm}"


def test_default_binary_has_cuda(default_binary):
    assert (default_binary.parent / "forward_cuda.o").exists()
    r = subprocess.run([str(default_binary), "--help"], capture_output=True, text=True)
    assert "--bench-kernels" in r.stdout


def test_generic_binary_has_cuda_for_each_dtype():
    binary = build_generic()
    assert sorted(p.name for p in binary.parent.glob("forward_cuda_*.o")) == [
        "forward_cuda_bf16.o", "forward_cuda_f16.o", "forward_cuda_f32.o"]


def test_fp32_model_cuda_compiles_to_a_refusal(tmp_path):
    """fp32 weights have no GPU kernels: the generated file must still compile, to an init that
    refuses with a message."""
    import json

    cfg = json.loads((REPO / "tests" / "models" / "tiny-gqa" / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    model = tmp_path / "tiny-f32"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    gen = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "codegen", str(model), "--out", str(gen)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([NVCC, "-std=c++17", gencode("90"), "-Iruntime", f"-I{gen}", "-Werror",
                        "all-warnings", "-c", "runtime/forward_cuda.cu", "-o", str(tmp_path / "f.o")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fp32 weights are not supported on the GPU" in (REPO / "runtime" / "forward_cuda.cu").read_text()


@pytest.mark.parametrize("arch", ["80", "89", "90"])
@pytest.mark.parametrize("variant", ["tiny-gqa", "tiny-qwen2", "tiny-llama3"])
def test_generated_cuda_compiles(tmp_path, variant, arch):
    _compile_generated(tmp_path, variant, arch)


def test_quantized_cuda_compiles_for_sm80_and_sm89(tmp_path):
    """The block formats' kernels where the prompt's GEMMs run on mma.sync (their tiles dequantized by
    the threads, gemm_q_tiles) and the K formats' mixed rows (w_kany): tiny-q4_k_m for sm_80 and
    sm_89; its sm_90a build is every quantized test's."""
    _compile_generated(tmp_path, "tiny-q4_k_m", "80", extra_archs=("89",))


@pytest.mark.parametrize("variant", ["tiny-group3", "tiny-wide"])
def test_tensor_core_attention_compiles_for_sm80_and_sm89(tmp_path, variant):
    """Heads of 64 and 128 take the tensor-core decode attention and the flash prefill
    (codegen/plan.py), which the other tiny variants' heads of 16 do not: sm_80 and sm_89 too."""
    _compile_generated(tmp_path, variant, "80", extra_archs=("89",))


# A compile-only build costs about a minute on CI's two cores (each compiles every attention kernel
# for both KV cache types), so the builds below set several independent plan decisions at once:
# each decision still compiles in some build, in fewer builds.
@pytest.mark.parametrize("variant", ["tiny-group3", "tiny-wide"])
@pytest.mark.parametrize("flags", ["att_short=0 att_combine_early=0 down_poll=1", "att_o_short=1 att_o_poll=0 -DINGOT_TRACE"])
def test_attention_variant_builds_compile(tmp_path, variant, flags):
    """The tensor-core attention with the plan's other paths: without the short context's kernel,
    with the combine's partial sums loaded after the splits' (max, sum) and down polling gate/up's
    outputs; and the short context's attention joined with o_proj in one grid (o_proj waiting on
    its count), traced."""
    _compile_generated(tmp_path, variant, "90", flags=tuple(flags.split()))


@pytest.mark.parametrize("arch,flags", [("90", ""), ("90", "-DINGOT_TRACE smem_carveout=-1 att_trigger_early=3 o_proj_trigger_shortest=0"),
                                        ("90", "mlp_fused=0 smem_carveout=72"), ("90", "att_o_short=1"), ("80", "")])
def test_fused_mlp_builds_compile(tmp_path, arch, flags):
    """The fused decode MLP is tiny-d2048's default on sm_90 (codegen/plan.py, _mlp_fused_fits):
    that build; traced, with the driver's carveouts, every attention kernel letting o_proj launch
    as it starts and o_proj letting the MLP launch only after its wait; the split build with every
    decode kernel's carveout set alike; after the joined attention/o_proj grid; sm_80 builds the
    model without it."""
    _compile_generated(tmp_path, "tiny-d2048", arch, flags=tuple(flags.split()))


@pytest.mark.parametrize("flags", ["", "-DINGOT_TRACE smem_carveout=-1", "mlp_fused=0"])
def test_fused_mlp_at_4096_builds_compile(tmp_path, flags):
    """tiny-d4096, the hidden size of the 7B and 8B shapes, where a hidden unit's rows take two warps
    (mlp_fused_body's MLP_ROW_WARPS): the fused default; traced with the driver's carveouts; the split
    build."""
    _compile_generated(tmp_path, "tiny-d4096", "90", flags=tuple(flags.split()))


def test_fused_mlp_refused_where_it_does_not_fit(tmp_path):
    """mlp_fused=1 set on a model or target that does not fit it (tiny-d2048 for sm_80) stops the
    generator with the reason, rather than building something else."""
    with pytest.raises(AssertionError, match="does not fit the fused MLP"):
        _compile_generated(tmp_path, "tiny-d2048", "80", flags=("mlp_fused=1",))


def _compile_generated(tmp_path, variant, arch, extra_archs=(), flags=()):
    """runtime/forward_cuda.cu against a tiny variant's generated headers; flags as split_flags
    reads them: plan settings go to the generator, the rest to nvcc."""
    sets, nvcc = split_flags(" ".join(flags))
    gen = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "codegen", f"tests/models/{variant}", "--out", str(gen), "--cuda-arch", arch,
                        *(a for kv in sets for a in ("--set", kv))], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    gencodes = [gencode(a) for a in (arch, *extra_archs)]
    r = subprocess.run([NVCC, "-O1", "-std=c++17", *gencodes, "--threads", "2", "-Iruntime", f"-I{gen}",
                        "-Werror", "all-warnings", *nvcc, "-c", "runtime/forward_cuda.cu", "-o", str(tmp_path / "f.o")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    # ptxas's note that it serialized a kernel's wgmmas (an accumulator read while one runs): not an
    # error to nvcc, but every wgmma of that kernel then waits for the one before (D129)
    assert "C7514" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("source", ["read_patterns.cu", "stream_chain.cu", "timer_resolution.cu", "fused_mlp.cu"])
def test_bench_programs_compile(tmp_path, source):
    """The GPU machine's measuring programs under tests/bench/ (built there by hand) build here too."""
    r = subprocess.run([NVCC, "-O1", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-Werror", "all-warnings",
                        f"tests/bench/{source}", "-o", str(tmp_path / "a.out")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_gpu_sampler_test_compiles():
    """tests/cuda_sampler_test.cu (run by test_gpu.py on a GPU) builds here too."""
    r = subprocess.run(["make", "-s", "build/tests/cuda_sampler_test"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("variant,stages", [("tiny-gqa", ("attention", "down_residual")),
                                            ("tiny-d2048", ("attention_short", "mlp_fused", "transpose_down", "prefill_qkv_full",
                                                            "prefill_gate_up_tma_wide_small"))])
def test_gpu_stage_test_compiles(variant, stages):
    """tests/cuda_stage_test.cu (run by tests/test_gpu_stages.py on a GPU: each decode stage kernel and
    the prompt path's GEMM stages alone against NumPy) builds here too, through `make stage-test`: on heads of 16 (the fp32
    attention, the split MLP) and on tiny-d2048 (the tensor-core and short-context attention, the
    fused MLP); --list, which needs no GPU, names the stages its plan has."""
    from test_gpu_stages import build_stage_test

    binary = build_stage_test(variant)
    r = subprocess.run([str(binary), "--list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert set(stages) <= set(r.stdout.split()), r.stdout


def test_generic_cuda_compiles_for_sm80_and_sm89(tmp_path):
    """The generic build's forward_cuda.cu for the other targets, both in one nvcc call (make
    GENERIC=1 compiles it for sm_90 once per weight dtype: test_generic_binary_has_cuda_for_each_dtype)."""
    gen = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "codegen", "--generic", "--out", str(gen), "--cuda-arch", "80"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([NVCC, "-O1", "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_89,code=sm_89",
                        "--threads", "2", "-Iruntime", f"-I{gen}", "-DMODEL_WEIGHT_DTYPE_BF16", "-Werror", "all-warnings",
                        "-c", "runtime/forward_cuda.cu", "-o", str(tmp_path / "f.o")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
