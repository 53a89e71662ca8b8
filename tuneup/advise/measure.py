"""Measure first where the model is blind: which short trials identify the step-time model.

With one batch size seen, the compute's fixed and per-sample parts cannot both be known (the model takes
AdaptDL's prior, half and half); from multi-rank runs alone, how much the collectives slow the compute
(interference) is not known either. A run at a second batch size identifies the first; a one-rank run at
the same per-rank batch the second, once the one-rank runs are the model's reference (as many batch sizes
as any multi-rank world size: tuneup.advise.step_model picks the world size with the most batch sizes,
a tie going to the fewest ranks). `plan_trials` picks the fewest trials that leave the model least blind,
asking the model itself: it is fitted to the runs plus a stand-in for each trial (a copy of the base run at
the trial's world size and batch), so that what counts as identified is what the fit says, not a second
spelling of its rules.

Pure: no torch, no processes. `tuneup advise --measure` (tuneup.tune.advise_trials) runs the trials.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuneup.advise.memory import MEMORY_HEADROOM, memory_model
from tuneup.advise.model import ModelTerms, Setting
from tuneup.advise.observe import Observation
from tuneup.advise.step_model import fit_step_model

# What `tuneup advise` says where its model rests on a prior and no trial was run (the advice's notes).
MEASURE_HINT = "measure it: `tuneup advise --measure RUN -- COMMAND`"

# What the model can be blind to, by key: what each means, in the plan and the notes.
COMPUTE = "compute"
INTERFERENCE = "interference"
BLIND_TEXT = {
    COMPUTE: "how compute grows with the batch (its fixed and per-sample parts: one batch size seen)",
    INTERFERENCE: "interference (how much the collectives slow the compute: no one-rank run of the same batch)",
}


def measure_hint(runs: Sequence[str] = ()) -> str:
    """MEASURE_HINT with the user's own run directories in place of RUN."""
    return MEASURE_HINT.replace("RUN", " ".join(runs)) if runs else MEASURE_HINT


def blind_spots(terms: ModelTerms) -> list[str]:
    """What a fitted model rests on a prior for (BLIND_TEXT keys), from its terms."""
    blind = [COMPUTE] if terms.compute_prior is not None else []
    if max(terms.world_sizes, default=1) > 1 and not terms.interference_measured:
        blind.append(INTERFERENCE)
    return blind


@dataclass(frozen=True, slots=True)
class PlannedTrial:
    batch_size: int  # per rank and micro-batch
    world_size: int
    purpose: str
    step_ms: float | None = None  # the mean step the model predicts now, for the time estimate

    def label(self) -> str:
        ranks = "one rank" if self.world_size == 1 else f"{self.world_size} ranks"
        return f"batch {self.batch_size} per rank on {ranks}"


@dataclass(frozen=True, slots=True)
class NotMeasured:
    """A trial that ran and measured nothing: what rules out trying it, or its neighbours, again."""

    batch_size: int
    world_size: int
    out_of_memory: bool = False
    batch_refused: bool = False  # the script did not take the batch size
    world_refused: bool = False  # the run did not have the world size asked for


@dataclass(frozen=True, slots=True)
class MeasurePlan:
    trials: tuple[PlannedTrial, ...]
    blind: tuple[str, ...]  # what the runs given leave the model blind to (BLIND_TEXT keys)
    left_blind: tuple[str, ...]  # what it stays blind to after the planned trials
    notes: tuple[str, ...]  # why something cannot be measured, or is not within the budget

    def trial_s(self, trial: PlannedTrial, startup_s: float, max_steps: int) -> float | None:
        """At most how long one trial runs: its start-up and `max_steps` steps at the predicted step."""
        return startup_s + max_steps * trial.step_ms / 1000.0 if trial.step_ms is not None else None


def _stand_in(base: Observation, world_size: int, batch_size: int) -> Observation:
    """The base run as if it had run at another world size and batch: for asking the model what a trial
    there would identify (the fit's identifiability depends on which settings it sees, not their figures)."""
    return replace(
        base,
        run_id=f"planned-{world_size}x{batch_size}",
        world_size=world_size,
        batch_size=batch_size,
        num_nodes=1 if world_size == 1 else base.num_nodes,
        ranks_per_node=min(base.ranks_per_node, world_size),
    )


def blind_to(observations: Sequence[Observation]) -> tuple[str, ...]:
    """What a model fitted to these runs rests on a prior for; `observations[0]` is the base."""
    model = fit_step_model(observations)
    blind = [COMPUTE] if model.line.prior is not None else []
    if observations[0].world_size > 1 and not model.interference_known:
        blind.append(INTERFERENCE)
    return tuple(blind)


def _fits_in_memory(observations: Sequence[Observation], batch_size: int, world_size: int) -> bool:
    base = observations[0]
    model = memory_model(observations, base)
    if model is None or not base.gpu_mem_total_bytes:
        return True  # nothing says it would not (a CPU run, no GPU peak recorded)
    return model.peak_bytes(batch_size, world_size) <= (1 - MEMORY_HEADROOM) * base.gpu_mem_total_bytes


def _second_batch(
    observations: Sequence[Observation], world_size: int, failed: Sequence[NotMeasured]
) -> int | None:
    """Another per-rank batch at `world_size`: twice the base's, or half where twice cannot fit, ran out of
    memory, or failed; None where neither can be tried."""
    b = observations[0].batch_size
    seen = {o.batch_size for o in observations if o.world_size == world_size}
    smallest_oom = min((f.batch_size for f in failed if f.out_of_memory), default=None)
    for batch in (2 * b, b // 2):
        if batch < 1 or batch in seen:
            continue
        if smallest_oom is not None and batch >= smallest_oom:
            continue  # out of memory at a micro-batch rules out every larger one, on any world size
        if any(f.batch_size == batch and f.world_size == world_size for f in failed):
            continue
        if not _fits_in_memory(observations, batch, world_size):
            continue
        return batch
    return None


def _predicted_step_ms(observations: Sequence[Observation], batch_size: int, world_size: int) -> float | None:
    base = observations[0]
    try:
        model = fit_step_model(observations)
        setting = Setting(batch_size, base.accumulation, world_size, base.precision, base.num_workers)
        return model.predict(setting).mean_ms.value
    except (ValueError, ZeroDivisionError):
        return None


def plan_trials(
    observations: Sequence[Observation],
    *,
    max_trials: int,
    one_rank_blocked: str | None = None,
    failed: Sequence[NotMeasured] = (),
) -> MeasurePlan:
    """The fewest trials (at most `max_trials`) that leave the model fitted to `observations` (the base
    first) least blind. `one_rank_blocked`: why the command cannot be run on one rank (None: it can);
    `failed`: trials that measured nothing, which rule out themselves and what they say cannot work."""
    base = observations[0]
    p, b = base.world_size, base.batch_size
    blind = blind_to(observations)
    notes: list[str] = []
    batch_refused = next((f for f in failed if f.batch_refused), None)
    if batch_refused is not None:
        notes.append(
            "the script did not take a batch size from the trial, so no second batch size can be measured: "
            "give the LightningModule or its datamodule a `batch_size` attribute that builds the DataLoader"
        )
    if any(f.world_refused for f in failed) and one_rank_blocked is None:
        one_rank_blocked = "a trial asked for one rank and the run had more"
    candidates: list[PlannedTrial] = []
    if batch_refused is None:
        second = _second_batch(observations, p, failed)
        if second is not None:
            candidates.append(
                PlannedTrial(second, p, "a second batch size: how compute grows with the batch")
            )
    if p > 1 and one_rank_blocked is None:
        if b not in {o.batch_size for o in observations if o.world_size == 1} and not any(
            f.world_size == 1 and f.batch_size == b for f in failed
        ):
            candidates.append(
                PlannedTrial(b, 1, "one rank at the same per-rank batch: the collectives' interference")
            )
        one_rank_second = _second_batch(observations, 1, failed) if batch_refused is None else None
        if one_rank_second is not None:
            candidates.append(
                PlannedTrial(
                    one_rank_second,
                    1,
                    "one rank at a second batch size: how compute grows with the batch, without collectives",
                )
            )
    elif p > 1 and INTERFERENCE in blind:
        notes.append(f"interference cannot be measured here: {one_rank_blocked}")

    best: tuple[PlannedTrial, ...] = ()
    best_blind = blind
    for size in range(1, min(max_trials, len(candidates)) + 1):
        for chosen in itertools.combinations(candidates, size):
            left = blind_to([*observations, *(_stand_in(base, t.world_size, t.batch_size) for t in chosen)])
            if len(left) < len(best_blind):
                best, best_blind = chosen, left
        if not best_blind:
            break
    if best_blind and len(candidates) > max_trials:
        every = [_stand_in(base, t.world_size, t.batch_size) for t in candidates]
        if len(blind_to([*observations, *every])) < len(best_blind):
            notes.append(
                f"within {max_trials} measuring trial(s) the model stays blind to "
                + " and ".join(short_blind(k) for k in best_blind)
                + f"; {len(candidates)} trials would measure more"
            )
    if COMPUTE in best_blind and batch_refused is None and not any(t.batch_size != b for t in candidates):
        notes.append(
            f"no second batch size is left to try: batch {2 * b} "
            + ("and " + str(b // 2) + " " if b > 1 else "")
            + "ran out of memory, failed, cannot fit, or was measured already"
        )
    trials = tuple(
        replace(t, step_ms=_predicted_step_ms(observations, t.batch_size, t.world_size)) for t in best
    )
    return MeasurePlan(trials, blind, best_blind, tuple(notes))


def describe_plan(plan: MeasurePlan, startup_s: float, max_steps: int) -> list[str]:
    """The plan in words: what the model is blind to, each trial and why, and about how long."""
    if not plan.blind:
        return ["the runs identify the model (two batch sizes, interference measured): nothing to measure"]
    lines = ["the model is blind to " + "; and to ".join(BLIND_TEXT[k] for k in plan.blind)]
    if not plan.trials:
        lines.append("no trial can measure it" + (": " + "; ".join(plan.notes) if plan.notes else ""))
        return lines
    estimates = [plan.trial_s(t, startup_s, max_steps) for t in plan.trials]
    known = [e for e in estimates if e is not None]
    total = f", at most about {_duration(sum(known))} in all" if len(known) == len(estimates) else ""
    lines.append(
        f"running {len(plan.trials)} short trial(s) of your command (at most {max_steps} steps each{total}):"
    )
    for i, (trial, seconds) in enumerate(zip(plan.trials, estimates, strict=True), 1):
        how_long = f" (~{_duration(seconds)})" if seconds is not None else ""
        lines.append(f"  {i}. {trial.label()}: {trial.purpose}{how_long}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines


def short_blind(key: str) -> str:
    """A BLIND_TEXT key in a few words."""
    return BLIND_TEXT[key].split(" (")[0]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
