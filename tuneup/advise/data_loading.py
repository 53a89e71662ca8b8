"""Data loading: how many DataLoader workers hide the input wait, and the loader flags that go with them.

Per micro-batch the run measured a wait for data `d` and the rest of the micro-batch `R` (forward,
backward and its share of the optimizer and the loop: (mean step − data) / micro-batches). The loader
needs `L` to produce one batch:

    num_workers = 0          L = d                      (the main process loads, nothing overlaps)
    num_workers = w₀ > 0     L ≈ w₀ · (d + R)           (the workers are the bottleneck: each delivers one
                                                          batch per w₀ micro-batches)

`w` workers deliver a batch every L/w while the main process spends R on the micro-batch, so the wait
becomes

    d(w) = max(0, L/w − R)

which is what the step-time model is given (`data_ms_per_sample = d(w) / batch`). The proposal is the
fewest workers that hide the wait with a quarter to spare (w ≥ 1.25·L/R, load times vary), never above
Lightning's own bound, `suggested_max_num_workers`: max(1, CPUs // local ranks − 1), one core left to
the main process, where the loading is CPU work. Loading that waits (below) may have as many workers as the
rank's share of the CPUs: they sleep while they wait (on a 2-CPU host a loader that waited 2 ms a sample
measured +136% with 2 workers, where Lightning's bound of 1 gave +17%; benchmarks/advise_accuracy.py).

Workers only help if they have cores of their own. The rank has c = (host CPUs − the CPUs other
processes took, from the telemetry's contention figures) / local ranks; its main process keeps 1 busy
on a GPU run, and on a CPU run what its process measured (the telemetry's process CPU, with no workers
yet), else as many as torch's intra-op threads (OMP_NUM_THREADS where recorded, else every core). One
account of those figures (`CpuAccount`) is quoted by every outcome. Where CPU-bound workers would have no
CPU spare, a CPU run with whole CPUs to share gets fewer intra-op threads to give the workers theirs; else
the workers compete with the training: a worker that wakes up preempts a compute thread (on CPU, an
OpenMP barrier then waits for it). Loading that waits rather than computes (the main process loaded with
num_workers=0, and its CPU time per step leaves at most a quarter of the wait on the CPU: storage, the
network, a sleep) competes for nothing. The interval's low end runs only the workers that have a core
(d(w_eff)); with none, the loading and the training take turns on the same cores and the low end is no
gain at all. Where that is so the figure quoted is the middle of the two ends and the confidence is low.
More workers than Lightning's bound are told to use fewer (they take turns on the CPUs with the
training, and each holds a copy of the Dataset), without a predicted gain.

pin_memory (page-locked host buffers, faster and asynchronous host-to-GPU copies) is proposed on GPU
runs only; persistent_workers where the loader is re-created (several epochs, validation), since
workers start again each time otherwise; prefetch_factor (batches each worker keeps ready, 2 by
default) where the run saw stalls: a deeper queue absorbs a slow batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Predicted, Range, Recommendation
from tuneup.analyze.findings import lightning_max_workers

# Below this share of the step, the data wait is not worth a worker (and within a rerun's noise).
MIN_DATA_SHARE = 0.05
# Workers to spare beyond L/R: batch load times vary, and a worker that is late shows as a wait.
HEADROOM = 1.25
# prefetch_factor proposed where stalls were recorded (PyTorch's default is 2 per worker).
PREFETCH_WITH_STALLS = 4
# A logical CPU runs CPU work up to this much slower while its neighbours are busy too (SMT siblings, shared
# vCPUs, one memory bus): measured on a 2-vCPU VM, two busy processes each ran 1.6-2.0x slower than one.
BUSY_CPU_SLOWDOWN = 1.8
# A CPU counts as the rank's when at most this much of it goes to other processes (rounding to the nearest
# whole CPU: at 0.25 a run whose neighbours took 0.3 CPU got one reasoning, and a run beside 0.2 another).
CORE_SLACK = 0.5
# What handing one batch from a worker to the training process may cost it (the batch pickled through shared
# memory, the queue, the worker's wake-ups beside the compute), which a run that loaded in its main process
# (num_workers=0) cannot show. The bound was measured on the 2-vCPU benchmark host: an in-memory GAN's batches
# of 64 ran 43% slower with one worker (a 4.2 ms step, 0.5 ms of it loading: about 3.7 ms more per batch),
# where the model had the 0.5 ms wait vanish (benchmarks/advise_accuracy.py). The interval's low end counts it.
WORKER_HANDOVER_MS = 4.0


@dataclass(frozen=True, slots=True)
class CpuAccount:
    """Where a rank's CPUs went, from the run's own record: one account that every outcome of the rule
    (workers with cores of their own, fewer compute threads, workers that compete) is reasoned from and
    quoted with."""

    host_cpus: int
    local_ranks: int
    free: float  # CPUs per rank that other processes left (telemetry's contention figures)
    others: float  # CPUs of the host other processes took
    main: float  # CPUs the training process keeps busy
    main_why: str
    process_cpus: float | None  # the training process's mean CPU (telemetry), in CPUs, where recorded

    @property
    def spare(self) -> float:
        """CPUs per rank that neither the training nor other processes used: what workers can have."""
        return max(0.0, self.free - self.main)

    @property
    def cores(self) -> int:
        """Whole CPUs per rank left by other processes."""
        return math.floor(self.free + CORE_SLACK)

    def sentence(self) -> str:
        others = (
            f"other processes took {self.others:.1f} of the host's {self.host_cpus} CPUs (telemetry), "
            if self.others >= 0.05
            else ""
        )
        return (
            f"{others}{self.free:.1f} CPU(s) per rank are left to the training ({self.host_cpus} CPUs, "
            f"{self.local_ranks} rank(s) on the host); {self.main_why}: {self.spare:.1f} CPU(s) per rank spare "
            "for workers"
        )


def _account(ctx: AdviceContext, w0: int) -> CpuAccount:
    o = ctx.observation
    cpus, local_ranks = o.cpu_count or 1, o.ranks_per_node
    taken = [
        c.others_percent_mean / 100.0 * c.cores
        for c in ctx.analysis.telemetry.cpu_contention
        if c.others_percent_mean is not None and c.cores
    ]
    others = max(taken) if taken else 0.0
    free = max(0.0, cpus - others) / local_ranks
    used = [
        p.cpu_percent_mean / 100.0 for p in ctx.analysis.telemetry.processes if p.cpu_percent_mean is not None
    ]
    process = sum(used) / len(used) if used else None
    if o.on_gpu:
        main, why = 1.0, "the main process keeps one CPU busy driving the GPU"
    elif process is not None and w0 == 0:
        # What the process measured is what it takes: a model whose ops do not spread over every core
        # leaves the rest to workers, whatever the thread count says.
        main = min(free, process)
        why = (
            f"the training process used {process:.1f} CPU(s) on average ({process * 100:.0f}% CPU, telemetry)"
        )
    else:
        threads = _omp_threads(ctx)
        if threads is not None:
            main = min(free, threads)
            why = f"the main process computes on {int(threads)} thread(s) (OMP_NUM_THREADS)"
        else:
            main = free
            why = "torch's intra-op threads take every CPU of the rank (OMP_NUM_THREADS not set)"
    return CpuAccount(cpus, local_ranks, free, others, main, why, process)


def _omp_threads(ctx: AdviceContext) -> float | None:
    omp = ctx.analysis.environment.env.get("OMP_NUM_THREADS")
    try:
        return float(int(str(omp))) if omp is not None else None
    except ValueError:
        return None


def _span(mid: Predicted, *ends: Predicted) -> Predicted:
    """`mid` with every interval widened to cover the `ends`' intervals."""

    def widen(field: str) -> Range | None:
        ranges = [getattr(p, field) for p in (mid, *ends)]
        if any(r is None for r in ranges):
            return getattr(mid, field)
        return Range(getattr(mid, field).value, min(r.low for r in ranges), max(r.high for r in ranges))

    return replace(
        mid,
        step_ms=widen("step_ms"),
        mean_step_ms=widen("mean_step_ms"),
        samples_per_s=widen("samples_per_s"),
        usd_per_million_samples=widen("usd_per_million_samples"),
        usd_per_million_tokens=widen("usd_per_million_tokens"),
        goodput_samples_per_s=widen("goodput_samples_per_s"),
    )


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    loader = ctx.analysis.data_loader
    s, b = o.accumulation, o.batch_size
    share = o.data_ms / o.step_mean_ms if o.step_mean_ms > 0 else 0.0
    w0 = o.num_workers
    if "data" in ctx.analysis.step_time.phases_not_timed:
        ctx.skip(
            "num_workers",
            "the training loop's adapter did not time the data phase (a loop that never marks its fetches): "
            'its wait is inside "other", unmeasured, so nothing can be said of workers; mark it '
            "(`run.data(loader)` in a plain loop) and record again",
        )
        return []
    if w0 is not None and o.cpu_count and w0 > lightning_max_workers(o.cpu_count, o.ranks_per_node):
        _fewer(ctx, w0)
        return []
    if share < MIN_DATA_SHARE:
        ctx.skip(
            "num_workers",
            f"the data wait is {o.data_ms:.2f} ms of the {o.step_mean_ms:.2f} ms mean step ({share:.1%}), under "
            f"{MIN_DATA_SHARE:.0%}: more workers cannot buy a measurable gain",
        )
        return []
    if w0 is None:
        ctx.skip("num_workers", "the run did not record its DataLoader's num_workers; nothing to change from")
        return []
    if not o.cpu_count:
        ctx.skip("num_workers", "the run did not record the host's CPU count; the workers' bound is unknown")
        return []
    d = o.data_ms / s
    rest = max(1e-6, (o.step_mean_ms - o.data_ms) / s)
    load = d if w0 == 0 else w0 * (d + rest)
    cap = lightning_max_workers(o.cpu_count, o.ranks_per_node)
    account = _account(ctx, w0)
    cpu_loading = _loading_is_cpu_work(ctx, w0)
    bound = cap if cpu_loading else waiting_max_workers(o.cpu_count, o.ranks_per_node)
    if w0 >= cap:
        ctx.skip(
            "num_workers",
            f"the data wait is {share:.0%} of the step, but more workers cannot help here: num_workers={w0} is "
            f"already at Lightning's bound of {cap} (max(1, {o.cpu_count} CPUs // {o.ranks_per_node} local "
            f"rank(s) − 1)); {account.sentence()}, so another worker would take its CPU from the training. "
            f"The {d:.1f} ms wait per micro-batch needs faster loading itself (profile Dataset.__getitem__ and "
            "collate, cache decoded samples) or more CPUs",
        )
        return []
    w = min(bound, max(w0 + 1, math.ceil(HEADROOM * load / rest)))

    free, main, main_why = account.free, account.main, account.main_why
    cores = account.cores  # whole CPUs left to the rank
    compute = o.compute_per_micro_batch_ms

    def wait(workers: float, slower: float = 1.0, load_slower: float = 1.0) -> float:
        # The rest of the micro-batch grows with its compute where fewer threads compute it.
        return max(0.0, load * load_slower / workers - (rest + compute * (slower - 1.0)))

    setting = replace(ctx.setting, num_workers=w)
    threads = None
    before = _omp_threads(ctx) or float(cores)  # torch's intra-op threads now
    if not o.on_gpu and cpu_loading and main + w > free and before > cores - w >= 1:
        # A CPU run whose intra-op threads would take the workers' cores: give the workers theirs. Compute
        # on fewer threads is at most before/threads times slower (perfect scaling); small models scale far
        # less, so the figure is at no slowdown and the interval reaches the worst. The process's mean CPU
        # understates how many threads the compute itself kept busy (it averages in the single-threaded
        # loading and the waits), so the worst case is the thread count's own ratio.
        threads = cores - w
        worst = max(1.0, main / threads, before / threads)
        # Every core of the rank busy: the loading itself runs slower too.
        low = ctx.predict(
            setting, Range(worst, worst, worst), data_ms_per_sample=wait(w, worst, BUSY_CPU_SLOWDOWN) / b
        )
        proposed = _span(ctx.predict(setting, data_ms_per_sample=wait(w) / b), low)
        competes = False
    else:
        # Workers whose loading waits (storage, a sleep, the network) rather than computes need no core of
        # their own: only CPU-bound loading competes with the training for the rank's CPUs.
        w_eff = min(float(w), max(0.0, free - main)) if cpu_loading else float(w)
        competes = w_eff < w
        high = ctx.predict(setting, data_ms_per_sample=wait(w) / b)
        if not competes and cpu_loading and w + main >= cores:
            slow = ctx.predict(setting, data_ms_per_sample=wait(w, 1.0, BUSY_CPU_SLOWDOWN) / b)
            high = _span(high, slow)
        if competes:
            # The low end: only w_eff workers have a core; with none, loading and training take turns.
            low_wait = wait(w_eff) if w_eff >= 1 else d
            low = ctx.predict(setting, data_ms_per_sample=low_wait / b)
            mid = ctx.predict(setting, data_ms_per_sample=(wait(w) + low_wait) / 2 / b)
            proposed = _span(mid, low, high)
        else:
            proposed = high
    handover = w0 == 0
    if handover:
        proposed = _span(
            proposed, ctx.predict(setting, data_ms_per_sample=(wait(w) + WORKER_HANDOVER_MS) / b)
        )

    how = (
        f"L = {load:.1f} ms to load one batch (num_workers=0: the measured wait)"
        if w0 == 0
        else f"L ≈ {w0} workers × ({d:.1f} + {rest:.1f}) ms = {load:.1f} ms to load one batch"
    )
    evidence = [
        f"data wait {o.data_ms:.1f} ms of the {o.step_mean_ms:.1f} ms mean step ({share:.0%}), "
        f"{s} micro-batch(es) of {b} per step: {d:.1f} ms per micro-batch against {rest:.1f} ms for the rest of it",
        f"{how}; {w} worker(s) deliver one every {load / w:.1f} ms: predicted wait max(0, L/w − rest) = "
        f"{wait(w):.1f} ms per micro-batch",
        f"{o.cpu_count} CPUs on the host, {o.ranks_per_node} rank(s) on it: Lightning's bound max(1, "
        f"{o.cpu_count} // {o.ranks_per_node} − 1) = {cap} worker(s)",
    ]
    if w > cap:
        evidence.append(
            f"the loading waits rather than computes (the process's CPU time per step leaves at most "
            f"{WAITING_CPU_SHARE:.0%} of the wait on the CPU), so its workers need no CPU of their own: up to "
            f"{bound} per rank ({o.cpu_count} CPUs // {o.ranks_per_node} rank(s); PyTorch's DataLoader warns "
            f"above the CPUs it may use), past Lightning's bound of {cap}, which keeps a CPU for the "
            "training's compute"
        )
    evidence.append(account.sentence())
    caveats = []
    settle = None
    if handover:
        caveats.append(
            f"each batch a worker loads is handed to the training process (pickled through shared memory): up "
            f"to {WORKER_HANDOVER_MS:g} ms per batch where batches are small and the CPUs few, which a run with "
            "num_workers=0 cannot show; the interval's low end counts it"
        )
        settle = (
            f"a worker's hand-over of each batch (up to {WORKER_HANDOVER_MS:g} ms) may cost more than the "
            f"{d - wait(w):.1f} ms of waiting per micro-batch the worker(s) would save; rerun with num_workers={w} "
            "and compare the runs with `tuneup compare`"
        )
    if competes:
        caveats.append(
            f"{account.sentence()}: {w} worker(s) compete with the training, so the low end counts only workers "
            "with a CPU of their own (with none, loading and training take turns: no gain)"
        )
        settle = (
            f"{account.sentence()}, so {w} worker(s) would take their CPU from the training; run it with more "
            "CPUs per rank (or fewer other processes on the host) and measure"
        )
    if threads is not None:
        settle = (
            f"{account.sentence()}; the loading is CPU work and {w} worker(s) with {threads} compute thread(s) "
            f"keep all {cores} CPUs "
            "busy, where a CPU can run up to "
            f"{BUSY_CPU_SLOWDOWN:g}x slower beside busy neighbours; rerun with num_workers={w} and "
            f"torch.set_num_threads({threads}) and compare samples/s"
        )
    changes = [Change("num_workers", str(w0), str(w))]
    args: dict[str, object] = {"num_workers": w}
    if threads is not None:
        changes.append(Change("torch intra-op threads", str(round(before)), str(threads)))
        evidence.append(
            f"{main_why}: {threads} thread(s) leave {w} core(s) of the {cores} free to the workers; compute "
            f"({compute:.1f} ms per micro-batch) may run up to {worst:.1f}x slower on them, which "
            "the interval's low end assumes"
        )
    if o.on_gpu and o.pin_memory is False:
        changes.append(Change("pin_memory", "False", "True"))
        args["pin_memory"] = True
    elif not o.on_gpu:
        ctx.skip("pin_memory", "a CPU run: page-locked memory only speeds host-to-GPU copies")
    reloads = _loader_restarts(ctx)
    if o.persistent_workers is not True and reloads:
        changes.append(Change("persistent_workers", str(o.persistent_workers), "True"))
        args["persistent_workers"] = True
        caveats.append(
            f"persistent_workers keeps the workers alive across {reloads}, instead of starting them again"
        )
    elif o.persistent_workers is not True:
        ctx.skip("persistent_workers", "one epoch and no validation seen: the workers start once either way")
    if loader.stall_count:
        changes.append(Change("prefetch_factor", "2", str(PREFETCH_WITH_STALLS)))
        args["prefetch_factor"] = PREFETCH_WITH_STALLS
        evidence.append(
            f"{loader.stall_count} stall(s) (a wait above {loader.stall_threshold_ms or 0:.1f} ms): a deeper queue "
            "per worker absorbs a slow batch"
        )
    else:
        ctx.skip("prefetch_factor", "no data stalls recorded: the default 2 batches per worker is enough")
    caveats.append(
        "each worker holds a copy of the Dataset object and prefetch_factor batches: watch host memory"
    )
    python, yaml = ctx.code.dataloader(args, threads, w)
    rec = ctx.recommendation(
        "data_loading.num_workers",
        f"Load batches in {w} DataLoader worker(s)",
        changes,
        proposed,
        evidence,
        (python, yaml),
        caveats=caveats,
        confidence="low" if competes or threads is not None else "medium",
        settle=settle,
    )
    return [rec] if rec is not None else []


def waiting_max_workers(cpu_count: int, local_ranks: int) -> int:
    """The most workers proposed for loading that waits (storage, the network, a sleep): as many as the rank's
    share of the CPUs. Such workers sleep while they wait, so they need no CPU beside the training, unlike
    Lightning's bound, which leaves one for the main process; PyTorch's DataLoader itself warns only above the
    CPUs the process may use. Each worker still holds a copy of the Dataset and its prefetched batches."""
    return max(1, cpu_count // max(1, local_ranks))


def _fewer(ctx: AdviceContext, w0: int) -> None:
    """More workers than Lightning's bound: they share the rank's CPUs with the training and each other. The
    number is the account's: the whole CPUs per rank spare for workers, within the bound (0: the main
    process loads, where the training leaves no CPU spare). No gain is predicted (the loading's CPU work is
    the same however many workers share it, and how much the extra workers slowed the training is not in
    the record), so it is not a recommendation: the report's and `show`'s findings carry it too
    (tuneup/analyze/findings.py, too_many_workers)."""
    o = ctx.observation
    cpus = o.cpu_count or 1
    cap = lightning_max_workers(cpus, o.ranks_per_node)
    account = _account(ctx, w0)
    target = min(cap, math.floor(account.spare + CORE_SLACK))
    python, _ = ctx.code.dataloader({"num_workers": target})
    ctx.skip(
        f"num_workers {w0} → {target}",
        f"too many workers: num_workers={w0} is above Lightning's bound of {cap} (max(1, {cpus} CPUs // "
        f"{o.ranks_per_node} local rank(s) − 1)); {account.sentence()}, so {target} worker(s)"
        + (" (the main process loads)" if target == 0 else "")
        + ". Workers beyond the CPUs take turns on them with the training, and each holds a copy of the "
        f"Dataset and its prefetched batches. Not a recommendation only because no speed-up can be predicted "
        "(the loading's CPU work is the same however many workers share it, and how much the extra workers "
        f"slowed the training is not in the record): apply `{python.splitlines()[-1]}`, rerun, and compare the "
        "runs with `tuneup compare`",
    )


# Loading counts as waiting (storage, the network, a sleep) only where at most this share of the measured wait
# can have been CPU work; above it the worker needs CPU time of its own, which a rank may not have spare.
WAITING_CPU_SHARE = 0.25


def _loading_is_cpu_work(ctx: AdviceContext, w0: int) -> bool:
    """Whether the loading keeps a CPU busy. With num_workers=0 the main process loads, and its CPU time per
    step (telemetry's mean process CPU x the mean step) bounds what the loading can have used: less the
    compute on torch's intra-op threads (OMP_NUM_THREADS where recorded, else the rank's share of the CPUs, as
    torch and Lightning default) and the optimizer on one (the exposed wait for collectives is not
    subtracted: gloo's threads reduce on the CPU there, but how much is not recorded). Waiting that the
    process does elsewhere (a DDP rank idles in its collectives; a 2-rank MLP at 63% CPU still spent all but 0.8 ms
    of its 7.6 ms wait on the CPU, and one worker then gained nothing) does not lower the bound. Loading
    counts as waiting only where that bound is a small share of the wait. Unknown counts as CPU work."""
    o = ctx.observation
    cpu = [p.cpu_percent_mean for p in ctx.analysis.telemetry.processes if p.cpu_percent_mean is not None]
    if w0 != 0 or not cpu or o.data_ms <= 0:
        return True
    cpu_ms = sum(cpu) / len(cpu) / 100.0 * o.step_mean_ms  # CPU time per step, every thread summed
    threads = _omp_threads(ctx) or max(1.0, float((o.cpu_count or 1) // o.ranks_per_node))
    busy_ms = o.compute_per_micro_batch_ms * o.accumulation * threads + o.optimizer_ms
    loading_cpu_ms = min(o.data_ms, max(0.0, cpu_ms - busy_ms))
    return loading_cpu_ms > WAITING_CPU_SHARE * o.data_ms


def _loader_restarts(ctx: AdviceContext) -> str | None:
    """Why the training loader's workers would start more than once, from the run's own record."""
    run = ctx.analysis.run
    timeline = ctx.analysis.timeline
    validations = 0
    if timeline is not None:
        validations = next((p.count or 0 for p in timeline.parts if p.name == "validation"), 0)
    if validations:
        return f"the {validations} validation run(s) recorded"
    if run.max_epochs is not None and run.max_epochs > 1:
        return f"{run.max_epochs} epochs (max_epochs)"
    return None
