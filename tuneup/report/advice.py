"""The advice as the report shows it: computed once per analysis (the HTML, Markdown and JSON of one report
read the same object), as format-neutral blocks for the "Recommendations" section, and as plain text for
`tuneup advise` and `tuneup show`."""

from __future__ import annotations

import weakref
from functools import partial

from tuneup._log import logger
from tuneup.advise import Advice, AdviceInputError, AdviceOptions, ModelError, advise
from tuneup.advise.model import Predicted, Range, Recommendation
from tuneup.analyze.model import RunAnalysis
from tuneup.report.blocks import Block, Bullets, Code, KeyValues, Paragraph, table

# One analysis -> its advice, for as long as the analysis lives: the terminal, HTML, Markdown and JSON of
# one report each ask for it, and the advice (a model fit and its what-ifs) is worth making once. The entry
# holds the analysis weakly and leaves when the analysis is collected, so it keeps no analysis (a 1,024-rank
# one is large) alive, and a later object given the same id never finds it.
_ADVICE: dict[int, tuple[weakref.ref[RunAnalysis], Advice | str]] = {}


def _forget(key: int, ref: weakref.ref[RunAnalysis]) -> None:
    entry = _ADVICE.get(key)
    if entry is not None and entry[0] is ref:
        del _ADVICE[key]


def advice_for(analysis: RunAnalysis) -> Advice | str:
    """The advice for a report's run, or the sentence that says why there is none."""
    key = id(analysis)
    hit = _ADVICE.get(key)
    if hit is not None and hit[0]() is analysis:
        return hit[1]
    try:
        result: Advice | str = advise([analysis], AdviceOptions())
    except (AdviceInputError, ModelError) as exc:
        result = str(exc)
    except Exception as exc:  # a defect in the advice must not cost the user the report
        logger.warning("tuneup: the advice failed: %s: %s", type(exc).__name__, exc)
        result = f"the advice failed ({type(exc).__name__}: {exc}); please report it"
    _ADVICE[key] = (weakref.ref(analysis, partial(_forget, key)), result)
    return result


# Instances the terminal shows of the what-if (the report and --format md show them all).
WHATIF_TEXT_ROWS = 5


def pct(r: Range) -> str:
    return f"{r.value:+.1%} [{r.low:+.1%}, {r.high:+.1%}]"


def _ms(r: Range) -> str:
    return f"{r.value:.1f} ms [{r.low:.1f}, {r.high:.1f}]"


def _rate(r: Range) -> str:
    return f"{r.value:,.1f} [{r.low:,.1f}, {r.high:,.1f}]"


def _usd(r: Range | None) -> str:
    return f"${r.value:,.4g} [{r.low:,.4g}, {r.high:,.4g}]" if r is not None else "not priced"


def _how(rec: Recommendation) -> str:
    """Whether the gain is a run's measurement or the model's prediction."""
    run = rec.predicted.measured_run if rec.predicted is not None else None
    return f"measured (run {run})" if run is not None else "predicted"


def headline(rec: Recommendation) -> str:
    return f"{rec.title}: {rec.objective} {pct(rec.gain)} {_how(rec)} ({rec.confidence} confidence)"


def _figures(label: str, p: Predicted | None) -> tuple[str, str] | None:
    if p is None:
        return None
    # One figure, one definition: samples/s is the samples per step over the *mean* step, so the mean step
    # stands beside it; the median (the typical step) is labelled as such (a heavy tail sets them apart:
    # "step 606.5 ms; samples/s 34.6" once divided 32 samples by the 924.6 ms mean).
    parts = [f"median step {_ms(p.step_ms)}"]
    if p.mean_step_ms is not None:
        parts.append(f"mean step {_ms(p.mean_step_ms)}")
    parts.append(f"samples/s {_rate(p.samples_per_s)}" + (" (at the mean step)" if p.mean_step_ms else ""))
    if p.goodput_samples_per_s is not None:
        parts.append(f"goodput {_rate(p.goodput_samples_per_s)}")
    if p.usd_per_million_samples is not None:
        parts.append(f"$ per 1M samples {_usd(p.usd_per_million_samples)}")
    return label, "; ".join(parts)


def recommendation_blocks(rec: Recommendation) -> list[Block]:
    pairs = [
        ("Change", "; ".join(f"{c.knob}: {c.current} → {c.proposed}" for c in rec.changes)),
        ("Gain", f"{rec.objective} {pct(rec.gain)} {_how(rec)}; {rec.confidence} confidence"),
    ]
    now = "Now (measured)" if rec.current is not None and rec.current.measured_run else "Now (model)"
    for label, p in ((now, rec.current), ("After", rec.predicted)):
        row = _figures(label, p)
        if row:
            pairs.append(row)
    if rec.cost_change is not None:
        pairs.append(("$ per 1M samples", pct(rec.cost_change)))
    out: list[Block] = [KeyValues(rec.title, tuple(pairs))]
    out.append(
        Bullets(tuple(f"Evidence: {e}" for e in rec.evidence) + tuple(f"Caveat: {c}" for c in rec.caveats))
    )
    out.append(Code("Apply it in Python", rec.code))
    if rec.yaml:
        out.append(Code("Or in a LightningCLI config", rec.yaml, "yaml"))
    return out


def advice_blocks(advice: Advice | str) -> list[Block]:
    if isinstance(advice, str):
        return [Paragraph(f"No recommendations: {advice}", quiet=True)]
    out: list[Block] = []
    if advice.recommendations:
        out.append(
            Paragraph(
                f"{len(advice.recommendations)} change(s) predicted to gain at least {advice.min_gain:.0%} "
                f"({advice.objective}), best first. Each is a prediction of tuneup's step-time model with its "
                "interval: apply the code, rerun, and compare the runs with `tuneup compare`."
            )
        )
        for rec in advice.recommendations:
            out.extend(recommendation_blocks(rec))
    else:
        out.append(
            Paragraph(
                f"No change is predicted to gain {advice.min_gain:.0%} or more with the evidence in this run; "
                "what was looked at is listed below.",
                quiet=True,
            )
        )
    if advice.considered:
        out.append(
            table(
                "Looked at and left alone",
                ("Knob", "Why not"),
                [(c.knob, c.reason) for c in advice.considered],
                detail=bool(advice.recommendations),
            )
        )
    if advice.whatif is not None and advice.whatif.rows:
        w = advice.whatif
        out.append(
            table(
                f"Other instances for this workload (global batch {w.global_batch}, ranked by {w.ranked_by})",
                ("Instance", "GPUs", "$/h", "Median step", "Samples/s", "$ per 1M samples", "Note"),
                [
                    (
                        r.instance + (" (spot)" if r.spot else ""),
                        f"{r.gpus} x {r.gpu}",
                        f"{r.usd_per_hour:,.2f}",
                        _ms(r.step_ms) if r.step_ms else "-",
                        _rate(r.samples_per_s) if r.samples_per_s else "-",
                        _usd(r.usd_per_million_samples),
                        r.note or "",
                    )
                    for r in w.rows[:15]
                ],
                numeric=(2,),
                detail=True,
            )
        )
        if w.assumptions:  # folded beside the table: six long sentences would bury the recommendations
            out.append(
                table("What the what-if assumes", ("Assumption",), [(a,) for a in w.assumptions], detail=True)
            )
    elif advice.whatif is not None and advice.whatif.assumptions:
        out.append(Paragraph("Other instances: " + " ".join(advice.whatif.assumptions), quiet=True))
    if advice.model is not None:
        m = advice.model
        pairs = [
            (
                "Runs",
                f"{m.runs} (batch sizes {', '.join(map(str, m.batch_sizes))}; world sizes "
                f"{', '.join(map(str, m.world_sizes))})",
            ),
            (
                "Compute per micro-batch",
                f"{m.compute_intercept_ms:.3f} ms + {m.compute_ms_per_sample:.4f} ms per sample",
            ),
            ("Data wait per sample", f"{m.data_ms_per_sample:.4f} ms"),
            ("Optimizer, other", f"{m.optimizer_ms:.2f} ms per step, {m.other_ms:.2f} ms per micro-batch"),
        ]
        if m.sync_ms:
            label = (
                f"{m.sharding} gathers and scatters (as measured, per micro-batch)"
                if m.sharding
                else "Collectives (link fit)"
            )
            pairs.append((label, f"{m.sync_ms:.2f} ms per step; overlap gamma {m.overlap_gamma}"))
        if m.exposed_comm_ms is not None:
            total = m.exposed_comm_ms + (m.interference_ms or 0.0)
            pairs.append(
                (
                    "Communication's cost to the step",
                    f"{total:.2f} ms: exposed {m.exposed_comm_ms:.2f} ms"
                    + (
                        f" + interference {m.interference_ms:.2f} ms ("
                        + (
                            "compute slowed, against the one-rank run)"
                            if m.interference_measured
                            else "assumed: see the notes; a one-rank run of the same batch size measures it)"
                        )
                        if m.interference_ms is not None
                        else " (at least: compute slowed by overlapping collectives is not separated without a one-rank run)"
                    ),
                )
            )
        if m.fit_error is not None:
            pairs.append(("Largest error on the runs fitted", f"{m.fit_error:.1%}"))
        out.append(KeyValues("The step-time model", tuple(pairs), detail=True))
    notes = list(advice.notes)
    if notes:
        out.append(Bullets(tuple(f"Note: {n}" for n in notes)))
    return out


def advice_text(advice: Advice | str, limit: int | None = None) -> list[str]:
    """Plain lines (`tuneup advise`): each recommendation's headline, figures, evidence and code, then what
    was left alone and why, the best instances of the what-if, and the notes. `limit`: the first `limit`
    headlines only (`tuneup show`)."""
    if isinstance(advice, str):
        return [f"no recommendations: {advice}"]
    if limit is not None:
        if not advice.recommendations:
            return [
                f"no change predicted to gain {advice.min_gain:.0%} or more ({len(advice.considered)} looked at)"
            ]
        return [f"- {headline(r)}" for r in advice.recommendations[:limit]]
    lines: list[str] = []
    for i, rec in enumerate(advice.recommendations, 1):
        lines.append(f"{i}. {headline(rec)}")
        for p, label in ((rec.current, "now"), (rec.predicted, "after")):
            row = _figures(label, p)
            if row:
                lines.append(f"   {row[0]}: {row[1]}")
        lines.extend(f"   evidence: {e}" for e in rec.evidence)
        lines.extend(f"   caveat: {c}" for c in rec.caveats)
        lines.append("   code:")
        lines.extend(f"     {line}" for line in rec.code.splitlines())
        if rec.yaml:  # the README promises both: the code, and the same as a LightningCLI config
            lines.append("   or in a LightningCLI config (YAML):")
            lines.extend(f"     {line}" for line in rec.yaml.splitlines())
        lines.append("")
    if not advice.recommendations:
        lines += [
            f"no change is predicted to gain {advice.min_gain:.0%} or more with the evidence in this run",
            "",
        ]
    if advice.considered:
        lines.append("looked at and left alone:")
        lines.extend(f"  - {c.knob}: {c.reason}" for c in advice.considered)
        lines.append("")
    w = advice.whatif
    if w is not None and w.rows:
        shown = w.rows[:WHATIF_TEXT_ROWS]
        lines.append(
            f"other instances for this workload (global batch {w.global_batch}, ranked by {w.ranked_by}), "
            f"best {len(shown)} of {len(w.rows)} (--format md for all, with the assumptions):"
        )
        for r in shown:
            step = _ms(r.step_ms) if r.step_ms else "-"
            lines.append(
                f"  - {r.instance}{' (spot)' if r.spot else ''}: {r.gpus} x {r.gpu}, ${r.usd_per_hour:,.2f}/h, "
                f"median step {step}, $ per 1M samples {_usd(r.usd_per_million_samples)}"
            )
        lines.append("")
    elif w is not None and w.assumptions:
        lines += [f"other instances: {w.assumptions[0]}", ""]
    lines.extend(f"note: {n}" for n in advice.notes)
    return lines
