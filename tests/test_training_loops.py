"""Every training loop Lightning supports, measured right: a delay injected into each phase comes back in
that phase, step ids are consecutive, and steps/s and time-to-target count training steps (batches that
stepped the optimizers), in real Lightning fits on CPU."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tuneup import TuneupCallback, load_run
from tuneup.analyze.analysis import analyze_run
from tuneup.cost.options import CostOptions

from workloads.loops import (
    KINDS,
    SLEPT_MS,
    Delays,
    calls_per_step,
    clear_injected,
    injected_in,
    make_loader,
    make_module,
    make_trainer,
    pauses_outside_steps,
)

STEPS = 24
DELAYS = Delays()


def _batch_clock(namespace: str) -> Any:
    """A plain callback that notes when each batch ended: the test's own measure of the step rate."""
    import importlib

    L = importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")

    class BatchClock(L.Callback):
        def __init__(self) -> None:
            self.batch_ends: list[float] = []
            self.global_steps: list[int] = []

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            self.batch_ends.append(time.perf_counter())
            self.global_steps.append(trainer.global_step)

    return BatchClock()


def _fit(
    namespace: str, kind: str, out: Path, delays: Delays = DELAYS, control: bool = False
) -> tuple[Path, Any]:
    """A fit of the loop; `control`: its delays are pauses outside the training steps (workloads.loops), so
    that its steps hold the loop's own work only, run as cold as in the delayed loop."""
    clock = _batch_clock(namespace)
    clear_injected()
    cb = TuneupCallback(dirpath=out, telemetry_interval_s=0.5, count_flops=False)
    trainer = make_trainer(namespace, kind, [cb, clock], STEPS, str(out.parent))
    module, loader = make_module(namespace, kind, delays), make_loader(delays)
    if control:
        with pauses_outside_steps(lambda: cb._clock.exclude_start(), lambda: cb._clock.exclude_end()):
            trainer.fit(module, loader)
    else:
        trainer.fit(module, loader)
    assert cb.run_dir is not None
    return cb.run_dir, clock


def _phase_medians(run_dir: Path) -> dict[str, float]:
    steady = load_run(run_dir).steps(0)[2:]
    return {
        p: statistics.median(getattr(s, f"{p}_ms") for s in steady)
        for p in ("data", "forward", "backward", "optimizer")
    }


def _assert_delays_come_back(kind: str, steady: list[Any], own: dict[str, float]) -> None:
    for phase, calls in calls_per_step(kind).items():
        # Per step: what the step's phase took, less the delays injected into it within the step's window
        # (as they really took, preemptions included), is the loop's own work; it must match the control's,
        # so that the delay comes back whole in its phase: within 10% of the delay, or 2 ms.
        injected = [injected_in(phase, s.t_end - s.wall_ms / 1000.0, s.t_end) for s in steady]
        assert statistics.median(injected) > 0.9 * calls * getattr(DELAYS, f"{phase}_ms"), (phase, injected)
        left = statistics.median(getattr(s, f"{phase}_ms") - i for s, i in zip(steady, injected, strict=True))
        tolerance = max(0.10 * statistics.median(injected), 2.0)
        assert left == pytest.approx(own[phase], abs=tolerance), (
            phase,
            left,
            own[phase],
            statistics.median(injected),
        )
    for s in steady:
        # The step is the user's phases and tuneup's own time (its hooks, timed apart).
        named = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.sync_ms + s.other_ms
        assert s.tuneup_ms is not None and s.tuneup_ms > 0
        assert named + s.tuneup_ms == pytest.approx(s.wall_ms, abs=0.01)


@pytest.mark.parametrize(
    "namespace,kind",
    [("lightning", k) for k in KINDS] + [("pytorch_lightning", "gan")],
)
def test_injected_delays_come_back_in_their_phase(namespace: str, kind: str, tmp_path: Path) -> None:
    # The loop's own work per phase, in a control run just before: on a loaded machine it is not small, and
    # it is not the delay under test. The control pauses where the delays are, outside its steps: the code
    # after a pause runs slower than back to back (workloads.loops), and a control without the pauses
    # measured forward 1.3-1.9 ms below the delayed loop's own time on a 2-core VM, with or without tuneup.
    own = _phase_medians(_fit(namespace, kind, tmp_path / "control", control=True)[0])
    run_dir, clock = _fit(namespace, kind, tmp_path / "run")
    run = load_run(run_dir)
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(STEPS))  # consecutive, one per training step
    steady = steps[2:]
    _assert_delays_come_back(kind, steady, own)
    # Nothing of the injected work is left unnamed: "other" is the trainer's own bookkeeping, a few per cent
    # of the typical step (a single step can still catch a preemption or a collection there).
    other_share = statistics.median(s.other_ms / s.wall_ms for s in steady)
    assert other_share < 0.05, [round(s.other_ms, 2) for s in steady]

    # Steps/s is training steps per second, as the test's own clock counts batches that stepped.
    stepped = [
        t
        for t, g, prev in zip(clock.batch_ends[1:], clock.global_steps[1:], clock.global_steps, strict=False)
        if g != prev
    ]
    own_rate = (len(stepped) - 3) / (stepped[-1] - stepped[2])
    analysis = analyze_run(run, CostOptions(target_steps=1000))
    assert analysis.throughput.steps_per_s == pytest.approx(own_rate, rel=0.10), (
        analysis.warmup.steps,
        [round(s.wall_ms, 1) for s in steps],
    )
    (projection,) = [p for p in analysis.cost.projections if p.target.startswith("1,000")]
    overhead = 1 + (analysis.cost.loop_overhead_share or 0.0)
    # The run ended (max_steps): the target is a run of 1,000 training steps from step 0.
    assert analysis.cost.run_ended and projection.steps_remaining == 1000
    assert projection.time_s == pytest.approx(1000 / own_rate * overhead, rel=0.15)
    assert [t for t in (p.target for p in analysis.cost.projections) if t.startswith("max_steps")] == []


def test_delays_come_back_over_a_control_while_another_process_takes_a_cpu(tmp_path: Path) -> None:
    # The held-out check of issue 25: delays in forward, backward and optimizer of a manual loop with two
    # optimizers come back within 10% or 2 ms over a control of the same loop whose steps hold no delay
    # (it pauses outside them, as the test above says why), on a machine where another CPU-bound process
    # runs (started and ended here).
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        own = _phase_medians(_fit("lightning", "gan", tmp_path / "control", control=True)[0])
        run_dir, _ = _fit("lightning", "gan", tmp_path / "run")
    finally:
        hog.kill()
        hog.wait(timeout=30)
    steps = load_run(run_dir).steps(0)
    assert [s.step for s in steps] == list(range(STEPS))
    _assert_delays_come_back("gan", steps[2:], own)


NORM_MS = 4.0


def test_the_noise_scale_norms_are_tuneups_own_time_not_the_users_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One process with gradient accumulation takes two gradient norms per step (after the first
    # micro-batch's backward, before the optimizer step). Made slow here, they must show as the step's
    # tuneup_ms, and no user phase may hold them.
    from tuneup.collect import grad_noise

    norm = grad_noise.grads_squared_norm

    def slow_norm(parameters: Any) -> Any:
        end = time.perf_counter() + NORM_MS / 1000.0
        while time.perf_counter() < end:
            pass
        return norm(parameters)

    monkeypatch.setattr(grad_noise, "grads_squared_norm", slow_norm)
    clear_injected()
    cb = TuneupCallback(dirpath=tmp_path / "run", count_flops=False, noise_scale_every=1)
    trainer = make_trainer("lightning", "automatic", [cb], STEPS, str(tmp_path))
    trainer.fit(make_module("lightning", "automatic", Delays(0, 0, 0, 0)), make_loader(Delays(0, 0, 0, 0)))
    steady = load_run(cb.run_dir).steps(0)[2:]
    assert all(s.gns_small_sq is not None for s in steady)  # every step took its norms
    assert statistics.median(s.tuneup_ms or 0.0 for s in steady) >= 2 * NORM_MS
    for phase in ("forward", "backward", "optimizer", "other"):
        assert statistics.median(getattr(s, f"{phase}_ms") for s in steady) < NORM_MS, phase


def test_a_gan_run_reports_one_step_per_batch_and_projects_max_steps_in_batches(tmp_path: Path) -> None:
    run_dir, clock = _fit("lightning", "gan", tmp_path / "run")
    run = load_run(run_dir)
    info = run.ranks[0].info.raw
    assert (info["steps_at_end"], info["optimizer_steps_at_end"]) == (STEPS, 2 * STEPS)
    assert clock.global_steps[-1] == 2 * STEPS  # Lightning counted both optimizers' steps
    # A run still going (here: the same record, not yet ended) projects max_steps in training steps.
    from tuneup.analyze.cost import optimizer_steps_per_step

    assert optimizer_steps_per_step(run) == 2.0


def test_the_timeline_accounts_for_validation_checkpoints_and_the_whole_fit(tmp_path: Path) -> None:
    import lightning.pytorch as L

    clear_injected()
    out = tmp_path / "run"
    cb = TuneupCallback(dirpath=out, telemetry_interval_s=0.5, count_flops=False)
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1)
    trainer = make_trainer(
        "lightning",
        "manual",
        [cb, saver],
        40,
        str(tmp_path),
        enable_checkpointing=True,
        val_check_interval=10,
        limit_val_batches=3,
        num_sanity_val_steps=2,
    )
    module = make_module("lightning", "manual", Delays(2, 1, 1, 1), validation_ms=30, save_ms=60)
    val_loader = make_loader(Delays(), batches=8, data_ms=0)
    started = time.perf_counter()
    trainer.fit(module, make_loader(Delays(2, 1, 1, 1)), val_loader)
    fit_s = time.perf_counter() - started

    analysis = analyze_run(load_run(cb.run_dir))
    tl = analysis.timeline
    assert tl is not None and tl.stop_reason == "max_steps" and tl.ended
    parts = {p.name: p for p in tl.parts}
    validations = len(SLEPT_MS["validation"]) - 2  # less the sanity check's two batches
    assert parts["validation"].count == 4 and validations == 12
    assert parts["validation"].seconds == pytest.approx(sum(SLEPT_MS["validation"][2:]) / 1000, rel=0.10)
    assert parts["sanity_check"].count == 1
    # The sanity check holds its two batches and the validation loop's start-up (its dataloader).
    assert parts["sanity_check"].seconds == pytest.approx(sum(SLEPT_MS["validation"][:2]) / 1000, abs=0.03)
    assert parts["checkpoint_saves"].count == 4
    assert parts["checkpoint_saves"].seconds == pytest.approx(sum(SLEPT_MS["save"]) / 1000, rel=0.2)
    assert parts["training_steps"].count == 40
    # The parts add up to the fit, and the fit is what the user's clock saw around trainer.fit (less the
    # process group and data preparation before the callback's setup: nothing on one CPU process).
    assert sum(p.seconds for p in tl.parts) == pytest.approx(tl.fit_wall_s, rel=1e-6), tl.parts
    assert tl.fit_wall_s == pytest.approx(fit_s, rel=0.02)
    assert parts["other_fit_loop"].share < 0.05, parts["other_fit_loop"]
    # An epoch's time and cost include validation and saves at this run's rate.
    assert analysis.cost.loop_overhead_share == pytest.approx(
        (parts["validation"].seconds + parts["checkpoint_saves"].seconds + parts["other_fit_loop"].seconds)
        / parts["training_steps"].seconds
    )
    # Validation and saves are in no step: no step holds a validation (3 x 30 ms) or a save (60 ms).
    assert max(s.wall_ms for s in load_run(cb.run_dir).steps(0)[1:]) < 55


def test_profile_steps_writes_a_trace_and_the_report_names_the_operators(tmp_path: Path) -> None:
    import json

    from tuneup.report import build_report

    out = tmp_path / "run"
    cb = TuneupCallback(dirpath=out, count_flops=False, profile_steps=2, profile_start_step=3)
    trainer = make_trainer("lightning", "gan", [cb], 8, str(tmp_path))
    trainer.fit(make_module("lightning", "gan", Delays(0, 0, 0, 0)), make_loader(Delays(0, 0, 0, 0)))
    trace = json.loads((out / "rank-0" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::addmm" in names and "tuneup/backward" in names  # the step's operators, and its phases
    analysis = analyze_run(load_run(out))
    assert analysis.operators is not None
    by_phase = {p.phase: {o.name for o in p.operators} for p in analysis.operators.phases}
    assert "aten::addmm" in by_phase["forward"] and any("Backward" in n for n in by_phase["backward"])
    assert any("aten::add" in n or "sgd" in n.lower() for n in by_phase["optimizer"])
    report = build_report(out)
    assert "aten::addmm" in json.dumps(report)
