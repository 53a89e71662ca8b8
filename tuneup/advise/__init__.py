"""Advice: what to change in a recorded run, each change a prediction with its evidence and its code.

Above the analysis (tuneup.analyze) and the catalogs (tuneup.catalog), below the report; no torch. One
module per question:

- observe: what a run's analysis says about its workload;
- step_model: how long a step is at another setting (fitted from one or more runs);
- outcomes: what a setting delivers (samples/s, goodput, $);
- context: what every advice module reads, and how a proposal becomes a recommendation;
- batch, data_loading, communication, precision, interconnect, checkpoint, ranks: one kind of advice
  each, `recommend(ctx) -> list[Recommendation]` (what they looked at and left alone goes to
  `ctx.considered`);
- whatif: the same workload on every instance of the catalog;
- code: the Lightning code that applies a change.

`advise(analyses)` runs them all on the runs of one workload (the first is the current setting).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tuneup.advise.model import Advice, AdviceOptions, Recommendation
from tuneup.advise.observe import AdviceInputError, observe
from tuneup.advise.step_model import ModelError, fit_step_model
from tuneup.analyze.model import RunAnalysis
from tuneup.analyze.noise_scale import NoiseVerdict, noise_verdict
from tuneup.cost.pricing import usd_per_device_hour

__all__ = ["Advice", "AdviceInputError", "AdviceOptions", "ModelError", "advise"]


def _objective(analyses: Sequence[RunAnalysis]) -> tuple[str, NoiseVerdict | None, str]:
    """One objective for every recommendation and the what-if, named with why: goodput where a run of the
    workload measured the gradient noise scale (the first given that did: the same runs in another order
    give the same objective), else samples/s. Returns (objective, the verdict goodput weighs with, the note
    that says so)."""
    verdicts = [noise_verdict(a.noise_scale, a.run) for a in analyses]
    for a, v in zip(analyses, verdicts, strict=True):
        if v.b_simple is not None:
            source = "" if a is analyses[0] else f" (run {a.run.run_id})"
            return (
                "goodput",
                v,
                f"objective: goodput (samples/s weighed by statistical efficiency) for every figure, "
                f"because {v.text}{source}",
            )
    measured = next((v for v in verdicts if v.kind != "not measured"), verdicts[0])
    return (
        "samples/s",
        None,
        f"objective: samples/s for every figure, because {measured.text}; so batch advice is judged by "
        "samples/s alone, not by goodput, and a larger batch may need more samples to reach the same loss",
    )


def _rules() -> list[Callable[..., list[Recommendation]]]:
    from tuneup.advise import (
        batch,
        checkpoint,
        communication,
        data_loading,
        interconnect,
        precision,
        ranks,
        sharded,
    )

    return [
        batch.recommend,
        data_loading.recommend,
        communication.recommend,
        sharded.recommend,
        precision.recommend,
        interconnect.recommend,
        ranks.recommend,
        checkpoint.recommend,
    ]


def advise(analyses: Sequence[RunAnalysis], options: AdviceOptions | None = None) -> Advice:
    """Advice for the runs of one workload; `analyses[0]` is the setting to improve. Raises
    AdviceInputError (a run without a steady state or batch size) or ModelError (runs that are not one
    workload)."""
    from tuneup.advise.context import AdviceContext
    from tuneup.advise.outcomes import Economics

    options = options or AdviceOptions()
    if not analyses:
        raise AdviceInputError("no run to advise on; pass a run directory (or report.json)")
    base = analyses[0]
    observations = [observe(a) for a in analyses]
    model = fit_step_model(observations)
    o = observations[0]
    objective, verdict, objective_note = _objective(analyses)
    economics = Economics(
        usd_per_device_hour(o.usd_per_hour, o.devices_priced),
        o.tokens_per_sample,
        verdict.b_simple if verdict else None,
        o.samples_per_step,
        b_noise_low=verdict.b_low if verdict else None,
        b_noise_high=verdict.b_high if verdict else None,
    )
    ctx = AdviceContext(
        analysis=base,
        observation=o,
        model=model,
        economics=economics,
        objective=objective,
        min_gain=options.min_gain,
        link_fits=options.link_fits,
        model_observations=observations,
    )
    recommendations: list[Recommendation] = []
    notes: list[str] = []
    for rule in _rules():
        try:
            recommendations.extend(rule(ctx))
        except Exception as exc:  # one module's failure must not hide the others' advice
            notes.append(f"{rule.__module__.rsplit('.', 1)[-1]} advice failed: {type(exc).__name__}: {exc}")
    recommendations.sort(key=lambda r: r.gain.value, reverse=True)
    whatif = None
    if options.whatif:
        from tuneup.advise.whatif import what_if

        try:
            whatif = what_if(ctx, options)
        except Exception as exc:
            notes.append(f"what-if failed: {type(exc).__name__}: {exc}")
    notes.insert(0, objective_note)
    return Advice(
        runs=[a.run.run_id for a in analyses],
        objective=ctx.objective,
        min_gain=options.min_gain,
        model=model.terms(),
        current=ctx.current,
        recommendations=recommendations,
        considered=list(ctx.considered),
        whatif=whatif,
        notes=notes + list(model.notes),
    )
