"""The gradient noise scale: the estimator on numbers whose answer is known, the record's new fields, and
the ground truth of a linear regression that never moves (tests/workloads/linear_gns.py)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.noise_scale import (
    ema_series,
    noise_scale_section,
    per_step_estimates,
    ratio_of_means,
    statistical_efficiency,
)
from tuneup.collect.grad_noise import (
    MAX_NOISE_EVERY,
    NoiseSampling,
    PendingNoise,
    choose_every,
    noise_record,
)
from tuneup.record import RankWriter, write_manifest

from synthetic import make_run, step_record

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "linear_gns.py"

# -- the estimator ------------------------------------------------------------------------------------


def test_expected_norms_give_the_exact_grad_sq_and_trace() -> None:
    grad_sq, trace, small, big = 3.0, 60.0, 8, 32
    # E|G_B|² = |G|² + tr(Σ)/B, with no sampling noise: the estimates are exact.
    g, t = per_step_estimates(grad_sq + trace / small, grad_sq + trace / big, small, big)
    assert g == pytest.approx(grad_sq) and t == pytest.approx(trace)
    b, low, high = ratio_of_means([g] * 100, [t] * 100)
    assert b == pytest.approx(20.0) and low == pytest.approx(20.0) and high == pytest.approx(20.0)


def _sampled_steps(
    rng: random.Random, steps: int, ranks: int, small: int, sigma: float, mean: list[float]
) -> list[tuple[float, float]]:
    """(mean of the ranks' |g_small|², |g_big|²) per step, from Gaussian per-sample gradients."""
    out = []
    for _ in range(steps):
        local = [[m + rng.gauss(0.0, sigma / math.sqrt(small)) for m in mean] for _ in range(ranks)]
        big = [sum(v[i] for v in local) / ranks for i in range(len(mean))]
        small_sq = sum(sum(x * x for x in v) for v in local) / ranks
        out.append((small_sq, sum(x * x for x in big)))
    return out


def test_sampled_gradients_give_the_true_noise_scale_within_its_interval() -> None:
    # |G|² = 1, tr(Σ) = dim·σ² = 16·0.5 = 8: B_simple = 8, around the batch sizes 8 and 16.
    mean, sigma, small, ranks = [1.0] + [0.0] * 15, math.sqrt(0.5), 8, 2
    rng = random.Random(3)
    steps = _sampled_steps(rng, 2000, ranks, small, sigma, mean)
    estimates = [per_step_estimates(s, b, small, small * ranks) for s, b in steps]
    b, low, high = ratio_of_means([g for g, _ in estimates], [t for _, t in estimates])
    assert b == pytest.approx(8.0, rel=0.1)
    assert low is not None and high is not None and low < 8.0 < high and high - low < 4.0
    # The mean of per-step ratios (what the estimator must not do) is far off: |G|² swings through zero.
    ratios = [t / g for g, t in estimates]
    assert abs(sum(ratios) / len(ratios) - 8.0) > 2.0


def test_signal_below_the_noise_has_no_number() -> None:
    assert ratio_of_means([-1.0, 0.5, 0.2], [5.0, 6.0, 7.0]) == (None, None, None)
    assert ratio_of_means([], []) == (None, None, None)


def test_ema_series_is_bias_corrected_and_skips_a_non_positive_signal() -> None:
    series = ema_series([2.0] * 5, [20.0] * 5, time_constant=50.0)
    assert series == pytest.approx([10.0] * 5)  # no pull towards zero at the start
    assert ema_series([-1.0, -1.0], [3.0, 3.0], 10.0) == [None, None]


def test_statistical_efficiency_is_pollux() -> None:
    assert statistical_efficiency(100.0, 32.0, 32.0) == 1.0
    assert statistical_efficiency(100.0, 32.0, 132.0) == pytest.approx(132 / 232)
    assert statistical_efficiency(0.0, 32.0, 64.0) == 0.5  # no noise: twice the batch, half the progress


# -- collection: one step's record fields -------------------------------------------------------------


def test_noise_record_divides_out_the_loss_scale_and_the_accumulation() -> None:
    scale = 1024.0
    pending = PendingNoise(
        "accumulation",
        small_batch=8,
        big_batch=16,
        small_sq=(3.0 / 4) * scale**2,  # 1/k of its mean gradient (k = 2), scaled by S
        big_sq=2.0,  # unscaled already (Lightning unscales before on_before_optimizer_step)
        small_factor=4.0,
        loss_scale=scale,
        small_scaled=True,
        big_scaled=False,
    )
    assert noise_record(pending, None) == {
        "gns_small_sq": pytest.approx(3.0),
        "gns_big_sq": 2.0,
        "gns_small_batch": 8,
        "gns_big_batch": 16,
    }
    ddp = PendingNoise("ddp", small_batch=8, big_batch=16, loss_scale=scale)
    assert noise_record(ddp, (3.0 * scale**2, 2.0 * scale**2))["gns_big_sq"] == pytest.approx(2.0)
    assert noise_record(ddp, None) == {}  # a bucket without its norms: no figure for the step
    assert noise_record(ddp, (math.inf, 2.0)) == {}  # an fp16 overflow


def test_callback_checks_the_option() -> None:
    from tuneup import TuneupCallback

    assert TuneupCallback(noise_scale=False).noise_scale is False
    with pytest.raises(ValueError, match="noise_scale"):
        TuneupCallback(noise_scale="yes")  # type: ignore[arg-type]
    assert TuneupCallback().noise_scale_every is None  # automatic
    assert TuneupCallback(noise_scale_every=4).noise_scale_every == 4


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "3"])
def test_a_bad_noise_scale_every_names_the_option_and_the_fix(bad: object) -> None:
    from tuneup import TuneupCallback

    with pytest.raises(ValueError, match=r"noise_scale_every=\.\.\.\) must be a positive integer.*or None"):
        TuneupCallback(noise_scale_every=bad)  # type: ignore[arg-type]


# -- sampling: which steps take the norms ----------------------------------------------------------------


def test_the_automatic_choice_keeps_the_norms_within_half_a_percent() -> None:
    # The measured worst case: 2 x 141 us of norms against a 10 ms CPU step (2.8% every step).
    k = choose_every(282e-6, 10e-3)
    assert k == 8 and 282e-6 / (k * 10e-3) <= 0.005 < 282e-6 / (k / 2 * 10e-3)
    assert choose_every(20e-6, 10e-3) == 1  # 0.2% every step: every step
    assert choose_every(50e-6, 10e-3) == 1  # exactly the budget
    assert choose_every(1.0, 1e-3) == MAX_NOISE_EVERY  # absurd norms: capped, the estimate keeps steps
    assert choose_every(0.0, 10e-3) == choose_every(1e-4, 0.0) == 1  # unknown times: every step


def test_automatic_sampling_grows_from_every_step_and_shrinks_back() -> None:
    sampling = NoiseSampling()
    assert sampling.auto and sampling.every == 1
    taken = []
    for step in range(200):
        if sampling.takes(step):
            taken.append(step)
            sampling.observe(10e-3, 282e-6)  # norms 2.8% of the step
        else:
            sampling.observe(10e-3, None)
    # Every step at first, then at most doubling per measured step, to 8 (0.35%) and no further.
    assert taken == [0, 2, 4, *range(8, 200, 8)] and sampling.every == 8
    for _ in range(40):  # the steps get slower (a bigger batch): the norms are cheap again
        sampling.observe(100e-3, 282e-6 if sampling.takes(0) else None)
    assert sampling.every == 1
    summary = sampling.summary()
    assert summary["every"] == 1 and summary["automatic"] and summary["norm_ms"] == pytest.approx(0.282)


def test_a_cold_first_norm_does_not_push_the_samples_past_the_warm_up() -> None:
    sampling = NoiseSampling()
    sampling.observe(None, 0.5)  # the first step: a norm of 500 ms (first calls), no step time yet
    assert sampling.every == 1
    sampling.observe(50e-3, 0.2)  # still cold: at most a doubling, not the 256 these times ask for
    assert sampling.every == 2
    for _ in range(20):  # warmed up: 10 us norms, 10 ms steps
        sampling.observe(10e-3, 10e-6)
    assert sampling.every == 1  # the medians forget the cold start


def test_automatic_sampling_on_cuda_is_every_step() -> None:
    # On CUDA the host times neither the norms (asynchronous kernels) nor the step (it runs ahead): the
    # automatic choice is every step there, and host timing decides only on CPU.
    from tuneup.record.writer import RecordingPolicy
    from tuneup.recording.noise import NoiseScaleSteps

    def steps(every: int | None, on_cuda: bool) -> NoiseScaleSteps:
        return NoiseScaleSteps(
            "accumulation", every, on_cuda=on_cuda, comm=None, recording=RecordingPolicy(), world_size=1
        )

    for on_cuda, auto in ((True, False), (False, True)):
        sampling = steps(None, on_cuda).sampling
        assert sampling.every == 1 and sampling.auto is auto
    assert steps(4, True).sampling.every == 4


def test_a_forced_sampling_never_moves_and_only_kept_steps_take_the_norms() -> None:
    sampling = NoiseSampling(3)
    for _ in range(50):
        sampling.observe(1e-3, 1.0)
    assert not sampling.auto and sampling.every == 3
    assert [s for s in range(12) if sampling.takes(s)] == [0, 3, 6, 9]
    # Past detail_steps the record keeps one step in 100: only those take the norms (the others would be
    # thrown away), and with k = 256 one in three of them.
    assert [s for s in range(1000, 1500) if sampling.takes(s, 100)] == [1000, 1100, 1200, 1300, 1400]
    assert [s for s in range(0, 1000, 100) if NoiseSampling(256).takes(s, 100)] == [0, 300, 600, 900]


class _Bucket:
    def __init__(self, tensor: object) -> None:
        self._tensor = tensor

    def buffer(self) -> object:
        return self._tensor

    def index(self) -> int:
        return 0


class _Group:
    def size(self) -> int:
        return 1

    def allreduce(self, tensors: list) -> object:
        import torch

        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(tensors)

        class Work:
            def get_future(self) -> object:
                return fut

        return Work()


def test_the_ddp_hook_takes_no_norm_on_a_step_left_out() -> None:
    import torch

    from tuneup.collect.comm import CommProbe, timed_allreduce_hook

    probe = CommProbe(on_cuda=False, world_size=1)
    probe.process_group = _Group()
    for taken in (False, True):
        probe.noise_scale = taken  # what the callback sets before the step's backward
        out = timed_allreduce_hook(probe, _Bucket(torch.full((4,), 2.0))).wait()
        assert torch.equal(out, torch.full((4,), 2.0))
        (record,) = probe.take()
        times = probe.take_noise_times()
        if taken:
            assert float(record.local_sq) == float(record.reduced_sq) == 16.0 and len(times) == 2
        else:
            assert record.local_sq is None and record.reduced_sq is None and times == []


def _fit_in_process(out: Path, max_steps: int, **callback: object):  # type: ignore[no-untyped-def]
    from tuneup import TuneupCallback

    from workloads.tiny import make_loader, make_module, make_trainer

    cb = TuneupCallback(dirpath=out, telemetry_interval_s=1.0, count_flops=False, **callback)  # type: ignore[arg-type]
    trainer = make_trainer("lightning", [cb], max_steps=max_steps, accumulate=2, root=str(out.parent))
    trainer.fit(make_module("lightning"), make_loader(n=1024))
    return load_run(out)


def _sampling_event(run) -> dict:  # type: ignore[no-untyped-def]
    (event,) = [e for e in run.ranks[0].events if e.get("kind") == "noise_scale_sampling"]
    return event


def test_every_third_step_carries_the_norms_in_a_real_fit(tmp_path: Path) -> None:
    run = _fit_in_process(tmp_path / "run", 30, noise_scale_every=3)
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(30))  # every step is recorded, sampled or not
    with_norms = [s.step for s in steps if s.gns_small_sq is not None]
    assert with_norms == list(range(0, 30, 3))
    for s in steps:
        fields = (s.gns_small_sq, s.gns_big_sq, s.gns_small_batch, s.gns_big_batch)
        if s.step % 3:
            assert fields == (None, None, None, None)
        else:
            assert s.gns_small_batch == 8 and s.gns_big_batch == 16 and None not in fields
    event = _sampling_event(run)
    assert event["every"] == 3 and event["automatic"] is False and event["norm_ms"] > 0
    assert run.manifest.recording["noise_scale_every"] == 3
    ns = analyze_run(run).noise_scale
    assert ns is not None and 0 < ns.steps <= 10  # the steady steps among 0, 3, ..., 27
    assert ns.series_step == with_norms and ns.ema_steps == pytest.approx(10 * 3)


def test_the_automatic_sampling_in_a_real_fit(tmp_path: Path) -> None:
    run = _fit_in_process(tmp_path / "run", 60)
    event = _sampling_event(run)
    every = event["every"]
    assert event["automatic"] is True and event["norm_ms"] > 0 and event["step_ms"] > 0
    assert every & (every - 1) == 0 and 1 <= every <= MAX_NOISE_EVERY  # a power of two
    with_norms = [s.step for s in run.steps(0) if s.gns_small_sq is not None]
    assert with_norms[0] == 0 and with_norms[-1] >= 60 - 2 * every  # measured to the end, not only warm-up
    # On this 577-parameter model the norms' dispatch alone is several % of a ~1 ms CPU step: sampled.
    if event["norm_ms"] > 0.01 * event["step_ms"]:
        assert every > 1 and len(with_norms) < 30


# -- the record ----------------------------------------------------------------------------------------


def test_old_records_without_the_fields_load_and_analyze(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "run", world_size=2, steps=30))
    assert all(s.gns_small_sq is None and s.gns_big_batch is None for s in run.steps(0))
    assert analyze_run(run).noise_scale is None


def test_two_ranks_of_recorded_norms_are_averaged_per_step(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r", "created_unix": 1.0, "world_size": 2, "num_nodes": 1})
    grad_sq, trace = 2.0, 40.0  # B_simple 20
    for rank in (0, 1):
        w = RankWriter(path, rank)
        w.open({"host": "h"})
        w.add_event("noise_scale", method="ddp", comm_hook="PowerSGDState.powerSGD_hook")
        for s in range(60):
            # The ranks' small norms straddle their expectation; only their mean is exact.
            offset = 1.5 if rank == 0 else -1.5
            rec = step_record(s)
            rec.update(
                gns_small_sq=grad_sq + trace / 8 + offset,
                gns_big_sq=grad_sq + trace / 16,
                gns_small_batch=8,
                gns_big_batch=16,
            )
            w.add_step(rec)
        w.close(status="completed")
    run = load_run(path)
    assert run.steps(1)[3].gns_small_sq == pytest.approx(grad_sq + trace / 8 - 1.5)
    ns = noise_scale_section(run, {r: rec.steps[5:] for r, rec in run.ranks.items()})
    assert ns is not None and ns.b_simple == pytest.approx(20.0) and ns.steps == 55
    assert (ns.small_batch, ns.big_batch) == (8, 16) and ns.method.startswith("DDP")
    assert any("biased" in n for n in ns.notes)  # PowerSGD's approximate average
    assert ns.series_b_simple[-1] == pytest.approx(20.0)


# -- ground truth: linear regression at learning rate 0 ------------------------------------------------


def _fit(out: Path, *args: str) -> tuple[dict, object]:
    """A linear_gns fit with the norms on every step: these tests check the estimator against the truth
    (and a loss-scaled run against a plain one, step for step) over a known number of steps, where the
    automatic sampling would take a number that depends on the machine's timing (on this 9-parameter
    model the norms' dispatch is ~14% of a 1 ms step: about one step in 32)."""
    truth = out.with_suffix(".json")
    proc = subprocess.run(
        [
            sys.executable,
            str(WORKLOAD),
            "--out",
            str(out),
            "--truth",
            str(truth),
            "--noise-scale-every",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        cwd=str(out.parent),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(truth.read_text()), load_run(out)


@pytest.fixture(scope="module")
def gns_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, object]]:
    base = tmp_path_factory.mktemp("gns")
    return {
        "ddp": _fit(base / "ddp", "--devices", "2", "--max-steps", "1000"),
        "ddp_scaled": _fit(
            base / "ddp_scaled", "--devices", "2", "--max-steps", "300", "--loss-scale", "1024"
        ),
        # FSDP2 (fully_shard under ModelParallelStrategy) sees the same batches as the DDP run, step for step.
        "fsdp2": _fit(base / "fsdp2", "--devices", "2", "--strategy", "fsdp2", "--max-steps", "1000"),
        # Lightning's Trainer reduce-scatters every micro-batch under FSDP2: 2 ranks x 2 small batches a step.
        "fsdp2_acc": _fit(
            base / "fsdp2_acc",
            "--devices",
            "2",
            "--strategy",
            "fsdp2",
            "--accumulate",
            "2",
            "--max-steps",
            "300",
        ),
        "acc": _fit(base / "acc", "--accumulate", "2", "--max-steps", "2000"),
        # The scaled runs are compared with the plain ones step for step (to 1%), not with the truth:
        # a few hundred steps show a scale left in as well as a thousand.
        "acc_scaled": _fit(
            base / "acc_scaled", "--accumulate", "2", "--max-steps", "300", "--loss-scale", "1024"
        ),
    }


def _estimate(run, last_step: int | None = None):  # type: ignore[no-untyped-def]
    """The estimate over every recorded step (up to `last_step`): runs compared on the same steps."""
    steps = {
        r: [s for s in rec.steps if last_step is None or s.step <= last_step] for r, rec in run.ranks.items()
    }
    return noise_scale_section(run, steps)


@pytest.mark.slow
def test_ddp_and_accumulation_estimates_match_the_brute_force_truth(gns_runs) -> None:  # type: ignore[no-untyped-def]
    truth, ddp = gns_runs["ddp"]
    _, acc = gns_runs["acc"]
    true_b = truth["b_simple"]
    assert 5 < true_b < 20  # of the order of the batch sizes (8 and 16), where it is measurable
    ddp_ns, acc_ns = analyze_run(ddp).noise_scale, analyze_run(acc).noise_scale
    assert ddp_ns is not None and acc_ns is not None
    assert ddp_ns.steps >= 200 and (ddp_ns.small_batch, ddp_ns.big_batch) == (8, 16)
    assert (acc_ns.small_batch, acc_ns.big_batch) == (8, 16)
    assert ddp_ns.method.startswith("DDP") and acc_ns.method.startswith("first micro-batch")
    print(
        f"\ntrue B_simple {true_b:.3f} (|G|² {truth['grad_sq']:.4f}, tr Σ {truth['trace_sigma']:.3f}); "
        f"DDP 2 ranks {ddp_ns.b_simple:.3f} [{ddp_ns.ci_low:.2f}, {ddp_ns.ci_high:.2f}] over {ddp_ns.steps} "
        f"steps; 1 rank, accumulation 2: {acc_ns.b_simple:.3f} [{acc_ns.ci_low:.2f}, {acc_ns.ci_high:.2f}] "
        f"over {acc_ns.steps} steps"
    )
    assert ddp_ns.b_simple == pytest.approx(true_b, rel=0.15)
    assert acc_ns.b_simple == pytest.approx(true_b, rel=0.15)
    assert acc_ns.b_simple == pytest.approx(ddp_ns.b_simple, rel=0.15)
    # Each side separately, not only their ratio.
    assert ddp_ns.grad_sq == pytest.approx(truth["grad_sq"], rel=0.15)
    assert ddp_ns.trace_sigma == pytest.approx(truth["trace_sigma"], rel=0.15)
    # The test would catch a forgotten accumulation factor: without Lightning's 1/k undone (k² = 4) the
    # first micro-batch's norm is a quarter, and the estimate is nowhere near the truth.
    steps = [s for s in acc.steps(0) if s.gns_small_sq is not None]
    est = [per_step_estimates(s.gns_small_sq / 4, s.gns_big_sq, 8, 16) for s in steps]
    wrong, _, _ = ratio_of_means([g for g, _ in est], [t for _, t in est])
    assert wrong is None or abs(wrong / true_b - 1) > 0.5


@pytest.mark.slow
def test_fsdp2_estimate_matches_the_brute_force_truth_and_ddp_step_for_step(gns_runs) -> None:  # type: ignore[no-untyped-def]
    truth, fsdp2 = gns_runs["fsdp2"]
    _, ddp = gns_runs["ddp"]
    _, fsdp2_acc = gns_runs["fsdp2_acc"]
    true_b = truth["b_simple"]
    ns, acc_ns = analyze_run(fsdp2).noise_scale, analyze_run(fsdp2_acc).noise_scale
    assert ns is not None and acc_ns is not None
    assert ns.method.startswith("FSDP2") and ns.steps >= 200 and (ns.small_batch, ns.big_batch) == (8, 16)
    # One reduce-scatter per micro-batch: each is one micro-batch's gradient (its loss divided by 2).
    assert (acc_ns.small_batch, acc_ns.big_batch) == (8, 32)
    print(
        f"\ntrue B_simple {true_b:.3f}; FSDP2 2 ranks {ns.b_simple:.3f} [{ns.ci_low:.2f}, {ns.ci_high:.2f}] over "
        f"{ns.steps} steps; FSDP2 with accumulation 2: {acc_ns.b_simple:.3f} [{acc_ns.ci_low:.2f}, "
        f"{acc_ns.ci_high:.2f}] over {acc_ns.steps} steps"
    )
    assert ns.b_simple == pytest.approx(true_b, rel=0.15)
    assert ns.grad_sq == pytest.approx(truth["grad_sq"], rel=0.15)
    assert ns.trace_sigma == pytest.approx(truth["trace_sigma"], rel=0.15)
    assert acc_ns.b_simple == pytest.approx(true_b, rel=0.15)
    # The test would catch a forgotten factor: each reduction is half its micro-batch's mean gradient, and
    # without the 2 of the r reductions' mean (r² / r) the small norm is half, far from the truth.
    steps = [s for r in (0, 1) for s in fsdp2_acc.steps(r) if s.gns_small_sq is not None]
    est = [per_step_estimates(s.gns_small_sq / 2, s.gns_big_sq * 2, 8, 32) for s in steps]
    wrong, _, _ = ratio_of_means([g for g, _ in est], [t for _, t in est])
    assert wrong is None or abs(wrong / true_b - 1) > 0.5
    # The same data and model as the DDP run: the ranks' mean local norm and the sum of their shards' parts
    # are DDP's two norms, step for step (rank 1's shards of this 9-parameter model are padding only).
    for step in range(0, 1000, 7):
        d = [ddp.steps(r)[step] for r in (0, 1)]
        f = [fsdp2.steps(r)[step] for r in (0, 1)]
        assert d[0].step == f[0].step == step
        small = sum(s.gns_small_sq for s in f)  # type: ignore[misc]
        assert small == pytest.approx(sum(s.gns_small_sq for s in d), rel=1e-4)  # type: ignore[misc]
        assert sum(s.gns_big_sq for s in f) == pytest.approx(d[0].gns_big_sq, rel=1e-4)  # type: ignore[misc]


@pytest.mark.slow
def test_a_loss_scale_of_1024_is_divided_out(gns_runs) -> None:  # type: ignore[no-untyped-def]
    for plain_name, scaled_name, last in (("ddp", "ddp_scaled", 299), ("acc", "acc_scaled", 299)):
        _, plain = gns_runs[plain_name]
        _, scaled = gns_runs[scaled_name]
        a, b = _estimate(plain, last), _estimate(scaled, last)
        assert a is not None and b is not None and a.steps == b.steps
        print(f"\n{plain_name}: B_simple {a.b_simple:.4f} plain, {b.b_simple:.4f} with loss scale 1024")
        assert b.b_simple == pytest.approx(a.b_simple, rel=0.01)
        # Both sides too: a scale left in would multiply them by 1024² (and cancel in DDP's ratio).
        assert b.grad_sq == pytest.approx(a.grad_sq, rel=0.01)
        assert b.trace_sigma == pytest.approx(a.trace_sigma, rel=0.01)
