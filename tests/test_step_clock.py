"""The step clock on a scripted clock: phase arithmetic, accumulation, and deferred (CUDA-like) reads."""

from __future__ import annotations

from typing import Any

import pytest

from tuneup.collect.batch import BatchCounter, infer_batch_size, infer_tokens
from tuneup.collect.step_clock import StepClock


class ScriptedTimer:
    """Host-like timer whose time the test sets; optionally marks complete only when the test says so."""

    kind = "scripted"
    immediate = False

    def __init__(self, deferred: bool = False) -> None:
        self.now_ms = 0.0
        self.deferred = deferred
        self.completed_up_to = -1.0
        self.waited: list[float] = []
        self.released: list[Any] = []

    def mark(self) -> Any:
        return [self.now_ms]  # a list, so identical times are still distinct marks (as events are)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return end[0] - start[0]

    def ready(self, mark: Any) -> bool:
        return not self.deferred or mark[0] <= self.completed_up_to

    def wait(self, mark: Any) -> None:
        self.waited.append(mark[0])
        self.completed_up_to = max(self.completed_up_to, mark[0])

    def release(self, mark: Any) -> None:
        self.released.append(mark)


def micro_batch(
    clock: StepClock,
    timer: ScriptedTimer,
    data: float,
    fwd: float,
    bwd: float,
    opt: float | None,
    between: float = 0.0,
    samples: int = 4,
    tail: float | None = None,
    loss: float | None = None,
) -> None:
    timer.now_ms += data
    clock.batch_start(samples, None)
    timer.now_ms += fwd
    clock.before_backward()
    timer.now_ms += bwd
    clock.after_backward()
    timer.now_ms += between
    if opt is not None:
        clock.before_optimizer()
        timer.now_ms += opt
    if tail is not None:  # the optimizer's post-hook fired; the trainer's work to the batch end follows
        clock.after_optimizer()
        timer.now_ms += tail
    clock.batch_end(loss)


def test_single_micro_batch_phases_tile_the_step() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    micro_batch(clock, timer, data=5, fwd=10, bwd=20, opt=3, between=2, tail=4)
    clock.close_step(0, 0)
    clock.drain()
    (rec,) = out
    # after backward -> before optimizer (clipping, the closure's return) is the optimizer's too
    assert (rec["data_ms"], rec["forward_ms"], rec["backward_ms"], rec["optimizer_ms"]) == (5, 10, 20, 5)
    assert rec["other_ms"] == 4 and rec["wall_ms"] == 44 and rec["micro_batches"] == 1 and rec["samples"] == 4


def test_accumulation_sums_micro_batches_into_one_step() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    for i in range(4):
        micro_batch(clock, timer, data=1, fwd=2, bwd=3, opt=4 if i == 3 else None, between=0.5)
    clock.close_step(0, 0)
    clock.drain()
    (rec,) = out
    assert rec["micro_batches"] == 4 and rec["samples"] == 16
    assert (rec["data_ms"], rec["forward_ms"], rec["backward_ms"]) == (4, 8, 12)
    # the accumulating micro-batches' tails after their backward are other; the stepping one's is optimizer
    assert rec["other_ms"] == pytest.approx(1.5) and rec["optimizer_ms"] == pytest.approx(4.5)
    assert rec["wall_ms"] == pytest.approx(30.0)


def test_restart_excludes_time_outside_training() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    micro_batch(clock, timer, data=1, fwd=1, bwd=1, opt=1)
    clock.close_step(0, 0)
    timer.now_ms += 500  # validation
    clock.restart()
    micro_batch(clock, timer, data=2, fwd=1, bwd=1, opt=1)
    clock.close_step(1, 0)
    clock.drain()
    assert out[1]["data_ms"] == 2 and out[1]["wall_ms"] == 5


def test_reported_fetches_are_data_and_the_rest_of_the_gap_is_other() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    timer.now_ms += 3  # another callback's hook
    clock.fetch_start()
    timer.now_ms += 5  # the fetch
    clock.fetch_end()
    timer.now_ms += 7  # a collective the trainer runs between batches
    micro_batch(clock, timer, data=0, fwd=1, bwd=1, opt=1)
    clock.close_step(0, 0)
    clock.drain()
    assert out[0]["data_ms"] == 5 and out[0]["other_ms"] == 10 and out[0]["wall_ms"] == 18


def test_loss_of_micro_batches_is_summed() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    for _ in range(2):
        micro_batch(clock, timer, 1, 1, 1, None, loss=0.25)
    clock.close_step(0, 0)
    clock.drain()
    assert out[0]["loss"] == 0.5


def test_deferred_marks_are_read_late_and_waited_for_only_past_max_pending() -> None:
    timer, out = ScriptedTimer(deferred=True), []
    clock = StepClock(timer, out.append, max_pending=3)
    clock.restart()
    for step in range(3):
        micro_batch(clock, timer, 1, 1, 1, 1)
        clock.close_step(step, 0)
        clock.drain()
    assert out == [] and timer.waited == []  # nothing read, nothing waited for: no sync per step
    timer.completed_up_to = timer.now_ms  # the device has caught up with the three steps queued so far
    micro_batch(clock, timer, 1, 1, 1, 1)
    clock.close_step(3, 0)
    clock.drain()
    assert [r["step"] for r in out] == [0, 1, 2] and timer.waited == []
    for step in range(4, 8):
        micro_batch(clock, timer, 1, 1, 1, 1)
        clock.close_step(step, 0)
        clock.drain()
    # Past max_pending the oldest step is waited for (long done on a real device), one at a time.
    assert [r["step"] for r in out] == list(range(5)) and timer.waited == [16.0, 20.0]
    clock.drain(force=True)
    assert [r["step"] for r in out] == list(range(8)) and all(r["wall_ms"] == 4 for r in out)


def test_host_timer_accumulates_at_once_and_resolves_in_batches(monkeypatch) -> None:
    from tuneup.collect import step_clock

    now = [100.0]
    monkeypatch.setattr(step_clock.time, "perf_counter", lambda: now[0])
    out: list[dict] = []
    clock = StepClock(step_clock.HostTimer(), out.append)
    clock.restart()
    for step in range(3):
        for phase_s in (0.001, 0.002, 0.003):  # data, forward, backward
            now[0] += phase_s
            (clock.batch_start, clock.before_backward, clock.after_backward)[
                [0.001, 0.002, 0.003].index(phase_s)
            ]()
        clock.before_optimizer()
        now[0] += 0.004
        clock.batch_end()
        clock.close_step(step, 0)
    assert out == [] and clock.pending == 3  # nothing built inside the steps
    clock.drain()
    assert [r["step"] for r in out] == [0, 1, 2]
    assert all(r["wall_ms"] == pytest.approx(10.0) and r["optimizer_ms"] == pytest.approx(4.0) for r in out)
    assert [r["t_end"] for r in out] == sorted(r["t_end"] for r in out)


def test_marks_are_recycled_but_never_while_still_in_use() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    for step in range(3):
        micro_batch(clock, timer, 1, 1, 1, 1)
        clock.close_step(step, 0)
    ids = [id(m) for m in timer.released]
    assert len(ids) == len(set(ids))  # each mark released once
    assert id(clock._last_end) not in ids  # the end of the last step is the next step's start


def test_batch_size_and_tokens_inference() -> None:
    torch = pytest.importorskip("torch")
    assert infer_batch_size(torch.zeros(5, 3)) == 5
    assert infer_batch_size((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert infer_batch_size({"pixels": torch.zeros(3, 3, 8, 8), "label": torch.zeros(3)}) == 3
    assert infer_batch_size([[torch.zeros(2, 1)]]) == 2
    assert infer_batch_size("text") is None
    ids = torch.zeros(4, 128, dtype=torch.long)
    assert infer_tokens({"attention_mask": torch.zeros(4, 9, dtype=torch.long), "input_ids": ids}) == 512
    assert infer_tokens((ids, ids)) == 512
    assert infer_tokens(torch.zeros(4, 128)) is None  # float features are not tokens
    assert infer_tokens(torch.zeros(4, 8, 8, dtype=torch.uint8)) is None  # images are not tokens


def test_batch_counter_uses_user_functions_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    counter = BatchCounter(batch_size_fn=lambda b: b["n"], tokens_fn=lambda b: b["n"] * 10)
    assert counter.samples({"n": 3}) == 3 and counter.tokens({"n": 3}) == 30
    unknown = BatchCounter()
    assert unknown.samples(object()) is None and unknown.samples(object()) is None
    assert sum("cannot tell the batch size" in r.getMessage() for r in caplog.records) == 1
    broken = BatchCounter(batch_size_fn=lambda b: 1 / 0)
    assert broken.samples(1) is None
    assert any("batch_size_fn raised ZeroDivisionError" in r.getMessage() for r in caplog.records)


def test_batch_counter_follows_the_remembered_place_and_searches_again_when_it_moves() -> None:
    torch = pytest.importorskip("torch")
    counter = BatchCounter()
    ids = torch.zeros(4, 16, dtype=torch.long)
    assert counter.samples({"input_ids": ids}) == 4 and counter.tokens({"input_ids": ids}) == 64
    assert counter.samples({"input_ids": torch.zeros(2, 8, dtype=torch.long)}) == 2
    assert counter.tokens({"input_ids": torch.zeros(2, 8, dtype=torch.long)}) == 16
    moved = (torch.zeros(3, 5), torch.zeros(3, 10, dtype=torch.long))  # another structure altogether
    assert counter.samples(moved) == 3 and counter.tokens(moved) == 30


def test_drainer_run_now_works_on_the_callers_thread_one_at_a_time() -> None:
    import threading
    import time

    from tuneup.collect.drainer import Drainer
    from tuneup.collect.gil import GilPacer

    inside, overlaps, threads, errors = [0], [0], [], []

    pauses: list[str] = []

    def work(pause: Any) -> None:
        pauses.append(type(pause).__name__ if isinstance(pause, GilPacer) else pause.__name__)
        inside[0] += 1
        overlaps[0] = max(overlaps[0], inside[0])
        threads.append(threading.current_thread().name)
        time.sleep(0.02)
        inside[0] -= 1

    drainer = Drainer(work, interval_s=0.001, on_error=errors.append)
    drainer.start()
    for _ in range(5):
        drainer.run_now()
    assert drainer.stop()
    assert overlaps[0] == 1  # never two at once, though the thread woke every millisecond
    assert threading.current_thread().name in threads and "tuneup-writer" in threads
    # Its own thread pauses to give the GIL back; the training thread, running it now, does not.
    assert {"GilPacer", "no_pause"} == set(pauses)
    assert errors == []

    def broken(pause: Any) -> None:
        raise OSError("disk full")

    failing = Drainer(broken, interval_s=60, on_error=errors.append)
    failing.run_now()  # reported, never raised into the training thread
    assert [str(e) for e in errors] == ["disk full"]


def gan_batch(clock: StepClock, timer: ScriptedTimer, post_hook: bool = True) -> None:
    """A GAN's manual step: discriminator forward, backward, step; generator forward, backward, step."""
    timer.now_ms += 2  # data
    clock.batch_start(8, None)
    for fwd, bwd, opt in ((10, 20, 3), (11, 21, 4)):
        timer.now_ms += fwd
        clock.before_backward()
        timer.now_ms += bwd
        clock.after_backward()
        timer.now_ms += 1  # toggling the optimizer, clipping
        clock.before_optimizer()
        timer.now_ms += opt
        if post_hook:
            clock.after_optimizer()
    timer.now_ms += 5  # the trainer's work up to the batch end
    clock.batch_end()


@pytest.mark.parametrize("deferred", [False, True])
def test_manual_optimization_with_two_optimizers_names_every_interval(deferred: bool) -> None:
    timer, out = ScriptedTimer(deferred=deferred), []
    clock = StepClock(timer, out.append)
    clock.restart()
    for step in range(3):
        gan_batch(clock, timer)
        clock.close_step(step, 0)
    clock.drain(force=True)
    assert [r["step"] for r in out] == [0, 1, 2]
    for r in out:
        assert (r["data_ms"], r["forward_ms"], r["backward_ms"]) == (2, 21, 41)
        assert (r["optimizer_ms"], r["sync_ms"], r["other_ms"]) == (9, 0, 5)  # both steps, plus 1 ms each
        assert r["wall_ms"] == 78 and r["micro_batches"] == 1


def test_without_the_optimizer_post_hook_the_generator_forward_is_not_lost() -> None:
    # A skipped step (GradScaler found infs) fires no post-hook: the time up to the next backward is
    # still counted, as optimizer time, and the step still tiles.
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    gan_batch(clock, timer, post_hook=False)
    clock.close_step(0, 0)
    clock.drain()
    (r,) = out
    assert r["backward_ms"] == 41 and r["wall_ms"] == 78
    assert r["data_ms"] + r["forward_ms"] + r["optimizer_ms"] + r["other_ms"] == 37


def test_trainer_collectives_between_batches_are_sync_and_excluded_time_is_no_steps() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    micro_batch(clock, timer, data=1, fwd=1, bwd=1, opt=1, tail=1)
    clock.close_step(0, 0)
    timer.now_ms += 2  # other callbacks' batch-end hooks
    clock.exclude_start()
    timer.now_ms += 300  # a checkpoint save
    clock.exclude_end()
    clock.sync_start()
    timer.now_ms += 7  # the SIGTERM flag broadcast, waiting for a slower rank
    clock.sync_end()
    clock.fetch_start()
    timer.now_ms += 3
    clock.fetch_end()
    micro_batch(clock, timer, data=0, fwd=1, bwd=1, opt=1, tail=1)
    clock.close_step(1, 0)
    clock.drain()
    r = out[1]
    assert (r["sync_ms"], r["data_ms"], r["other_ms"]) == (7, 3, 3)
    assert r["wall_ms"] == 16  # the save is in no step: the job timeline counts it


def test_a_sync_inside_the_gap_without_fetch_marks_is_carved_out_of_data() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    timer.now_ms += 4
    clock.sync_start()
    timer.now_ms += 6
    clock.sync_end()
    micro_batch(clock, timer, data=5, fwd=1, bwd=1, opt=1)
    clock.close_step(0, 0)
    clock.drain()
    assert (out[0]["data_ms"], out[0]["sync_ms"], out[0]["wall_ms"]) == (9, 6, 18)


def test_marks_inside_an_excluded_interval_are_excluded_with_it() -> None:
    # Validation fetches its own batches (its copy to the device is tapped too) and a save inside it runs a barrier:
    # none of it may leak into the next step.
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    micro_batch(clock, timer, data=1, fwd=1, bwd=1, opt=1)
    clock.close_step(0, 0)
    clock.exclude_start()  # validation
    for _ in range(3):
        clock.fetch_start()
        timer.now_ms += 10
        clock.fetch_end()
        timer.now_ms += 20
    clock.exclude_start()  # a save inside it
    clock.sync_start()
    timer.now_ms += 5
    clock.sync_end()
    clock.exclude_end()
    timer.now_ms += 1
    clock.exclude_end()
    clock.fetch_start()
    timer.now_ms += 2
    clock.fetch_end()
    micro_batch(clock, timer, data=0, fwd=1, bwd=1, opt=1)
    clock.close_step(1, 0)
    clock.drain()
    assert (out[1]["data_ms"], out[1]["sync_ms"], out[1]["wall_ms"]) == (2, 0, 5)


def test_tuneups_own_time_in_a_hook_leaves_the_users_phase_and_is_the_steps_tuneup_ms(monkeypatch) -> None:
    # A hook marks at its entry and hands back its own time at its exit (the callback's norms, its step
    # bookkeeping): the user's phases hold none of it, and the step is its phases plus tuneup's own.
    from tuneup.collect import step_clock

    now = [10.0]
    monkeypatch.setattr(step_clock.time, "perf_counter", lambda: now[0])
    out: list[dict] = []
    clock = StepClock(step_clock.HostTimer(), out.append)
    clock.restart()

    def hook(mark: Any, own_s: float) -> None:
        entered = now[0]
        mark(at=entered)
        now[0] += own_s  # tuneup's own work, after the mark
        clock.own_since(entered)

    for step in range(2):
        now[0] += 0.002  # data
        hook(clock.batch_start, 0.0005)
        now[0] += 0.010  # the user's forward
        clock.before_backward()
        now[0] += 0.020
        hook(clock.after_backward, 0.003)  # the noise scale's first norm
        now[0] += 0.001
        hook(clock.before_optimizer, 0.003)  # its second norm
        now[0] += 0.004
        hook(clock.batch_end, 0.001)  # closing the step: in the gap, the next step's own time
        clock.close_step(step, 0)
    clock.drain()
    first, second = out
    assert (first["forward_ms"], first["backward_ms"], first["optimizer_ms"]) == pytest.approx((10, 20, 5))
    assert first["tuneup_ms"] == pytest.approx(6.5)
    assert second["data_ms"] == pytest.approx(2) and second["tuneup_ms"] == pytest.approx(7.5)
    for r in out:
        phases = sum(r[f"{p}_ms"] for p in ("data", "forward", "backward", "optimizer", "sync", "other"))
        assert r["wall_ms"] == pytest.approx(phases + r["tuneup_ms"])


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("pause", ["exclude", "sync"])
def test_a_pause_inside_the_second_forward_leaves_it_forward(deferred: bool, pause: str) -> None:
    # After the first optimizer's step the clock cannot name the time until the next mark (the generator's
    # forward, or the batch's end): a save or a barrier in there must not settle it as "other".
    timer, out = ScriptedTimer(deferred=deferred), []
    clock = StepClock(timer, out.append)
    clock.restart()
    start, end = (
        (clock.exclude_start, clock.exclude_end) if pause == "exclude" else (clock.sync_start, clock.sync_end)
    )
    timer.now_ms += 2
    clock.batch_start(4)
    timer.now_ms += 10
    clock.before_backward()
    timer.now_ms += 20
    clock.after_backward()
    clock.before_optimizer()
    timer.now_ms += 4
    clock.after_optimizer()
    timer.now_ms += 3  # zero_grad, toggling the next optimizer: the generator's forward begins
    start()
    timer.now_ms += 50
    end()
    timer.now_ms += 8  # the rest of the generator's forward
    clock.before_backward()
    timer.now_ms += 20
    clock.after_backward()
    clock.before_optimizer()
    timer.now_ms += 4
    clock.after_optimizer()
    timer.now_ms += 1
    clock.batch_end()
    clock.close_step(0, 0)
    clock.drain(force=True)
    (r,) = out
    assert (r["forward_ms"], r["backward_ms"], r["optimizer_ms"], r["other_ms"]) == (21, 40, 8, 1)
    assert r["sync_ms"] == (50 if pause == "sync" else 0)
    assert r["wall_ms"] == 2 + 21 + 40 + 8 + 1 + r["sync_ms"]
