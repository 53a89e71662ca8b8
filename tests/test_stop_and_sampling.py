"""Issue 25's report cases, on records written through the real writer: a user's Ctrl-C is a stop and not
an interruption, the steps kept past the record's detail are not the logging steps (and the report says how
they were sampled), torch.compile's time is named, and the HTML shows reasons and code as a reader needs."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from tests.synthetic import step_record
from tuneup.advise import AdviceOptions, advise
from tuneup.record import RankWriter, RecordingPolicy, write_manifest
from tuneup.report import analyze, write_report
from tuneup.report.terminal import render_terminal

FAST_MS, SLOW_MS = 6.2, 10.5  # a step, and a step on which Lightning logs (the issue measured 6.2 and 9.4)
LOG_EVERY = 50  # Lightning's default log_every_n_steps


def _record(
    path: Path,
    walls_ms: list[float],
    *,
    policy: RecordingPolicy | None = None,
    status: str = "completed",
    stop_reason: str | None = "max_steps",
    saves_every: int = 0,
    save_ms: float = 5.0,
    model: dict[str, Any] | None = None,
    sanity_s: float = 0.0,
) -> Path:
    """One rank's run of `walls_ms` steps, back to back from t=1000 s, with a timed save every `saves_every`
    steps and a sanity check of `sanity_s` before the first step."""
    policy = policy or RecordingPolicy()
    write_manifest(
        path,
        {
            "run_id": "r1",
            "created_unix": 1.0,
            "world_size": 1,
            "num_nodes": 1,
            "recording": policy.as_dict(),
            "model": model or {},
        },
    )
    w = RankWriter(path, 0, policy)
    t0 = 1000.0
    w.open({"host": "node0", "start_unix": t0 - sanity_s - 1.0, "fit_start_unix": t0 - sanity_s - 1.0})
    if sanity_s:
        w.add_event("sanity_check", t_start=t0 - sanity_s, duration_ms=sanity_s * 1000)
    t = t0
    for step, wall in enumerate(walls_ms):
        t += wall / 1000.0
        phases = {"data_ms": 0.1, "forward_ms": 0.3, "backward_ms": 0.4, "optimizer_ms": 0.1, "other_ms": 0.1}
        w.add_step({**step_record(step, wall), "t_end": t, **{k: f * wall for k, f in phases.items()}})
        if saves_every and step % saves_every == saves_every - 1:
            w.add_event("checkpoint", t_start=t, duration_ms=save_ms)
            t += save_ms / 1000.0
    w.close(
        status=status,
        stop_reason=stop_reason,
        train_start_unix=t0,
        train_end_unix=t,
        fit_end_unix=t + 0.01,
    )
    return path


def _logging_run_ms(steps: int, seed: int = 0) -> list[float]:
    """Steps of 6.2 ms with a little jitter; every LOG_EVERY-th step, where the logger writes, 10.5 ms."""
    rng = random.Random(seed)
    return [
        (SLOW_MS if step % LOG_EVERY == 0 else FAST_MS) * (1 + rng.uniform(-0.03, 0.03))
        for step in range(steps)
    ]


# -- sampling ----------------------------------------------------------------------------------------


def test_kept_steps_are_not_the_logging_steps_and_no_slow_period_is_made_of_them(tmp_path: Path) -> None:
    walls = _logging_run_ms(2100)
    run_dir = _record(tmp_path / "run", walls)
    analysis = analyze(run_dir)
    kept = [s.step for s in analysis_steps(run_dir)]
    sampled = [s for s in kept if s >= 1000]
    # Past the detail, one step in 101: a prime, so that the logging steps are kept in their own share
    # (a stride of 100 kept only multiples of 100, every one a logging step).
    assert sampled and all(s % 101 == 0 for s in sampled)
    logging_share = sum(1 for s in sampled if s % LOG_EVERY == 0) / len(sampled)
    assert logging_share < 0.2
    assert analysis.step_time.slow_periods == []
    # The report and `tuneup show` say how the steps were kept.
    said = "1,011 of 2,100 steps: every step up to 1,000, then one in 101"
    assert analysis.run.steps_seen == 2100 and analysis.run.steps_recorded == 1011
    assert f"steps recorded {said} per rank" in render_terminal(analysis)
    md = write_report(run_dir, tmp_path / "report", "md").path("md").read_text()  # type: ignore[union-attr]
    assert said in md


def test_the_step_time_of_a_sampled_run_is_the_step_time_of_all_its_steps(tmp_path: Path) -> None:
    # Kept only at multiples of 100, the 50 sampled steps of a 6,000-step run were all logging steps: the
    # mean step time came out 3% high (and 10% on a 20,000-step run, with p95 the logging step's time).
    walls = _logging_run_ms(6000)
    analysis = analyze(_record(tmp_path / "run", walls))
    every_step_ms = sum(walls[1:]) / len(walls[1:])
    assert analysis.step_time.mean_ms == pytest.approx(every_step_ms, rel=0.01)


def test_a_long_runs_step_time_and_rate_count_every_step_not_its_dense_first_thousand(tmp_path: Path) -> None:
    # 1,000 steps of 5 ms, then 2,000 of 10 ms of which one in 101 is kept: unweighted, the ~20 kept slow
    # steps counted as 20 of ~1,020 and the mean came out near 5 ms; every step's mean is 8.33 ms.
    walls = [5.0] * 1000 + [10.0] * 2000
    analysis = analyze(_record(tmp_path / "run", walls))
    every_step_ms = sum(walls[1:]) / len(walls[1:])
    assert analysis.step_time.mean_ms == pytest.approx(every_step_ms, rel=0.02)
    # Most of the steps are the slow ones: so is the median.
    assert analysis.step_time.median_ms == pytest.approx(10.0, rel=0.01)
    samples_per_step = analysis_steps(tmp_path / "run")[0].samples
    assert analysis.throughput.samples_per_s == pytest.approx(
        samples_per_step * 1000.0 / every_step_ms, rel=0.02
    )


def analysis_steps(run_dir: Path) -> list[Any]:
    from tuneup import load_run

    return load_run(run_dir).steps(0)


def test_a_sampled_stretch_that_is_slow_is_still_found_and_weighed_for_the_steps_it_stands_for(
    tmp_path: Path,
) -> None:
    # Slow from step 1,500 on (a co-scheduled job): 6 sampled steps against 1,000 dense ones, but 600 of
    # 2,100 steps run, over a third of the time.
    walls = [FAST_MS if step < 1500 else 2.5 * FAST_MS for step in range(2100)]
    walls = [w * (1 + random.Random(step).uniform(-0.03, 0.03)) for step, w in enumerate(walls)]
    analysis = analyze(_record(tmp_path / "run", walls, policy=RecordingPolicy(sample_every=40)))
    (period,) = analysis.step_time.slow_periods
    assert period.first_step >= 1500 and period.slowdown == pytest.approx(2.5, rel=0.1)
    expected_share = 600 * 2.5 / (1500 + 600 * 2.5)
    assert period.share_of_time == pytest.approx(expected_share, abs=0.05)


def test_a_slow_period_ends_where_its_slow_steps_end_not_on_the_fast_sampled_steps_after_it(
    tmp_path: Path,
) -> None:
    """`show` said 'Slow period: steps 981-1111' on a run slow over steps 987-999 only: the window's median
    of the kept steps 1010 and 1111 (fast, 11.9 and 11.8 ms) reached back into the slow dense steps."""
    slow = range(930, 1000)  # 70 steps at 140 ms: 9.8 s, a period by every bar
    walls = [140.0 if step in slow else 12.0 for step in range(1300)]
    walls = [w * (1 + random.Random(step).uniform(-0.03, 0.03)) for step, w in enumerate(walls)]
    analysis = analyze(_record(tmp_path / "run", walls))
    (period,) = analysis.step_time.slow_periods
    assert (period.first_step, period.last_step) == (930, 999)
    assert period.steps == len(slow)


def test_a_slow_periods_share_of_the_time_counts_the_sampled_steps_by_the_clock(tmp_path: Path) -> None:
    """Past the detail, a kept step stood for the 101 steps before it by its own time: on a heavy-tailed run
    the kept steps averaged 8.7 ms where the clock (and the windows) said the steps took 40.5 ms, and a slow
    period's share of the time came out inflated. Here the kept steps run 10 ms and the others 50 ms."""
    walls = [100.0 if 900 <= step < 1000 else 10.0 for step in range(1000)]
    walls += [10.0 if step % 101 == 0 else 50.0 for step in range(1000, 2100)]
    analysis = analyze(_record(tmp_path / "run", walls))
    (period,) = analysis.step_time.slow_periods
    assert (period.first_step, period.last_step) == (900, 999)
    steady_ms = sum(walls[1:])  # every step after the first is steady here
    assert period.share_of_time == pytest.approx(100 * 100.0 / steady_ms, abs=0.02)


def test_the_policy_keeps_a_prime_stride_that_favours_no_round_period() -> None:
    policy = RecordingPolicy(detail_steps=0, sample_every=100)
    kept = [s for s in range(0, 101 * 50 * 4) if policy.keeps(s, 10**6)]
    for period in (10, 20, 25, 50, 100, 200):
        share = sum(1 for s in kept if s % period == 0) / len(kept)
        assert share == pytest.approx(1 / period, abs=0.01)
    assert (
        RecordingPolicy(sample_every=1).sample_stride == 1
        and RecordingPolicy(sample_every=2).sample_stride == 2
    )


# -- stops and interruptions -------------------------------------------------------------------------


def _checkpoint_advice(run_dir: Path) -> tuple[list[Any], dict[str, str]]:
    advice = advise([analyze(run_dir)], AdviceOptions())
    recs = [r for r in advice.recommendations if r.id == "checkpoint.interval"]
    return recs, {c.knob: c.reason for c in advice.considered}


def test_a_user_stop_is_no_interruption_and_plans_no_checkpoints(tmp_path: Path) -> None:
    walls = [FAST_MS * 10] * 200
    run_dir = _record(
        tmp_path / "run", walls, status="interrupted", stop_reason="user_interrupt", saves_every=20
    )
    analysis = analyze(run_dir)
    assert analysis.interruptions is not None
    assert analysis.interruptions.interruptions == 0 and analysis.interruptions.user_stops == 1
    assert "stopped because the user interrupted it (Ctrl-C)" in render_terminal(analysis)
    recs, considered = _checkpoint_advice(run_dir)
    assert recs == [] and "stopped by the user" in considered["checkpoint interval"]


def test_an_old_record_of_a_ctrl_c_reads_as_a_user_stop(tmp_path: Path) -> None:
    # Before the stop reason was kept, the callback closed a KeyboardInterrupt's record as "interrupted".
    run_dir = _record(tmp_path / "run", [60.0] * 200, status="interrupted", stop_reason=None, saves_every=20)
    analysis = analyze(run_dir)
    assert analysis.timeline is not None and analysis.timeline.stop_reason == "user_interrupt"
    assert analysis.interruptions is not None and analysis.interruptions.interruptions == 0


def test_a_preemption_still_plans_checkpoints_with_no_zero_interval(tmp_path: Path) -> None:
    # A SIGTERM after 12 s with a 5 ms save: tau* = sqrt(2 x 0.005 x 12) ~ 0.35 s, under a second.
    # Saved after steps 79 and 159: the 40 steps after the last save (2.4 s) are lost to the SIGTERM.
    run_dir = _record(
        tmp_path / "run", [60.0] * 200, status="exception", stop_reason="sigterm", saves_every=80
    )
    analysis = analyze(run_dir)
    assert analysis.interruptions is not None and analysis.interruptions.interruptions == 1
    assert "stopped because it received SIGTERM" in render_terminal(analysis)
    (rec,) = _checkpoint_advice(run_dir)[0]
    assert not re.search(r"\(~0 s\)|timedelta\(seconds=0\)", rec.title + rec.code)
    assert "timedelta" not in rec.code  # under a second: the step form alone
    # The report counts the work since the last save as lost (no segment resumed to redo it yet: it was
    # "0.00 s"), and the advice puts the model's loss in seconds beside that figure.
    section = analysis.interruptions
    assert section.unsaved_s == pytest.approx(2.4, abs=0.05) and section.lost_s == section.unsaved_s
    (line,) = [e for e in rec.evidence if "the record lost" in e]
    assert "the record lost 2.4 s of work to its interruptions" in line


@pytest.mark.parametrize(
    ("status", "stop_reason", "said"),
    [
        ("completed", "max_steps", "completed"),
        ("interrupted", "user_interrupt", "stopped by the user (Ctrl-C)"),
        ("interrupted", None, "stopped by the user (Ctrl-C)"),  # a record from before the stop reason
        ("exception", "sigterm", "terminated (SIGTERM)"),  # Lightning raises its SIGTERMException
        ("exception", "exception", "failed (an exception)"),
    ],
)
def test_the_status_is_said_from_the_stop_reason_the_same_everywhere(
    tmp_path: Path, status: str, stop_reason: str | None, said: str
) -> None:
    """A Ctrl-C run's report said 'Status: interrupted' beside 'a stop, not an interruption'; a SIGTERM run's
    'Status: exception' and its segment 'exception' while show said 'received SIGTERM'."""
    run_dir = _record(tmp_path / "run", [60.0] * 40, status=status, stop_reason=stop_reason)
    analysis = analyze(run_dir)
    assert analysis.run.status == {"0": said}
    assert analysis.interruptions is not None
    assert [seg.status for seg in analysis.interruptions.segments] == [[said]]
    md = write_report(run_dir, tmp_path / "report", "md").path("md").read_text()  # type: ignore[union-attr]
    assert f"- **Status**: {said} (rank 0)" in md
    assert not re.search(r"Status\*\*: (interrupted|exception)\b", md)


# -- torch.compile -----------------------------------------------------------------------------------


def test_compile_time_is_named_in_the_timeline(tmp_path: Path) -> None:
    walls = [4000.0] + [FAST_MS] * 60  # the first training step compiles the training graph
    run_dir = _record(tmp_path / "run", walls, model={"class": "M", "compiled": [""]}, sanity_s=30.0)
    analysis = analyze(run_dir)
    tl = analysis.timeline
    assert tl is not None and tl.compiled == [""]
    assert tl.first_step_extra_s == pytest.approx(4.0, abs=0.01)
    shown = render_terminal(analysis)
    assert "sanity check (incl. torch.compile warm-up)" in shown
    assert (
        "Compiled with torch.compile: the LightningModule" in shown
        and "first training step took 3.99 s more" in shown
    )
    # Not compiled: the sanity check keeps its plain name.
    plain = analyze(_record(tmp_path / "plain", walls, model={"class": "M", "compiled": []}, sanity_s=30.0))
    assert "torch.compile" not in render_terminal(plain)


def test_the_callback_sees_compiled_modules() -> None:
    import torch

    from tuneup.plugins.lightning.introspect import compiled_modules

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.compile(torch.nn.Linear(2, 2)))
    assert compiled_modules(net) == ["1"]
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert compiled_modules(plain) == []
    plain.compile()  # in place
    assert compiled_modules(plain) == [""]


# -- HTML --------------------------------------------------------------------------------------------


def test_html_turns_code_spans_into_code_and_lets_long_reasons_wrap() -> None:
    from tuneup.report.blocks import Bullets, Code, Paragraph, Section, table
    from tuneup.report.html import render_sections_html

    reason = (
        "the interval [-3.8%, +110.0%] includes no gain: run `tuneup advise --measure -- COMMAND` "
        "(short measuring trials) and `<b>x</b>` before trusting a point estimate"
    )
    page = render_sections_html(
        "t",
        "s",
        [
            Section(
                "advice",
                "Advice",
                (
                    Paragraph("compare the runs with `tuneup compare`"),
                    Bullets(("Evidence: `a` and `b`",)),
                    table("Looked at and left alone", ("Knob", "Why not"), [("batch size", reason)]),
                    Code("Apply it", "x = 1  # `kept` as written"),
                ),
            )
        ],
    )

    def code(inside: str) -> str:
        # The backticks stay in the page's text (a record's string is shown verbatim), hidden by the style.
        return f'<code><span class="tick">`</span>{inside}<span class="tick">`</span></code>'

    assert f"<p>compare the runs with {code('tuneup compare')}</p>" in page
    assert f"<li>Evidence: {code('a')} and {code('b')}</li>" in page
    assert code("&lt;b&gt;x&lt;/b&gt;") in page and "<b>x</b>" not in page  # escaped inside code
    assert "<pre><code>x = 1  # `kept` as written</code></pre>" in page  # a code block keeps its backticks
    body = page.split("<body>", 1)[1]
    prose = re.sub(r"<pre>.*?</pre>", "", body, flags=re.S)
    assert "`" not in prose.replace('<span class="tick">`</span>', "")
    # A long reason wraps at word boundaries instead of running off its scrolled table on one line.
    assert '<td class="long">' in page
    css = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert re.search(r"\.scroll td\.long \{[^}]*white-space: normal", css)
    assert "overflow-wrap: anywhere" not in css  # which broke words mid-word
    assert re.search(r"code \.tick \{ display: none; \}", css)


def test_the_callback_names_why_a_fit_that_raised_ended() -> None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from tuneup.plugins.lightning.introspect import exception_stop_reason

    class Trainer:
        received_sigterm = False

    trainer = Trainer()
    assert exception_stop_reason(trainer, KeyboardInterrupt()) == "user_interrupt"
    assert exception_stop_reason(trainer, SIGTERMException()) == "sigterm"  # Lightning's, at the next step
    assert exception_stop_reason(trainer, RuntimeError("node lost")) == "exception"
    trainer.received_sigterm = True  # an exception raised after the signal arrived: the signal is why
    assert exception_stop_reason(trainer, RuntimeError("broken pipe")) == "sigterm"
