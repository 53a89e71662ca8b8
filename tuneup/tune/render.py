"""What a tuning session found, as a report (`tune.html`, `tune.md`, `tune-report.json`) and as the lines
`tuneup tune` prints when it ends.

Three sections, in the report's format-neutral blocks (tuneup.report.blocks), so that the HTML page, the
Markdown and the terminal say the same thing:

  Result             the winner, what it changes, its measured gain with the interval and the compare
                     verdict, or, where the current settings were kept, why
  Settings to apply  the winner's changed settings as a LightningCLI YAML fragment and as Python
  Trials             every trial: settings, status, figures, the search's prediction; and a plot of the
                     predicted objective against the measured one

The search ranks by a rate (higher is better: tuneup.tune.objective); every figure shown here is the
objective's own (`Objective.figure`): hours and dollars for `time` and `cost`, where lower is better.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuneup._log import logger
from tuneup._version import __version__
from tuneup.advise.code import dataloader_args, ddp_strategy, trainer_args
from tuneup.report import format as fmt
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Bullets, Code, Figure, KeyValues, Paragraph, Section, table
from tuneup.tune import knobs as registry
from tuneup.tune.objective import Objective, ObjectiveError
from tuneup.tune.space import Config, SpaceError
from tuneup.tune.state import (
    FAILED,
    INFEASIBLE,
    OK,
    TRIALS_DIR,
    TUNE_FILE,
    Prediction,
    Trial,
    TuneState,
    TuneStateError,
    finite,
    load_state,
)

HTML_NAME = "tune.html"
MD_NAME = "tune.md"
JSON_NAME = "tune-report.json"
PLOT_NAME = "tune_predicted_vs_measured.png"
REPORT_DIR = "report"  # the default output: TUNE_DIR/report

RESULT_ID, SETTINGS_ID, TRIALS_ID = "result", "settings", "trials"

# A failure's reason in a table cell (the whole reason is listed under the table, and in output.log).
STATUS_CHARS = 28
REASON_CHARS = 300


def knob_title(name: str) -> str:
    """A knob's name for people ("batch size per rank"); a knob this tuneup does not know, as it is."""
    entry = registry.knob(name)
    return entry.title if entry is not None else name


# ---------------------------------------------------------------------------------------------------
# Reading the session.


def objective_of(state: TuneState) -> Objective:
    """The session's objective with its target (from the options the session was started with)."""
    options = state.options
    try:
        return Objective(
            state.objective,
            target_samples=options.get("target_samples"),
            target_tokens=options.get("target_tokens"),
            target_steps=options.get("target_steps"),
        )
    except ObjectiveError as exc:
        raise TuneStateError(f"{TUNE_FILE}: its objective cannot be read ({exc})") from None


def _figure(objective: Objective, rate: float | None) -> float | None:
    """A rate as the objective's figure; None where there is none (a time or cost at rate 0 is no figure)."""
    if not fmt.is_number(rate):
        return None
    if not objective.higher_is_better and rate <= 0:
        return None
    value = objective.figure(rate)
    return value if fmt.is_number(value) else None


def predicted_figures(
    objective: Objective, predicted: Prediction | None
) -> tuple[float, float, float] | None:
    """(value, low, high) of a prediction in the objective's unit, low <= high: for time and cost the
    figure falls as the rate rises, so the rate's high end is the figure's low end."""
    if predicted is None:
        return None
    value = _figure(objective, predicted.value)
    ends = [
        f for f in (_figure(objective, predicted.low), _figure(objective, predicted.high)) if f is not None
    ]
    if value is None:
        return None
    low = min([value, *ends])
    high = max([value, *ends])
    return value, low, high


def winner_of(state: TuneState) -> Config | None:
    result = state.result or {}
    winner = result.get("winner")
    if not isinstance(winner, Mapping):
        return None
    try:
        return Config.from_dict(winner)
    except (SpaceError, TypeError) as exc:
        raise TuneStateError(f"{TUNE_FILE}: its result names an unknown setting ({exc})") from None


def best_trial_of(state: TuneState) -> Trial | None:
    index = (state.result or {}).get("best_trial")
    return next((t for t in state.trials if t.index == index), None)


def _kept_current(state: TuneState) -> bool:
    return bool((state.result or {}).get("kept_current"))


def _changes(state: TuneState) -> dict[str, tuple[Any, Any]]:
    """What the session says to change: nothing where it kept the current settings or has no result."""
    baseline, winner = state.baseline, winner_of(state)
    if baseline is None or winner is None or _kept_current(state):
        return {}
    return winner.changes_from(baseline.config)


def _changes_text(changes: Mapping[str, tuple[Any, Any]]) -> str:
    return "; ".join(
        f"{knob_title(k)} {fmt.text(old)} → {fmt.text(new)}" for k, (old, new) in changes.items()
    )


def _verdict(result: Mapping[str, Any]) -> str | None:
    verdict = result.get("verdict")
    return str(verdict).lower() if verdict else None


def gain_text(objective: Objective, result: Mapping[str, Any]) -> str | None:
    """The measured change of the objective's figure with its interval: "throughput +18.2% [+9.8%, +25.0%]".

    The session's gain is the ratio of the rates' geometric means - 1 (the figure the verdict's test tests;
    sessions saved before said the ratio of medians); for time and cost (lower is better) the figure
    changes by 1 / (1 + gain) - 1, and the interval's ends swap."""
    gain = result.get("gain")
    if not fmt.is_number(gain) or gain <= -1:
        return None
    low, high = result.get("gain_low"), result.get("gain_high")
    ends: list[float] = [v for v in (low, high) if fmt.is_number(v) and v > -1]
    if objective.higher_is_better:
        change = gain
    else:
        change = 1.0 / (1.0 + gain) - 1.0
        ends = [1.0 / (1.0 + v) - 1.0 for v in ends]
    out = f"{objective.name} {change:+.1%}"
    if len(ends) == 2:
        a, b = sorted(ends)
        out += f" [{a:+.1%}, {b:+.1%}]"
    return out


def _interval_note(result: Mapping[str, Any]) -> str:
    """What the gain's interval is: as the session stored it; a session saved before it stored that had
    the bootstrap interval of the ratio of medians."""
    # Those sessions used the compare rule's confidence of the time, 95%.
    return str(result.get("gain_interval") or "95% bootstrap interval of the ratio of medians")


def _plain(value: object) -> str:
    """One line without control characters: a terminal escape in a recorded reason (a script's output, an
    exception message) must not reach the user's terminal."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())


def _period(text: str) -> str:
    """A clause closed as a sentence, its first letter left alone (it often follows a colon)."""
    text = text.strip()
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _short(value: object, limit: int) -> str:
    """`_plain`, cut to at most `limit` characters."""
    out = _plain(value)
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


# ---------------------------------------------------------------------------------------------------
# The settings as code.


class _Expression(str):
    """A Python expression that `trainer_args` writes as it stands (its repr is itself, not a quoted str)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _split_code(code: str) -> tuple[list[str], list[str]]:
    """(import lines, other lines) of a snippet from tuneup.advise.code."""
    lines = [line for line in code.splitlines() if line.strip()]
    imports = [line for line in lines if line.startswith(("from ", "import "))]
    return imports, [line for line in lines if line not in imports]


def _commented(lines: list[str], comments: Sequence[str]) -> list[str]:
    """The knobs' comments at the end of the last line of their Python."""
    if comments and lines:
        lines[-1] += "  # " + "; ".join(comments)
    return lines


def settings_code(changes: Mapping[str, Any], namespace: str | None = None) -> tuple[str, str] | None:
    """(YAML, Python) that apply the knob values in `changes` (knob -> new value), or None for no change.
    Each knob says its own code (tuneup.tune.knobs: DataLoader, Trainer or DDPStrategy arguments).

    The YAML is a LightningCLI config fragment (`data:` keys are the DataModule's init arguments, as
    LightningCLI passes them); the Python shows the DataLoader and Trainer arguments."""
    parts = [k.code(changes[k.name]) for k in registry.knobs() if k.name in changes]
    if not parts:
        return None
    imports: list[str] = []
    body: list[str] = []
    yaml_parts: list[str] = []
    loader = {name: value for p in parts for name, value in p.dataloader.items()}
    if loader:
        python, yaml = dataloader_args(loader)
        more, lines = _split_code(python)
        imports += more
        body += _commented(lines, [p.comment for p in parts if p.dataloader and p.comment])
        yaml_parts.append(yaml)
    trainer: dict[str, object] = {name: value for p in parts for name, value in p.trainer.items()}
    trainer_comments = [p.comment for p in parts if p.trainer and p.comment]
    trainer_yaml = trainer_args(namespace, trainer)[1].splitlines()[1:] if trainer else []
    notes = [line for p in parts for line in p.notes]
    ddp_kwargs = {name: value for p in parts for name, value in p.ddp.items()}
    if ddp_kwargs:
        python, yaml = ddp_strategy(namespace, ddp_kwargs)
        imports += _split_code(python)[0]
        trainer_yaml += yaml.splitlines()[1:]
        shown = ", ".join(f"{k}={v}" for k, v in ddp_kwargs.items())
        trainer["strategy"] = _Expression(f"DDPStrategy({shown})")
    elif any(p.ddp_strategy for p in parts):  # DDP itself, without arguments
        trainer["strategy"] = "ddp"
        trainer_yaml += trainer_args(namespace, {"strategy": "ddp"})[1].splitlines()[1:]
    if trainer:
        more, lines = _split_code(trainer_args(namespace, trainer)[0])
        imports += more
        body += _commented(lines, trainer_comments)
        yaml_parts.append("\n".join(["trainer:", *trainer_yaml]))
    yaml_text = "\n".join([*yaml_parts, *dict.fromkeys(p.yaml_note for p in parts if p.yaml_note)])
    ordered = sorted(dict.fromkeys(imports), key=lambda line: (line.split()[1].startswith("torch"), line))
    python_text = "\n".join([*ordered, "", *body, *notes])
    return yaml_text, python_text


# ---------------------------------------------------------------------------------------------------
# Blocks.

TRIAL_HEADER_FIXED = ("#", "Role", "Settings", "Status", "Steps", "Step (ms)", "Samples/s")
TRIAL_NUMERIC = frozenset({0, 4, 5, 6, 7, 8, 9})


def trial_header(objective: Objective) -> tuple[str, ...]:
    return (
        *TRIAL_HEADER_FIXED,
        f"Objective ({objective.unit})",
        f"Predicted ({objective.unit})",
        "Wall (s)",
    )


def _value(value: float | None) -> str:
    """An objective's figure to three significant digits at least, so that a column reads alike: 1,260,
    57.1, 1.00, 0.893 (hours and dollars are often below one)."""
    if value is None or not fmt.is_number(value):
        return fmt.MISSING
    if value == 0 or abs(value) >= 100:
        return fmt.number(value, 0)
    return f"{value:.{2 - math.floor(math.log10(abs(value)))}f}"


def _status(trial: Trial) -> str:
    if trial.status == OK:
        return "ok" if trial.objective is not None else "ok, no objective"
    if trial.reason:
        return f"{trial.status}: {_short(trial.reason, STATUS_CHARS)}"
    return trial.status


def _role(trial: Trial, state: TuneState) -> str:
    best = (state.result or {}).get("best_trial")
    if trial.role == "search" and trial.index == best:
        return "search, best" if _kept_current(state) else "search, winner"
    return trial.role


def trial_rows(state: TuneState, objective: Objective) -> list[tuple[str, ...]]:
    """One row per trial, as `trial_header` names the columns."""
    rows = []
    for t in state.trials:
        predicted = predicted_figures(objective, t.predicted)
        rows.append(
            (
                str(t.index),
                _role(t, state),
                t.config.label(),
                _status(t),
                fmt.number(t.steps) if t.steps is not None else fmt.MISSING,
                fmt.number(t.step_ms) if t.step_ms is not None else fmt.MISSING,
                fmt.number(t.samples_per_s) if t.samples_per_s is not None else fmt.MISSING,
                _value(_figure(objective, t.objective)) if t.measured else fmt.MISSING,
                (
                    f"{_value(predicted[0])} [{_value(predicted[1])}, {_value(predicted[2])}]"
                    if predicted
                    else fmt.MISSING
                ),
                fmt.number(t.wall_s, 1) if t.wall_s else fmt.MISSING,
            )
        )
    return rows


def _trial_counts(state: TuneState) -> str:
    roles = {"baseline": 0, "search": 0, "confirm": 0}
    for t in state.trials:
        roles[t.role] = roles.get(t.role, 0) + 1
    failed = sum(t.status == FAILED for t in state.trials)
    infeasible = sum(t.status == INFEASIBLE for t in state.trials)
    parts = [
        f"{roles['baseline']} baseline",
        f"{roles['search']} search",
        f"{roles['confirm']} confirmation",
    ]
    out = f"{len(state.trials)} ({', '.join(parts)})"
    bad = [f"{failed} failed"] if failed else []
    if infeasible:
        bad.append(f"{infeasible} out of memory")
    if bad:
        out += f"; {', '.join(bad)}"
    wall = sum(t.wall_s for t in state.trials)
    if wall > 0:
        out += f"; {fmt.duration(wall)} of training"
    return out


def _rates_text(objective: Objective, rates: Iterable[Any]) -> str:
    figures = [_figure(objective, r) for r in rates]
    return " / ".join(_value(f) for f in figures) or fmt.MISSING


def _result_blocks(state: TuneState, objective: Objective) -> list[Block]:
    result = state.result
    baseline = state.baseline
    out: list[Block] = []
    if result is None:
        out.append(
            Paragraph(
                "No result yet: the session ended before it chose a winner. Continue it with "
                "`tuneup tune --resume TUNE_DIR`.",
                quiet=True,
            )
        )
    else:
        best = best_trial_of(state)
        verdict, reason = _verdict(result), result.get("reason") or ""
        gain = gain_text(objective, result)
        if _kept_current(state):
            if verdict is not None and best is not None and baseline is not None and best is not baseline:
                why = (
                    f"The best search trial, #{best.index} ({best.config.label()}), was run again beside "
                    f"your settings and the comparison gave the verdict {verdict}: {reason}"
                )
                out.append(
                    Paragraph(
                        "Keep your current settings: no configuration was shown to be better than them. "
                        + _period(why)
                    )
                )
            else:
                why = reason or "no configuration measured better than your current settings"
                out.append(Paragraph(f"Keep your current settings: {_period(why)}"))
        else:
            winner = winner_of(state)
            label = winner.label() if winner is not None else fmt.MISSING
            gain_part = f" measured {gain} over your current settings" if gain else ""
            out.append(
                Paragraph(
                    f"Apply {label} (trial #{best.index if best else '?'}):{gain_part}; the confirmation runs "
                    f"gave the verdict {verdict or 'none'}: {_period(reason)}"
                )
            )
        pairs: list[tuple[str, str]] = [("Objective", objective.describe())]
        changes = _changes(state)
        if not _kept_current(state):
            winner = winner_of(state)
            pairs.append(
                (
                    "Winner",
                    f"{winner.label() if winner else fmt.MISSING} (trial #{best.index if best else '?'})",
                )
            )
            pairs.append(("Changes", _changes_text(changes) or "none"))
        elif best is not None and baseline is not None and best is not baseline:
            pairs.append(("Best candidate (not adopted)", f"{best.config.label()} (trial #{best.index})"))
        if gain:
            pairs.append(("Measured gain", f"{gain} ({_interval_note(result)})"))
        if verdict:
            pairs.append(("Verdict", verdict))  # its reason is the paragraph above
        if result.get("baseline_rates") or result.get("winner_rates"):
            pairs.append(
                (
                    f"Confirmation runs ({objective.unit})",
                    f"your settings {_rates_text(objective, result.get('baseline_rates') or ())}; "
                    f"candidate {_rates_text(objective, result.get('winner_rates') or ())}",
                )
            )
        out.append(KeyValues("", tuple(pairs)))
    pairs = [
        ("Command", shlex.join(state.command)),
        ("Trials run", _trial_counts(state)),
        ("Search stopped", state.stopped_because or fmt.MISSING),
    ]
    cut = (state.result or {}).get("confirmation_cut")
    if cut:
        pairs.append(("Confirmation", cut))
    if baseline is not None:
        pairs.insert(1, ("Your settings (baseline)", f"{baseline.config.label()} (trial #{baseline.index})"))
    if state.space is not None:
        tuned = state.space.tuned()
        pairs.append(("Knobs searched", ", ".join(knob_title(k) for k in tuned) or "none"))
    out.append(KeyValues("Session", tuple(pairs)))
    if state.dropped:
        out.append(Paragraph("Knobs dropped from the search:"))
        out.append(Bullets(tuple(f"{knob_title(k)}: {why}" for k, why in state.dropped.items())))
    return out


def _global_batch_note(state: TuneState, changes: Mapping[str, tuple[Any, Any]]) -> str | None:
    baseline, winner = state.baseline, winner_of(state)
    if baseline is None or winner is None or not {"batch_size", "accumulate_grad_batches"} & set(changes):
        return None
    ranks = baseline.observation.world_size if baseline.observation is not None else None
    if ranks is None:
        return None
    before = baseline.config.global_batch(ranks)
    after = winner.over(baseline.config).global_batch(ranks)
    if before is None or after is None or before == after:
        return None
    return (
        f"The global batch changes from {before:,} to {after:,} samples per optimizer step (batch x "
        f"accumulation x {fmt.plural(ranks, 'rank')}): check the learning rate and its schedule, which were chosen "
        f"for {before:,}."
    )


def _settings_blocks(state: TuneState) -> list[Block]:
    if state.result is None:
        return [Paragraph("Nothing to apply until the session has chosen a winner.", quiet=True)]
    if _kept_current(state):
        return [
            Paragraph(
                "Nothing to change: keep your current settings. No configuration tried was shown to be "
                "better than them, so there is no code to apply."
            )
        ]
    changes = _changes(state)
    code = settings_code({k: new for k, (_old, new) in changes.items()}, state.options.get("namespace"))
    if code is None:
        return [Paragraph("The winner has the same settings as your current ones: nothing to change.")]
    yaml_text, python_text = code
    out: list[Block] = [
        Paragraph(
            f"Only what differs from your current settings: {_changes_text(changes)}. The batch size is per "
            "rank (each process's DataLoader); in the YAML, the data: keys are your DataModule's init "
            "arguments, as LightningCLI passes them."
        )
    ]
    note = _global_batch_note(state, changes)
    if note:
        out.append(Paragraph(note))
    out.append(Code("In a LightningCLI config", yaml_text, "yaml"))
    overrides = cli_overrides(state, {k: new for k, (_old, new) in changes.items()})
    if overrides:
        out.append(Code("Or on your LightningCLI command line (the keys the tuner used)", overrides, "bash"))
    out.append(Code("Or in Python", python_text, "python"))
    return out


def cli_overrides(state: TuneState, changes: Mapping[str, Any]) -> str | None:
    """The winner as the command-line overrides the trials used, for a LightningCLI script: the keys come
    from its resolved config (data.batch_size, data.init_args.batch_size, model.batch_size...)."""
    keys = state.options.get("cli_overrides") or {}
    parts = [f"--{keys[k]}={v}" for k, v in changes.items() if k in keys]
    return " ".join(parts) or None


def _trials_blocks(state: TuneState, objective: Objective, plots: Sequence[PlotFile]) -> list[Block]:
    if not state.trials:
        return [Paragraph("No trial has run yet.", quiet=True)]
    direction = "higher" if objective.higher_is_better else "lower"
    out: list[Block] = [
        Paragraph(
            f"Every trial in the order it ran. Objective: {objective.describe()}, {direction} is better; "
            "Predicted is what the search expected before running the trial, with its interval."
        ),
        table("", trial_header(objective), trial_rows(state, objective), TRIAL_NUMERIC),
    ]
    failures = failure_lines(state)
    if failures:
        out.append(Paragraph("Why trials did not finish (the whole output is in the trial's output.log):"))
        out.append(Bullets(tuple(failures)))
    out.extend(Figure(p) for p in plots if p.section == TRIALS_ID)
    return out


def failure_lines(state: TuneState) -> list[str]:
    """One line per trial that failed or ran out of memory: its reason, and where its output is."""
    return [
        f"#{t.index} {t.config.label()}: {_short(t.reason, REASON_CHARS)} ({TRIALS_DIR}/{t.name}/output.log)"
        for t in state.trials
        if t.status in (FAILED, INFEASIBLE) and t.reason
    ]


def tune_sections(state: TuneState, plots: Sequence[PlotFile] = ()) -> list[Section]:
    """The report of a tuning session as blocks: Result, Settings to apply, Trials (with `plots` whose
    section is "trials")."""
    objective = objective_of(state)
    return [
        Section(RESULT_ID, "Result", tuple(_result_blocks(state, objective))),
        Section(SETTINGS_ID, "Settings to apply", tuple(_settings_blocks(state))),
        Section(TRIALS_ID, "Trials", tuple(_trials_blocks(state, objective, plots))),
    ]


# ---------------------------------------------------------------------------------------------------
# The plot.

_POINT_COLOR = "#0072B2"
_BASELINE_COLOR = "#009E73"
_FAILED_COLOR = "#D55E00"


def plot_predicted_vs_measured(state: TuneState, out_dir: Path) -> PlotFile | None:
    """The search's predictions against the measurements, as a PNG in `out_dir`; None where no search trial
    has both (or drawing fails: the report goes on without the figure)."""
    objective = objective_of(state)
    points: list[tuple[int, float, float, float, float]] = []  # index, predicted, low, high, measured
    failed: list[tuple[int, float]] = []  # index, predicted
    for t in state.trials:
        predicted = predicted_figures(objective, t.predicted)
        if t.role != "search" or predicted is None:
            continue
        measured = _figure(objective, t.objective) if t.measured else None
        if measured is not None:
            points.append((t.index, *predicted, measured))
        elif t.status in (FAILED, INFEASIBLE):
            failed.append((t.index, predicted[0]))
    if not points:
        return None
    baseline = state.baseline
    base = _figure(objective, baseline.objective) if baseline is not None and baseline.measured else None
    path = Path(out_dir) / PLOT_NAME
    try:
        title = _draw(objective, points, failed, base, path)
    except Exception as exc:  # a figure must not cost the user the report
        logger.warning("tuneup: plot %s was not drawn: %s: %s", PLOT_NAME, type(exc).__name__, exc)
        path.unlink(missing_ok=True)
        return None
    better = "higher" if objective.higher_is_better else "lower"
    caption = (
        f"Each search trial's predicted {objective.name} (x, with the interval the search predicted) against "
        f"the measured one (y), labelled with the trial's number; on the dashed diagonal the prediction was "
        f"exact, and {better} is better. The green line is your current settings (the baseline); an x on "
        "the bottom edge is a trial that failed or ran out of memory, at its predicted value."
    )
    return PlotFile(PLOT_NAME, path, title, TRIALS_ID, caption)


def _draw(
    objective: Objective,
    points: list[tuple[int, float, float, float, float]],
    failed: list[tuple[int, float]],
    base: float | None,
    path: Path,
) -> str:
    import matplotlib
    import matplotlib.style

    from tuneup.report import plotting

    unit = objective.unit
    title = f"Predicted vs measured {objective.name}"
    with matplotlib.rc_context(), matplotlib.style.context(["default", plotting.STYLE]):
        fig, (ax,) = plotting.figure(height_px=560)
        xs = [p[1] for p in points]
        ys = [p[4] for p in points]
        xerr = [[max(0.0, p[1] - p[2]) for p in points], [max(0.0, p[3] - p[1]) for p in points]]
        values = [*ys, *xs, *(f[1] for f in failed)]
        if base is not None:
            values.append(base)
        # The axes span the points, and the intervals only as far as half as much again: one wide interval
        # (a first trial predicted from the baseline alone) would squeeze every point into a corner; the
        # error bars that reach further run off the axes.
        core_low, core_high = min(values), max(values)
        ends = [e for p in points for e in (p[2], p[3])]
        values += [e for e in ends if core_low - 0.5 * (core_high - core_low) <= e <= core_high * 1.5]
        low, high = min(values), max(values)
        pad = (high - low) * 0.08 or abs(high) * 0.1 or 1.0
        low, high = low - pad, high + pad
        if min(values) >= 0:
            low = max(low, 0.0)  # padding must not invent negative rates, hours or dollars
        handles = []
        handles.append(
            ax.plot([low, high], [low, high], ls="--", color="#888888", lw=1, label="measured = predicted")[0]
        )
        if base is not None:
            handles.append(
                ax.axhline(
                    base,
                    color=_BASELINE_COLOR,
                    lw=1.5,
                    label=f"your settings: {plotting.fmt(base)} {unit}",
                )
            )
        bars = ax.errorbar(
            xs,
            ys,
            xerr=xerr,
            fmt="o",
            color=_POINT_COLOR,
            ecolor="#7FB3D9",
            elinewidth=2,
            capsize=4,
            markersize=6,
            zorder=3,
            label="search trial, predicted interval",
        )
        handles.append(bars)
        for index, x, _lo, _hi, y in points:
            ax.annotate(
                f"#{index}", (x, y), textcoords="offset points", xytext=(6, 5), fontsize=9, color="#1f2328"
            )
        if failed:
            bottom = low + (high - low) * 0.02
            handles.append(
                ax.scatter(
                    [f[1] for f in failed],
                    [bottom] * len(failed),
                    marker="x",
                    s=60,
                    linewidths=2,
                    color=_FAILED_COLOR,
                    zorder=4,
                    label="failed / out of memory",
                )
            )
            for index, x in failed:
                ax.annotate(
                    f"#{index}",
                    (x, bottom),
                    textcoords="offset points",
                    xytext=(6, 4),
                    fontsize=9,
                    color=_FAILED_COLOR,
                )
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal", adjustable="box")
        if high >= 10_000:
            ax.xaxis.set_major_formatter(plotting.rate_formatter())
            ax.yaxis.set_major_formatter(plotting.rate_formatter())
        ax.set_xlabel(f"predicted {objective.name} ({unit})")
        ax.set_ylabel(f"measured {objective.name} ({unit})")
        ax.set_title(f"{title} ({'higher' if objective.higher_is_better else 'lower'} is better)")
        # Beside the axes, in space the layout reserves: the square axes leave none inside for it.
        fig.legend(handles=handles, loc="outside right upper")
        plotting.save(fig, path)
    return title


# ---------------------------------------------------------------------------------------------------
# The files.


def rendered_summary(state: TuneState) -> dict[str, Any]:
    """What the report says, in figures: the objective, the winner and its code, each trial's figure."""
    objective = objective_of(state)
    result = state.result or {}
    changes = _changes(state)
    code = settings_code({k: new for k, (_old, new) in changes.items()}, state.options.get("namespace"))
    best = best_trial_of(state)
    winner = winner_of(state)
    return {
        "objective": {
            "name": objective.name,
            "description": objective.describe(),
            "unit": objective.unit,
            "higher_is_better": objective.higher_is_better,
        },
        "decided": state.result is not None,
        "kept_current": _kept_current(state),
        "winner": None if winner is None else {"label": winner.label(), "settings": winner.as_dict()},
        "best_trial": None if best is None else best.index,
        "changes": {k: {"current": old, "new": new} for k, (old, new) in changes.items()},
        "gain": gain_text(objective, result),
        "verdict": _verdict(result),
        "reason": result.get("reason"),
        "settings": None if code is None else {"yaml": code[0], "python": code[1]},
        "trials": [
            {
                "index": t.index,
                "name": t.name,
                "role": t.role,
                "label": t.config.label(),
                "status": t.status,
                "objective": _figure(objective, t.objective) if t.measured else None,
                "predicted": (
                    dict(zip(("value", "low", "high"), p, strict=True))
                    if (p := predicted_figures(objective, t.predicted))
                    else None
                ),
            }
            for t in state.trials
        ],
    }


def _page_title(state: TuneState) -> str:
    return f"tuneup tune: {state.objective}"


def _page_subtitle(state: TuneState) -> str:
    baseline = state.baseline
    parts = [fmt.plural(len(state.trials), "trial"), f"started {fmt.unix_time(state.created_unix)}"]
    if baseline is not None and baseline.observation is not None:
        parts.insert(0, fmt.plural(baseline.observation.world_size, "rank"))
    return " · ".join(parts)


CONVERGENCE_ID = "convergence"


def convergence_check_of(state: TuneState, tune_dir: Path) -> Any:
    """Where the objective is time or $ to a target and the baseline's trial recorded a quality target's
    curve (TuneupCallback(target=...) records one with each trial), how the goodput model's steps to it
    stand against that curve and the best trial's (tuneup.advise.convergence.ConvergenceCheck); None
    otherwise, and None where a trial's record cannot be read: the report goes on without it."""
    if objective_of(state).name not in ("time", "cost"):
        return None
    trials = [t for t in (state.baseline, best_trial_of(state)) if t is not None and t.run_dir]
    unique = list({t.run_dir: t for t in trials}.values())
    if not unique or unique[0] is not state.baseline:
        return None
    try:
        from tuneup.advise.convergence import convergence_check
        from tuneup.report import analyze

        analyses = [analyze(tune_dir / str(t.run_dir)) for t in unique]
        return convergence_check(analyses)
    except Exception as exc:  # a trial's record gone or damaged: the statement is left out (debug log)
        logger.debug("tune report: no convergence check (%s: %s)", type(exc).__name__, exc)
        return None


def _convergence_section(check: Any) -> Section:
    return Section(
        CONVERGENCE_ID,
        "Goodput model against the recorded curve",
        (Bullets(tuple(check.lines)),),
    )


def _footer(tune_dir: Path) -> str:
    return f"Generated {fmt.unix_time(time.time())} by tuneup {__version__} from {tune_dir / TUNE_FILE}."


def write_tune_report(
    tune_dir: Path, out_dir: Path | None = None, formats: str | Iterable[str] = "html,md,json"
) -> list[Path]:
    """Write the session's report into `out_dir` (default TUNE_DIR/report): tune.html, tune.md with its PNG
    beside it, and tune-report.json (the session as tune.json holds it, and under "rendered" what the report
    says). Returns the files written.

    Raises TuneStateError for a directory that holds no readable session, and tuneup.report.ReportError for
    an unknown format or an output directory that cannot be written. Files are rendered into a scratch
    directory and moved into place only when all of them succeeded."""
    from tuneup.report import json_text, parse_formats, publish

    wanted = parse_formats(formats)
    tune_dir = Path(tune_dir)
    state = load_state(tune_dir)
    target = Path(out_dir) if out_dir is not None else tune_dir / REPORT_DIR

    def render(scratch: Path) -> list[str]:
        names: list[str] = []
        plots: list[PlotFile] = []
        if "html" in wanted or "md" in wanted:
            plot = plot_predicted_vs_measured(state, scratch)
            if plot is not None:
                plots.append(plot)
                names.append(plot.name)
            else:  # an older figure in the same folder would look current
                (target / PLOT_NAME).unlink(missing_ok=True)
        sections = tune_sections(state, plots)
        check = convergence_check_of(state, tune_dir)
        if check is not None:
            sections.append(_convergence_section(check))
        title, subtitle, footer = _page_title(state), _page_subtitle(state), _footer(tune_dir)
        if "json" in wanted:
            document = {**state.as_dict(), "rendered": rendered_summary(state)}
            if check is not None:
                from tuneup.analyze.model import to_json

                document["convergence_check"] = to_json(check)
            (scratch / JSON_NAME).write_text(json_text(finite(document)), encoding="utf-8")
            names.append(JSON_NAME)
        if "md" in wanted:
            from tuneup.report.markdown import render_sections_markdown

            text = render_sections_markdown(title, subtitle, sections, footer)
            (scratch / MD_NAME).write_text(text, encoding="utf-8")
            names.append(MD_NAME)
        if "html" in wanted:
            from tuneup.report.html import render_sections_html

            text = render_sections_html(title, subtitle, sections, footer)
            (scratch / HTML_NAME).write_text(text, encoding="utf-8")
            names.append(HTML_NAME)
        return names

    return publish(target, "the tuning report", render)


# ---------------------------------------------------------------------------------------------------
# The terminal.


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int]) -> list[str]:
    return fmt.aligned_table(header, ([_plain(v) for v in row] for row in rows), numeric)


def _indented(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + line if line else "" for line in text.splitlines()]


def format_tune_text(state: TuneState, tune_dir: Path | None = None) -> str:
    """The session's summary for the terminal: the trials table, the winner with its gain and verdict, and
    the settings to apply (or the sentence that says to keep the current ones); with `tune_dir`, the goodput
    model against the recorded curve where there is one (convergence_check_of). No trailing newline."""
    text = _tune_text(state)
    check = convergence_check_of(state, tune_dir) if tune_dir is not None else None
    return text if check is None else "\n".join([text, "", *check.lines])


def _tune_text(state: TuneState) -> str:
    objective = objective_of(state)
    lines = [f"tuneup tune: {objective.describe()}, {_trial_counts(state)}"]
    if state.stopped_because:
        lines.append(f"search stopped: {_plain(state.stopped_because)}")
    cut = (state.result or {}).get("confirmation_cut")
    if cut:
        lines.append(_plain(cut))
    for knob, why in state.dropped.items():
        lines.append(f"dropped {knob_title(knob)}: {_plain(why)}")
    if state.trials:
        lines.append("")
        rows = trial_rows(state, objective)
        lines.extend(_aligned(trial_header(objective), rows, TRIAL_NUMERIC))
        failures = failure_lines(state)
        if failures:
            lines.append("")
            lines.extend(f"  {line}" for line in failures)
    lines.append("")
    result = state.result
    if result is None:
        lines.append("no result yet: continue the session with `tuneup tune --resume TUNE_DIR`")
        return "\n".join(lines)
    verdict, reason = _verdict(result), _plain(result.get("reason") or "")
    gain = gain_text(objective, result)
    best = best_trial_of(state)
    if _kept_current(state):
        lines.append("Keep your current settings: no configuration was shown to be better than them.")
        if verdict is not None and best is not None and best is not state.baseline:
            measured = f", measured {gain}" if gain else ""
            lines.append(f"  best candidate: {best.config.label()} (trial #{best.index}){measured}")
            lines.append(f"  verdict: {verdict}: {reason}")
        elif reason:
            lines.append(f"  {reason}")
        return "\n".join(lines)
    winner = winner_of(state)
    changes = _changes(state)
    lines.append(
        f"Winner: {winner.label() if winner else fmt.MISSING} (trial #{best.index if best else '?'})"
        + (f", {gain} over your current settings" if gain else "")
    )
    lines.append(f"  verdict: {verdict or 'none'}" + (f": {reason}" if reason else ""))
    lines.append(f"  changes: {_changes_text(changes) or 'none'}")
    note = _global_batch_note(state, changes)
    if note:
        lines.append(f"  {note}")
    code = settings_code({k: new for k, (_old, new) in changes.items()}, state.options.get("namespace"))
    if code is not None:
        lines.append("")
        lines.append("  LightningCLI config:")
        lines.extend(_indented(code[0]))
        lines.append("")
        lines.append("  Python:")
        lines.extend(_indented(code[1]))
    return "\n".join(lines)
