"""Precision: bf16-mixed (or TF32 matmuls) for a 32-true run on a GPU with tensor cores for them.

The compute of a bf16 step is predicted from the 32-bit one between two bounds: the ratio of the GPU's
dense peaks (the matmuls reach the same fraction of the bf16 peak as they did of the fp32 one: the most
it can gain) and one half (the step is bound by memory traffic, whose bytes halve). The point is the
geometric mean of the two. Small steps gain less than either says: the host's launch work does not
shrink with precision, which the interval's upper end (one half) bounds only loosely; the GPU check
measured it on an H200 (benchmarks/gpu_check.py).

Never on a CPU without AVX512-BF16 or AMX, where bf16 autocast is more than 2x slower (pytorch #86270); on
a CPU with them, a hypothesis to measure (it pays on matmul-bound steps and can lose on elementwise ones).
"""

from __future__ import annotations

import math
from dataclasses import replace

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Range, Recommendation
from tuneup.catalog.gpus import load_gpu_specs, match_gpu, peak_tflops_for_precision

MEMORY_BOUND_SCALE = 0.5  # bytes halve: the least a memory-bound step gains
# 32-true compute over bf16-mixed compute on a CPU without bf16 arithmetic (no AVX512-BF16, no AMX): autocast
# emulates bf16 and runs "more than 2x slower" (pytorch #86270), so 32-true takes about half the time. The
# interval: 0.3 (3.3x, the slowest ops in that issue) to 0.8 (a step of mostly non-matmul ops, which autocast
# leaves in fp32). Measured here: a bf16-mixed Lightning example ran +63% faster in 32-true.
CPU_BF16_TO_FP32 = Range(0.5, 0.3, 0.8)
# The same where the CPU's flags were not recorded: it may have bf16 arithmetic, and then 32-true is slower.
CPU_BF16_TO_FP32_UNKNOWN = Range(0.5, 0.3, 1.5)
# bf16-mixed compute over 32-true compute on a CPU with bf16 arithmetic (AVX512-BF16: about twice fp32's
# matmul rate; AMX: more). The low end: matmul-bound, a third of the time; the high end: a small or
# elementwise-bound model, where autocast's casts cost more than the matmuls save (1.3x slower). Measured
# interleaved on Lightning's GAN example on an AVX512-BF16 EPYC: +72% and +12% samples/s.
CPU_FP32_TO_BF16 = Range(0.7, 0.35, 1.3)
_BF16 = ("bf16", "bf16-mixed", "bf16-true")


def compute_scale(from_peak: float, to_peak: float) -> Range:
    """Compute time at the new precision over the old: between the peaks' ratio and one half."""
    best = from_peak / to_peak
    worst = max(best, MEMORY_BOUND_SCALE)
    return Range(math.sqrt(best * worst), best, worst)


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    precision = (o.precision or "").lower()
    if not o.on_gpu:
        return _cpu(ctx, precision)
    if precision not in ("32-true", "32", "32-mixed"):
        ctx.skip("precision", f"already {o.precision}")
        return []
    spec = match_gpu(o.gpu_name, specs=load_gpu_specs()) if o.gpu_name else None
    if spec is None:
        ctx.skip("precision", f"GPU {o.gpu_name!r} is not in the catalog: its bf16 peak is unknown")
        return []
    fp32, _ = peak_tflops_for_precision(spec, "32-true")
    bf16, _ = peak_tflops_for_precision(spec, "bf16-mixed")
    if not fp32 or not bf16 or bf16 <= fp32 * 1.5:
        ctx.skip("precision", f"{spec.name} has no bf16 tensor cores faster than fp32")
        return []
    scale = compute_scale(fp32, bf16)
    proposed = ctx.predict(replace(ctx.setting, precision="bf16-mixed"), compute_scale=scale)
    evidence = [
        f"{spec.name}: dense peak {bf16:g} TFLOP/s in bf16 against {fp32:g} in fp32",
        f"compute {o.forward_ms + o.backward_ms:.1f} ms of the {o.step_mean_ms:.1f} ms mean step (means both)"
        + (f"; MFU {o.mfu:.0%} of the fp32 peak" if o.mfu is not None else ""),
        f"predicted compute x{scale.value:.2f} (between x{scale.low:.3f}, the peaks' ratio, and x{scale.high:.2f}, "
        "memory-bound)",
    ]
    rec = ctx.recommendation(
        id="precision.bf16",
        title="Train in bf16-mixed",
        changes=[Change("precision", o.precision or "32-true", "bf16-mixed")],
        proposed=proposed,
        evidence=evidence,
        code=ctx.code.precision("bf16-mixed", o.on_gpu),
        caveats=[
            "bf16 keeps fp32's range but has 8 bits of mantissa: compare the loss curve with a 32-true run",
            "small steps gain less: the host's per-step work does not shrink with precision",
        ],
        confidence="low",
    )
    return [rec] if rec is not None else []


def _cpu_bf16(ctx: AdviceContext, hardware: str) -> list[Recommendation]:
    """A 32-bit CPU run on a CPU with bf16 arithmetic: bf16-mixed may pay or lose, by the model's kind of
    ops, which the record cannot tell: a hypothesis with the code to test it, recommended only where even
    its interval's low end gains."""
    o = ctx.observation
    scale = CPU_FP32_TO_BF16
    proposed = ctx.predict(replace(ctx.setting, precision="bf16-mixed"), compute_scale=scale)
    python, yaml = ctx.code.precision("bf16-mixed", o.on_gpu)
    apply = ctx.code.precision_line("bf16-mixed", o.on_gpu)
    rec = ctx.recommendation(
        id="precision.bf16_on_cpu",
        title="Try bf16-mixed on this CPU",
        changes=[Change("precision", o.precision or "32-true", "bf16-mixed")],
        proposed=proposed,
        evidence=[
            f"the run trained in {o.precision or '32-true'} on a CPU, and {hardware}",
            f"compute {o.forward_ms + o.backward_ms:.1f} ms of the {o.step_mean_ms:.1f} ms mean step; bf16-mixed "
            f"compute predicted x{scale.value:g} of it [x{scale.low:g} matmul-bound, x{scale.high:g} small or "
            "elementwise-bound, where autocast's casts cost more than they save]",
        ],
        code=(python, yaml),
        caveats=[
            "a hypothesis: whether bf16 pays on a CPU depends on how much of the step is matmuls; measure it",
            "bf16 keeps fp32's range but has 8 bits of mantissa: compare the loss curve with a 32-true run",
        ],
        confidence="low",
        settle=(
            f"a hypothesis to measure, since {hardware}: set `{apply}`, rerun, and compare the runs with "
            "`tuneup compare` (measured on Lightning's GAN example with AVX512-BF16: +72% and +12%; a small "
            "or elementwise-bound model can lose)"
        ),
    )
    return [rec] if rec is not None else []


def _cpu(ctx: AdviceContext, precision: str) -> list[Recommendation]:
    """A CPU run: bf16 pays only with bf16 arithmetic in the CPU; without it, back to 32-true."""
    o = ctx.observation
    hardware = {
        True: "this CPU has bf16 arithmetic (AVX512-BF16 or AMX)",
        False: "this CPU has no bf16 arithmetic (neither AVX512-BF16 nor AMX in its flags)",
        None: "this run did not record whether its CPU has bf16 arithmetic (AVX512-BF16 or AMX)",
    }[o.cpu_bf16]
    if precision not in _BF16:
        if o.cpu_bf16:
            return _cpu_bf16(ctx, hardware)
        current = o.precision or "32-true"
        if o.cpu_bf16 is False:
            why = f"so bf16 autocast would be emulated, over 2x slower (pytorch #86270): keep {current}"
        else:
            why = (
                "without which bf16 autocast is emulated, over 2x slower (pytorch #86270): keep "
                f"{current}, and if `lscpu` lists avx512_bf16 or amx_bf16, measure precision='bf16-mixed' against "
                "this run"
            )
        ctx.skip("precision", f"a CPU run in {current}; {hardware}, {why}")
        return []
    if o.cpu_bf16:
        ctx.skip("precision", f"a CPU run in {o.precision}, and {hardware}: keep it")
        return []
    scale = CPU_BF16_TO_FP32 if o.cpu_bf16 is False else CPU_BF16_TO_FP32_UNKNOWN
    proposed = ctx.predict(replace(ctx.setting, precision="32-true"), compute_scale=scale)
    evidence = [
        f"the run trained in {o.precision} on a CPU, and {hardware}",
        f"compute {o.forward_ms + o.backward_ms:.1f} ms of the {o.step_mean_ms:.1f} ms mean step (means both); bf16 autocast without "
        "bf16 arithmetic is emulated, over 2x slower (pytorch #86270): 32-true compute predicted "
        f"x{scale.value:g} of it [x{scale.low:g}, x{scale.high:g}]",
    ]
    rec = ctx.recommendation(
        id="precision.fp32_on_cpu",
        title="Train in 32-true on this CPU",
        changes=[Change("precision", o.precision or "bf16-mixed", "32-true")],
        proposed=proposed,
        evidence=evidence,
        code=ctx.code.precision("32-true", o.on_gpu),
        caveats=["32-true keeps twice the activation memory of bf16: watch host memory at large batches"],
        confidence="medium" if o.cpu_bf16 is False else "low",
        settle="rerun with precision='32-true' and compare the runs with `tuneup compare`",
    )
    return [rec] if rec is not None else []
