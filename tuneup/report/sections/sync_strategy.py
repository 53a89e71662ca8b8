"""Gradient synchronisation strategy: the bytes TuneupDDPStrategy's compression or local SGD sent against an
exact all-reduce, the step time before and after it started, its safeguard's checks and fallbacks
(`sync_strategy.png`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuneup.analyze.model import RunAnalysis, SyncStrategy
from tuneup.analyze.sharding import SHARDED_SYNC, sharding, sharding_name
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Bullets, KeyValues, Metric, Metrics, Paragraph, figures, table
from tuneup.report.format import MISSING, count, fraction_percent, is_number, ms, number, plural, size_bytes
from tuneup.report.plotting import (
    SAMPLES_COLOR,
    STRAGGLER_COLOR,
    TOKENS_COLOR,
    WARMUP_COLOR,
    Drawn,
    Plot,
    bottom_legend,
    enough,
    fmt,
    plain_log_axis,
    xy,
)
from tuneup.report.plotting import figure as new_figure

ID = "sync-strategy"
TITLE = "Gradient synchronisation strategy"

NOT_USED = (
    "Not used: DDP averaged the gradients with an exact all-reduce at every step. TuneupDDPStrategy "
    '(compression="fp16" or "powersgd", or local_sgd_period=H) sends fewer bytes, with a safeguard that falls '
    "back when training suffers."
)


def not_used_sharded(kind: str) -> str:
    """What a sharded run did instead: no DDP all-reduce, and no TuneupDDPStrategy to offer (it wraps DDP)."""
    return (
        f"Not used: the run was sharded with {sharding_name(kind)}: {SHARDED_SYNC}. "
        "TuneupDDPStrategy (compression, local SGD) applies to DDP only."
    )


# Errors spread over more than this factor below their bound are drawn on a log scale: an fp16 error of
# 3e-4 under a bound of 0.95 would otherwise sit on the axis.
LOG_SCALE_SPAN = 30.0
HEADROOM = 1.2


def ratio_text(ratio: float | None) -> str:
    """exact / sent as the reader wants it: "14.7× fewer", or "1.25× more" when the strategy sent more."""
    if not is_number(ratio) or ratio <= 0:
        return MISSING
    return f"{number(ratio, 1)}× fewer" if ratio >= 1 else f"{number(1 / ratio, 2)}× more"


def _change_ms(before: float | None, after: float | None) -> str:
    if not is_number(before) or not is_number(after):
        return MISSING
    change = after - before
    return f"+{ms(change)}" if change > 0 else ms(change)


def _phase(sync: SyncStrategy) -> str:
    if sync.started_at is None:
        return f"{sync.label}, after {count(sync.start_step)} exact steps: it never started."
    text = f"{sync.label}: exact all-reduce for the first {count(sync.started_at)} optimizer steps, then "
    text += "the strategy" if sync.end_step is None else f"the strategy until step {count(sync.end_step)}"
    if sync.hierarchical:
        text += (
            f", hierarchical over {count(sync.nodes)} nodes of {count(sync.ranks_per_node)} ranks: gradients "
            "averaged within each node every step, parameters across nodes at each averaging"
        )
    return text + (f". At the end: {sync.mode_at_end}." if sync.mode_at_end else ".")


def _comparison(sync: SyncStrategy) -> Block:
    rows = [
        (
            "Bytes sent per step",
            size_bytes(sync.exact_bytes_per_step),
            size_bytes(sync.sent_bytes_per_step),
            ratio_text(sync.bytes_ratio),
        )
    ]
    if sync.cross_node_ratio is not None:
        rows.append(
            (
                "Cross-node bytes per step",
                size_bytes(sync.cross_node_exact_bytes_per_step),
                size_bytes(sync.cross_node_sent_bytes_per_step),
                ratio_text(sync.cross_node_ratio),
            )
        )
    if sync.counted_bytes_per_step is not None:
        rows.append(
            (
                "Bytes sent per step, by the strategy's own count",
                size_bytes(sync.exact_bytes_per_step),
                size_bytes(sync.counted_bytes_per_step),
                ratio_text(sync.counted_bytes_ratio),
            )
        )
    rows += [
        (
            "Exposed communication per step",
            ms(sync.exact_exposed_comm_ms),
            ms(sync.strategy_exposed_comm_ms),
            _change_ms(sync.exact_exposed_comm_ms, sync.strategy_exposed_comm_ms),
        ),
        (
            "Step time",
            ms(sync.exact_step_ms),
            ms(sync.strategy_step_ms),
            _change_ms(sync.exact_step_ms, sync.strategy_step_ms),
        ),
        ("Steps timed", count(sync.exact_steps_timed), count(sync.strategy_steps_timed), ""),
    ]
    if sync.averaging_ms is not None:
        # What each side's synchronisation costs where it runs: the all-reduce at every exact step, the
        # parameter average at one local step in H (the other local steps send nothing).
        rows[-1:-1] = [
            ("Gradient all-reduce, each exact step", ms(sync.exact_comm_ms), MISSING, ""),
            ("One parameter average: added to its step", MISSING, ms(sync.averaging_ms), ""),
        ]
    return table(
        "Exact all-reduce against the strategy, per rank and step",
        ("", "Exact (warm-up)", sync.label, "Change"),
        rows,
        numeric=(1, 2, 3),
    )


def _breached(sync: SyncStrategy) -> int:
    return sum(1 for c in sync.checks if c.breached)


def _safeguard(sync: SyncStrategy) -> KeyValues:
    bounds = {c.error_bound for c in sync.checks if is_number(c.error_bound)}
    overhead = size_bytes(sync.check_bytes)
    if sync.check_bytes and is_number(sync.check_overhead_share):
        overhead += (
            f", {fraction_percent(sync.check_overhead_share)} on top of the strategy's bytes (not in the ratio "
            "above); checks grow rarer while they stay clean"
        )
    return KeyValues(
        "Safeguard",
        (
            ("Error measured", f"{sync.error_name}: {sync.error_meaning}"),
            ("Error bound", ", ".join(number(b) for b in sorted(bounds)) or MISSING),
            ("Checks", f"{count(len(sync.checks))}, {count(_breached(sync))} breached"),
            ("Bytes of the checks' exact all-reduces", overhead),
            ("Exact bytes per step from", sync.exact_basis or MISSING),
        ),
    )


def _fallbacks(sync: SyncStrategy) -> Block:
    if not sync.fallbacks:
        breached = _breached(sync)
        why = (
            f"{plural(breached, 'breached check')}, never enough in a row to fall back"
            if breached
            else "every check stayed within its bounds"
        )
        return Paragraph(f"No fallback: {why}.")
    return KeyValues(
        "Fallbacks",
        tuple(
            (f"Step {count(f.step)}: {f.from_mode} → {f.to_mode}", "; ".join(f.reasons) or MISSING)
            for f in sync.fallbacks
        ),
    )


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    sync = analysis.sync_strategy
    if sync is None:
        kind = sharding(analysis.run)
        return [Paragraph(not_used_sharded(kind) if kind else NOT_USED, True)]
    if sync.started_at is None:
        return [Paragraph(_phase(sync)), Bullets(tuple(sync.notes))]
    headline = [Metric("Bytes per step", ratio_text(sync.bytes_ratio), "than an exact all-reduce")]
    if sync.cross_node_ratio is not None:
        headline.append(
            Metric("Cross-node bytes", ratio_text(sync.cross_node_ratio), "per step, against exact")
        )
    saved = sync.time_saved_ms_per_step
    headline.append(
        Metric(
            "Time saved per step",
            ms(saved),
            "measured in this run, warm-up against strategy steps"
            + (": it cost time" if is_number(saved) and saved < 0 else ""),
        )
    )
    out: list[Block] = [
        Paragraph(_phase(sync)),
        Metrics(tuple(headline)),
        _comparison(sync),
        _fallbacks(sync),
        _safeguard(sync),
    ]
    if sync.notes:
        out.append(Bullets(tuple(sync.notes)))
    return out + figures(ID, plots)


def _draw(analysis: RunAnalysis) -> Drawn | None:
    sync = analysis.sync_strategy
    if sync is None:
        return None
    steps = [c.step for c in sync.checks]
    errors = xy(steps, [c.error for c in sync.checks])
    losses = xy(steps, [c.loss for c in sync.checks])
    if not enough(errors[0]) and not enough(losses[0]):
        return None
    fig, (ax,) = new_figure()
    handles: list[Any] = []
    if sync.started_at:
        handles.append(
            ax.axvspan(0, sync.started_at, color=WARMUP_COLOR, alpha=0.7, lw=0, label="exact warm-up")
        )
    handles += ax.plot(
        *errors, color=SAMPLES_COLOR, marker="o", ms=4, label=f"{sync.error_name} at each check"
    )
    breached = xy([c.step for c in sync.checks if c.breached], [c.error for c in sync.checks if c.breached])
    if breached[0]:
        handles += ax.plot(
            *breached,
            ls="",
            marker="o",
            ms=7,
            mfc="none",
            mec=STRAGGLER_COLOR,
            mew=1.5,
            label="breached check",
        )
    bounds = sorted({c.error_bound for c in sync.checks if is_number(c.error_bound)})
    for bound in bounds:
        handles.append(ax.axhline(bound, color="black", lw=1.0, ls="--", label=f"bound {fmt(bound)}"))
    positive = [e for e in errors[1] if e > 0]
    log = bool(positive and bounds and min(positive) < max(bounds) / LOG_SCALE_SPAN)
    # Headroom above the highest point and the bound, for the fallbacks' labels.
    top = max([*errors[1], *bounds], default=1.0)
    if log:
        ax.set_yscale("log")
        plain_log_axis(ax)
        ax.set_ylim(top=top * HEADROOM**4)
    else:
        ax.set_ylim(0, top * HEADROOM)
    right = max([*errors[0], *losses[0], *(f.step for f in sync.fallbacks), sync.steps or 0])
    ax.set_xlim(0, right * 1.02)
    for f in sync.fallbacks:
        handles.append(ax.axvline(f.step, color=STRAGGLER_COLOR, lw=1.4, label="fallback"))
        # Beside the line, on the side with room for the words.
        before = f.step > 0.6 * right
        ax.annotate(
            f"fell back to {f.to_mode}",
            xy=(f.step, 0.98),
            xycoords=("data", "axes fraction"),
            xytext=(-5 if before else 5, 0),
            textcoords="offset points",
            ha="right" if before else "left",
            va="top",
            fontsize=8.5,
            color=STRAGGLER_COLOR,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
        )
    ax.set_xlabel("optimizer steps taken")
    ax.set_ylabel(sync.error_name + (" (log scale)" if log else ""))
    if losses[0]:
        ax2 = ax.twinx()
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        handles += ax2.plot(
            *losses, color=TOKENS_COLOR, marker="s", ms=3, lw=0.9, label="mean loss since the previous check"
        )
        ax2.set_ylabel("training loss", color=TOKENS_COLOR)
        low, high = min(losses[1]), max(losses[1])
        if high > low:
            ax2.set_ylim(low - 0.05 * (high - low), high + 0.3 * (high - low))
    title = f"{sync.label}: the safeguard's checks"
    ax.set_title(title)
    bottom_legend(fig, handles)
    return Drawn(
        fig,
        title,
        f"The {sync.error_name} at each check ({sync.error_meaning}) against its bound (dashed), and the mean "
        "training loss since the previous check (pink, right axis). The grey span is the exact warm-up"
        + ("; a red line marks each fallback." if sync.fallbacks else "."),
    )


PLOTS: tuple[Plot, ...] = (Plot("sync_strategy.png", _draw),)
