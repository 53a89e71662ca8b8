"""`tuneup regressions HISTORY`: where a CI history changed, metric by metric, as text, Markdown or JSON.

HISTORY is what `tuneup compare/bench --history` appends to (tuneup/compare/history.py): a JSON Lines file,
or a URL prefix on object storage. Each metric's series goes through tuneup/compare/changepoints.py; this
module adds the direction (is a change a regression or an improvement) and the exit code:

- 0: the latest state of every metric is no worse (no change point, or the last one is an improvement, and
  no drift for the worse in the latest segment);
- 1: a metric's last change point is a regression, or its latest segment drifts for the worse: the current
  commits are slower (or larger, or dearer) than before. An older regression that a later change point
  followed was a finding of its day, listed but not failing the job again.
- 2: bad input (no history, an unknown metric, a bad option).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

FORMATS = ("text", "md", "json")
DEFAULT_MIN_EFFECT = 0.02
# Metrics where more is better: rates (samples_per_s, tokens_per_s) and utilisation. Every other metric a
# history holds is a time, a size or a price, where less is better.
_HIGHER_IS_BETTER_SUFFIXES = ("_per_s", "mfu", "goodput")

OUTLIERS_LISTED = 5  # record indices named in the text; JSON has them all

EXIT_NONE = 0
EXIT_REGRESSION = 1


def higher_is_better(metric: str) -> bool:
    return metric.endswith(_HIGHER_IS_BETTER_SUFFIXES)


def add_command(sub: Any, usage_error: type[Exception]) -> None:
    command = sub.add_parser(
        "regressions",
        help="find change points and slow drifts in a CI history (tuneup compare/bench --history)",
        description="Find where a CI history of results changed: each change point with the first commit "
        "after it, its size with an interval and a p-value, and slow drifts that no single step shows. Exit "
        "code 1 when a metric's latest change is a regression or its latest stretch drifts for the worse.",
    )
    command.add_argument("history", metavar="HISTORY", help="a history file (JSON Lines) or URL prefix")
    command.add_argument(
        "--metric",
        action="append",
        default=[],
        help="a metric to analyse (repeatable; default: every metric in the history)",
    )
    command.add_argument(
        "--format", default="text", choices=FORMATS, help="output format (default: %(default)s)"
    )
    command.add_argument(
        "--min-effect",
        type=float,
        default=DEFAULT_MIN_EFFECT,
        help="smallest step, or drift over its stretch, to report, a share (default: %(default)s = 2%%)",
    )

    def run(args: argparse.Namespace) -> int:
        return cmd_regressions(args, usage_error)

    command.set_defaults(func=run)


@dataclass(frozen=True)
class MetricFindings:
    """One metric's changes with their direction; change point and drift indices are into the history."""

    metric: str
    higher_is_better: bool
    records: int
    noise_cv: float
    change_points: list[dict[str, Any]]
    drifts: list[dict[str, Any]]
    failing: bool
    note: str | None
    outliers: list[int] = field(default_factory=list)  # records left out, indices into the history


def _is_worse(ratio: float, higher_better: bool) -> bool:
    return ratio < 1.0 if higher_better else ratio > 1.0


def analyse(records: list[Any], metric: str, min_effect: float) -> MetricFindings:
    from tuneup.compare.changepoints import MIN_RECORDS, find_changes

    at = [i for i, r in enumerate(records) if metric in r.metrics]
    values = [records[i].metrics[metric] for i in at]
    higher_better = higher_is_better(metric)
    if any(v <= 0.0 for v in values):
        # exposed_comm_ms is 0 on one rank, say: a step is a ratio, and a ratio to 0 is none.
        note = (
            f"always 0 in these {len(at)} records"
            if all(v == 0.0 for v in values)
            else f"{metric} has values that are not positive; change points are found in ratios of positive values"
        )
        return MetricFindings(metric, higher_better, len(at), 0.0, [], [], False, note)
    if len(at) < MIN_RECORDS:
        note = f"{len(at)} records of {metric}; change points need at least {MIN_RECORDS}"
        return MetricFindings(metric, higher_better, len(at), 0.0, [], [], False, note)
    changes = find_changes(values, [records[i].commit for i in at], min_effect=min_effect)
    steps = [
        {**asdict(c), "index": at[c.index], "regression": _is_worse(c.ratio, higher_better)}
        for c in changes.change_points
    ]
    drifts = [
        {
            **asdict(d),
            "start_index": at[d.start_index],
            "end_index": at[d.end_index],
            "regression": _is_worse(d.total_ratio, higher_better),
        }
        for d in changes.drifts
    ]
    # A drift that ends at the last record kept (not an outlier) is the latest segment's: segments tile it.
    latest = max(set(range(len(at))) - set(changes.outliers))
    failing = bool(steps and steps[-1]["regression"]) or any(
        _is_worse(d.total_ratio, higher_better) and d.end_index == latest for d in changes.drifts
    )
    outliers = [at[i] for i in changes.outliers]
    return MetricFindings(
        metric, higher_better, len(at), changes.noise_cv, steps, drifts, failing, None, outliers
    )


def cmd_regressions(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.compare import history

    try:
        import ruptures  # noqa: F401
        import scipy  # noqa: F401
    except ImportError as exc:
        raise usage_error(
            f"tuneup regressions needs the ci extra ({exc.name} is missing): pip install 'tuneup[ci]'"
        ) from None
    if not (args.min_effect >= 0.0 and math.isfinite(args.min_effect)):
        raise usage_error(f"--min-effect is a share of at least 0 (0.02 = 2%), got {args.min_effect}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", history.HistoryWarning)
        try:
            records = history.read(args.history)
        except (history.HistoryError, ValueError) as exc:
            raise usage_error(str(exc)) from None
    for warning in caught:
        if issubclass(warning.category, history.HistoryWarning):
            print(f"tuneup regressions: warning: {warning.message}", file=sys.stderr)
    if not records:
        raise usage_error(f"{args.history} holds no readable record; append some with --history first")
    known = sorted({m for r in records for m in r.metrics})
    for metric in args.metric:
        if metric not in known:
            raise usage_error(
                f"no metric {metric!r} in {args.history}; it holds {', '.join(known) or 'none'}"
            )
    metrics = list(dict.fromkeys(args.metric)) or known
    findings = [analyse(records, m, args.min_effect) for m in metrics]
    print(render(findings, records, args.format), end="")
    return EXIT_REGRESSION if any(f.failing for f in findings) else EXIT_NONE


def _word(is_regression: bool) -> str:
    return "REGRESSION" if is_regression else "improvement"


def _step_line(metric: str, c: dict[str, Any]) -> str:
    return (
        f"{metric}: {_word(c['regression'])} from commit {c['commit']} (record {c['index']}): "
        f"x{c['ratio']:.3f} [{c['ratio_low']:.3f}, {c['ratio_high']:.3f}] ({100 * (c['ratio'] - 1):+.1f}%), "
        f"p = {c['p_value']:.2g}"
    )


def _drift_line(metric: str, d: dict[str, Any]) -> str:
    return (
        f"{metric}: drift ({_word(d['regression'])}) over records {d['start_index']}-{d['end_index']} "
        f"(commits {d['start_commit']}..{d['end_commit']}): {d['percent_per_record']:+.3f}% per record "
        f"[{d['percent_low']:+.3f}, {d['percent_high']:+.3f}], {100 * (d['total_ratio'] - 1):+.1f}% in all "
        f"(Mann-Kendall z = {d['z']:+.1f})"
    )


def render(findings: list[MetricFindings], records: list[Any], fmt: str) -> str:
    failing = [f.metric for f in findings if f.failing]
    if fmt == "json":
        document = {
            "records": len(records),
            "failing": failing,
            "metrics": [asdict(f) for f in findings],
        }
        return json.dumps(document, indent=2, allow_nan=False) + "\n"
    verdict = f"REGRESSION in {', '.join(failing)}" if failing else "no regression in the latest commits"
    lines: list[str] = []
    for f in findings:
        if f.note:
            lines.append(f"{f.metric}: not analysed: {f.note}")
            continue
        found = [_step_line(f.metric, c) for c in f.change_points]
        found += [_drift_line(f.metric, d) for d in f.drifts]
        better = "higher" if f.higher_is_better else "lower"
        head = f"{f.metric} ({f.records} records, noise {100 * f.noise_cv:.1f}% CV, {better} is better)"
        lines.append(f"{head}: no change point, no drift" if not found else head)
        lines.extend(found)
        if f.outliers:
            shown = ", ".join(str(i) for i in f.outliers[:OUTLIERS_LISTED])
            more = (
                f" and {len(f.outliers) - OUTLIERS_LISTED} more" if len(f.outliers) > OUTLIERS_LISTED else ""
            )
            lines.append(
                f"{f.metric}: {len(f.outliers)} outlying records left out (far from their neighbours: one slow "
                f"job, say): records {shown}{more}"
            )
    if fmt == "md":
        from tuneup.report.markdown import markdown_text

        return f"### tuneup regressions: {markdown_text(verdict)}\n\n" + "".join(
            f"- {markdown_text(line)}\n" for line in lines
        )
    return f"tuneup regressions: {len(records)} records: {verdict}\n" + "".join(
        f"  {line}\n" for line in lines
    )
