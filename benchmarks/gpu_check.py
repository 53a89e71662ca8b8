"""The checks that need a GPU, in one script that fits the device machine's time (under 8 minutes).

    python benchmarks/gpu_check.py [--out DIR] [--quick]

Run on a CUDA machine; it prints one table per check and a JSON summary at the end (also written to
DIR/gpu_check.json). Nothing here asserts: the numbers go into the closing note of the issue that ran it.
Each check is independent; one that fails prints its error and the others still run.

Checks (grown issue by issue):

1. environment: torch, CUDA, the GPU, NVML (nvidia-ml-py) as tuneup's sensor sees it.
2. phases on the device (issue 12): a GAN with manual optimization (two optimizers), a one-optimizer
   manual loop and automatic optimization with accumulation, each with a known delay of *device* time
   injected into every phase (`torch.cuda._sleep`, calibrated here with CUDA events). tuneup's step clock
   times phases with CUDA events on a GPU; each injected delay must come back in its phase within 10%
   (or 2 ms), step ids must be consecutive, and steps/s must match the loop's own clock.
3. the job timeline on a GPU (issue 12): validation and checkpoint saves with known delays; the parts
   must sum to the fit's wall time, which must match the caller's clock within 2%.
4. operator drill-down on a GPU (issue 12): `profile_steps=3`; the report must show device (CUDA) time
   per operator, and the trace must load as JSON.
5. telemetry (issue 12): NVML utilization and power samples in the record; the process tree's memory
   measure (PSS).
6. no host-device synchronization (issue 13): `torch.cuda.set_sync_debug_mode("warn")` around steps
   20-60 of a CUDA fit, with and without the callback; the synchronizing calls each thread made. tuneup
   must add none on the training thread.
7. overhead on a GPU (issue 13): steps of ~10 ms and ~100 ms of device time, with and without the
   callback, interleaved, medians of repeats.
8. workload sweep (issue 14): a small transformer-shaped model (token embedding, MLP blocks, head) recorded
   at several batch sizes, 32-true and bf16-mixed, and with accumulation; the run directories are packed
   into DIR/sweep_runs.tgz so that the step-time model can be fitted on some and checked against the
   others (`benchmarks/predict.py --runs`), and each run's measured step time, MFU and peak memory printed.
9. advice on the device (issue 14): from the sweep, the step-time model fitted at batch 8, 16 and 32
   (32-true) predicts batch 24 and 64 and accumulation 4 (goal: within 10%); the bf16-mixed
   recommendation's predicted step against the measured bf16 run; the memory the batch advice predicts
   at batch 64 against the allocator's measured peak.
10. tuning on the device (issue 15): `tuneup tune` over micro-batch x precision x workers of a LightningCLI
   transformer whose largest micro-batches cannot fit in the GPU's memory: those trials must come back
   "infeasible" (out of memory, larger ones ruled out without a trial), never a crash, and the session must
   end with a winner confirmed (or not) by the compare rule. Prints the trial table and the result.
11. the synchronisation strategy under NCCL (issue 16), one GPU so world size 1: fp16, bf16 (NCCL only),
   PowerSGD and local SGD train through TuneupDDPStrategy with the hook on CUDA tensors; bytes cut per
   mode from the strategy's count (expected 2, 2, >= 10); a faulty PowerSGD falls back within 50 steps.
12. sharded training (issue 27): FSDP2 (`fully_shard` per block through ModelParallelStrategy, one GPU) with
   fp32 parameters (in both Lightning namespaces), with a bf16 mixed-precision policy, and with activation
   checkpointing; and FSDP1 (Lightning's FSDPStrategy, GPU only) in both namespaces
   (benchmarks/sharded_workload.py, AdamW): tuneup's memory by kind against what the kinds must be (4 bytes
   per parameter held, 4 per gradient, 8 + a step scalar per parameter of AdamW state) and its peak
   against `torch.cuda.max_memory_allocated` read by the script at the fit's end; checkpointing must lower
   what the peak held beyond parameters, gradients and optimizer state.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS: dict[str, Any] = {}
# "gpu" on the device machine; "cpu" with --dry-run, which runs every check's code on the CPU (host delays
# instead of device ones) so that a mistake is found here, not in the device's few minutes.
ACCELERATOR = "gpu"


def check(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> None:
            print(f"\n== {name} ==", flush=True)
            started = time.perf_counter()
            try:
                RESULTS[name] = fn(*args, **kwargs)
            except Exception as exc:
                traceback.print_exc()
                RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"({time.perf_counter() - started:.1f} s)", flush=True)

        return run

    return wrap


# -- device delays -------------------------------------------------------------------------------------


class DeviceDelay:
    """Injects `ms` of GPU time with torch.cuda._sleep (a spin kernel), calibrated against CUDA events."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.host = ACCELERATOR == "cpu"
        if self.host:
            return
        cycles = 1_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # warm the kernel up
        samples = []
        for _ in range(5):
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        self.cycles_per_ms = cycles / statistics.median(samples)

    def __call__(self, ms: float) -> None:
        if ms > 0 and self.host:
            end = time.perf_counter() + ms / 1000.0
            while time.perf_counter() < end:
                pass
        elif ms > 0:
            self.torch.cuda._sleep(int(ms * self.cycles_per_ms))


def _modules(delay: DeviceDelay, d: dict[str, float], kind: str) -> tuple[Any, Any, Any]:
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:  # type: ignore[override]
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
            delay(d["backward"])
            return grad

    class SlowSGD(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            delay(d["optimizer"])
            super().step()
            return loss

    class Loop(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = kind == "automatic"
            self.net = torch.nn.Linear(64, 64)
            self.head = torch.nn.Linear(64, 1)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            delay(d["data"])  # device time the step waits for its batch (a transfer's stand-in)
            return batch

        def _loss(self, x: Any, head: Any) -> Any:
            delay(d["forward"])
            return SlowBackward.apply(head(self.net(x)).pow(2).mean())

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            if kind == "automatic":
                return self._loss(x, self.head)
            if kind == "gan":
                opt_d, opt_g = self.optimizers()
                for opt, head in ((opt_d, self.head), (opt_g, torch.nn.Identity())):
                    self.toggle_optimizer(opt)
                    self.manual_backward(self._loss(x, head))
                    opt.step()
                    opt.zero_grad()
                    self.untoggle_optimizer(opt)
                return None
            opt = self.optimizers()
            self.manual_backward(self._loss(x, self.head))
            opt.step()
            opt.zero_grad()
            return None

        def configure_optimizers(self) -> Any:
            if kind == "gan":
                return [SlowSGD(self.head.parameters(), lr=0.01), SlowSGD(self.net.parameters(), lr=0.01)]
            return SlowSGD(self.parameters(), lr=0.01)

    loader = DataLoader(TensorDataset(torch.randn(4096, 64)), batch_size=32)
    return L, Loop(), loader


@check("phases on the device")
def phases(out: Path, steps: int) -> dict[str, Any]:
    from tuneup import TuneupCallback, load_run
    from tuneup.analyze.analysis import analyze_run

    delay = DeviceDelay()
    injected = {"data": 2.0, "forward": 3.0, "backward": 4.0, "optimizer": 1.5}
    calls = {
        "gan": {"data": 1, "forward": 2, "backward": 2, "optimizer": 2},
        "manual": {"data": 1, "forward": 1, "backward": 1, "optimizer": 1},
        "automatic": {"data": 2, "forward": 2, "backward": 2, "optimizer": 1},
    }
    results: dict[str, Any] = {}
    print(f"{'loop':<10} {'phase':<10} {'injected ms':>12} {'measured ms':>12} {'error':>8}")
    for kind, per in calls.items():
        L, module, loader = _modules(delay, injected, kind)
        run_dir = out / f"phases-{kind}"
        cb = TuneupCallback(dirpath=run_dir, count_flops=False)
        trainer = L.Trainer(
            accelerator=ACCELERATOR, devices=1, max_steps=steps * (2 if kind == "gan" else 1),
            accumulate_grad_batches=2 if kind == "automatic" else 1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[cb], default_root_dir=str(out),
        )  # fmt: skip
        trainer.fit(module, loader)
        run = load_run(run_dir)
        recorded = run.steps(0)
        steady = recorded[5:]
        row: dict[str, Any] = {
            "timing": run.ranks[0].info.timing,
            "consecutive_ids": [s.step for s in recorded] == list(range(len(recorded))),
            "steps_per_s": analyze_run(run).throughput.steps_per_s,
        }
        for phase, n in per.items():
            want = n * injected[phase]
            got = statistics.median(getattr(s, f"{phase}_ms") for s in steady)
            row[phase] = {"injected_ms": want, "measured_ms": got}
            print(f"{kind:<10} {phase:<10} {want:>12.2f} {got:>12.2f} {got / want - 1:>+8.1%}")
        print(
            f"{kind:<10} timing={row['timing']} consecutive ids={row['consecutive_ids']} steps/s={row['steps_per_s']:.1f}"
        )
        results[kind] = row
    return results


@check("job timeline and badput ledger on the device")
def timeline(out: Path) -> dict[str, Any]:
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup import TuneupCallback
    from tuneup.report import analyze

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(64, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(0.02)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            time.sleep(0.05)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    run_dir = out / "timeline"
    data = DataLoader(TensorDataset(torch.randn(2048, 64)), batch_size=32)
    trainer = L.Trainer(
        accelerator=ACCELERATOR, devices=1, max_steps=60, val_check_interval=20, limit_val_batches=3, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out),
        callbacks=[TuneupCallback(dirpath=run_dir), L.callbacks.ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=20)],
    )  # fmt: skip
    started = time.perf_counter()
    trainer.fit(Module(), data, DataLoader(TensorDataset(torch.randn(256, 64)), batch_size=32))
    fit_s = time.perf_counter() - started
    analysis = analyze(run_dir)
    tl, ledger = analysis.timeline, analysis.badput
    assert tl is not None and ledger is not None
    parts = {p.name: (round(p.seconds, 3), p.count) for p in tl.parts}
    print(
        f"fit around trainer.fit {fit_s:.3f} s; timeline {tl.fit_wall_s:.3f} s ({tl.fit_wall_s / fit_s - 1:+.1%})"
    )
    for name, (seconds, count) in parts.items():
        print(f"  {name:<18} {seconds:>8.3f} s  {count if count is not None else ''}")
    # The badput ledger (issue 29) on CUDA-event step times: it must add up to the fit's wall time, and the
    # injected validation (3 batches x 20 ms, 3 times) and saves (50 ms each) come back in their categories.
    categories = {c.name: round(c.seconds, 3) for c in ledger.categories}
    added = sum(c.seconds for c in ledger.categories)
    print(
        f"badput ledger: {ledger.wall_s:.3f} s, categories add up to {added:.3f} s ({added / ledger.wall_s - 1:+.2%})"
    )
    for name, seconds in categories.items():
        print(f"  {name:<22} {seconds:>8.3f} s")
    return {"fit_s": fit_s, "timeline_s": tl.fit_wall_s, "parts": parts, "ledger": categories}


@check("operator drill-down on the device")
def operators(out: Path) -> dict[str, Any]:
    from tuneup import TuneupCallback
    from tuneup.report import analyze

    delay = DeviceDelay()
    L, module, loader = _modules(delay, {"data": 0, "forward": 0, "backward": 0, "optimizer": 0}, "gan")
    run_dir = out / "operators"
    trainer = L.Trainer(
        accelerator=ACCELERATOR, devices=1, max_steps=40, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out),
        callbacks=[TuneupCallback(dirpath=run_dir, profile_steps=3, profile_start_step=5)],
    )  # fmt: skip
    trainer.fit(module, loader)
    trace = json.loads((run_dir / "rank-0" / "trace.json").read_text())
    ops = analyze(run_dir).operators
    assert ops is not None
    found: dict[str, Any] = {"trace_events": len(trace["traceEvents"]), "device": ops.device}
    for phase in ops.phases:
        top = [(o.name, o.self_cpu_ms_per_step, o.device_ms_per_step) for o in phase.operators[:3]]
        found[phase.phase] = top
        print(f"  {phase.phase:<10} device {phase.device_ms_per_step} ms/step; top: {top}")
    return found


@check("telemetry")
def telemetry(out: Path) -> dict[str, Any]:
    from tuneup.report import analyze

    run_dir = out / "phases-manual"
    tel = analyze(run_dir).telemetry
    gpus = [(g.index, g.util_percent_mean, g.power_w_mean) for g in tel.gpus]
    memory = [(p.memory_measure, p.memory_bytes_max) for p in tel.processes]
    print(f"  GPUs (index, util %, power W): {gpus}")
    print(f"  process memory (measure, peak bytes): {memory}")
    return {"gpus": gpus, "memory": memory}


def _device_fit(
    out: Path,
    step_ms: float,
    steps: int,
    with_tuneup: bool,
    delay: DeviceDelay,
    callbacks: list[Any] | None = None,
    accumulate: int = 1,
) -> list[float]:
    """A fit whose step is a small model plus `step_ms` of device time (torch.cuda._sleep): times of
    batch ends (host clock), the device synchronized at the end."""
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup import TuneupCallback

    width = 1024 if ACCELERATOR == "gpu" else 64  # on the CPU of a dry run, the delay is the step

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.ends.append(time.perf_counter())

    class M(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.m = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            delay(step_ms)  # the step's device time: the host runs ahead unless someone synchronizes
            loss = self.m(batch[0]).pow(2).mean()
            # Recorded by tuneup at the logging interval (issue 28): reading it must not synchronize either.
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.001)

    timer = Timer()
    tuneup = [TuneupCallback(dirpath=Path(tempfile.mkdtemp(dir=out)))] if with_tuneup else []
    trainer = L.Trainer(
        accelerator=ACCELERATOR, devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[*tuneup, *(callbacks or []), timer],
        default_root_dir=str(out), accumulate_grad_batches=accumulate, log_every_n_steps=5,
    )  # fmt: skip
    data = torch.randn(steps * accumulate * 64, width)
    trainer.fit(M(), DataLoader(TensorDataset(data), batch_size=64))
    if ACCELERATOR == "gpu":
        torch.cuda.synchronize()
    return timer.ends


@check("no host-device synchronization (sync debug mode)")
def sync_debug(out: Path) -> dict[str, Any]:
    """torch.cuda.set_sync_debug_mode("warn") from step 20 to step 60 of a fit: every synchronizing CUDA
    call warns, in the thread that made it. The training thread must see as many with tuneup as without
    (Lightning's own, if any); tuneup's writer thread may read a finished step's loss and the logged
    metrics it copied without blocking (reported). Both arms log `train_loss` every 5 steps (issue 28)."""
    import threading
    import warnings

    import lightning.pytorch as L
    import torch

    if ACCELERATOR != "gpu":
        print("  dry run: sync debug mode needs CUDA; the fits below run without it")

    seen: list[tuple[str, str]] = []

    class SyncWatch(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if ACCELERATOR == "gpu" and trainer.global_step in (20, 60):
                torch.cuda.set_sync_debug_mode("warn" if trainer.global_step == 20 else "default")

    def record(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message):
            seen.append((threading.current_thread().name, str(message)[:120]))

    delay = DeviceDelay()
    result: dict[str, Any] = {}
    original = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        try:
            # Accumulation 2: tuneup's noise scale then takes the first micro-batch's gradient norm on the
            # device every step (issue 14), which must not synchronize either.
            for arm in ("baseline", "tuneup"):
                seen.clear()
                _device_fit(out, 5.0, 80, arm == "tuneup", delay, callbacks=[SyncWatch()], accumulate=2)
                by_thread: dict[str, int] = {}
                for thread, _ in seen:
                    by_thread[thread] = by_thread.get(thread, 0) + 1
                result[arm] = {"by_thread": by_thread, "first": seen[:3]}
                print(f"  {arm}: synchronizing calls by thread, steps 20-60: {by_thread or 'none'}")
        finally:
            warnings.showwarning = original
            if ACCELERATOR == "gpu":
                torch.cuda.set_sync_debug_mode("default")
    main_base = result["baseline"]["by_thread"].get("MainThread", 0)
    main_tuneup = result["tuneup"]["by_thread"].get("MainThread", 0)
    result["training_thread_added"] = main_tuneup - main_base
    print(f"  synchronizations tuneup added on the training thread: {main_tuneup - main_base}")
    return result


@check("overhead on the device")
def overhead(out: Path, repeats: int) -> dict[str, Any]:
    """Steps of ~10 ms and ~100 ms of device time, with and without the callback, interleaved (A, B, B,
    A, ...); the median over repeats of each fit's median step. With no synchronization the host's work
    hides behind the device's: the difference should be within the device's own jitter."""
    delay = DeviceDelay()
    results = {}
    # ~10 and ~100 ms of device time; a dry run uses host delays of 2 and 10 ms.
    for step_ms in (10.0, 100.0) if ACCELERATOR == "gpu" else (2.0, 10.0):
        steps = 150 if step_ms <= 10 else 40
        pairs = []
        for r in range(repeats):
            arms = (False, True) if r % 2 == 0 else (True, False)
            times = {}
            for with_tuneup in arms:
                ends = _device_fit(out, step_ms, steps, with_tuneup, delay)
                gaps = [b - a for a, b in zip(ends[steps // 5 :], ends[steps // 5 + 1 :], strict=False)]
                times[with_tuneup] = statistics.median(gaps) * 1000.0
            pairs.append((times[False], times[True]))
        base = statistics.median(p[0] for p in pairs)
        with_cb = statistics.median(p[1] for p in pairs)
        results[step_ms] = {"baseline_ms": base, "tuneup_ms": with_cb, "overhead": with_cb / base - 1}
        print(
            f"  ~{step_ms:g} ms of device time: baseline {base:.3f} ms/step, tuneup {with_cb:.3f} ms/step "
            f"({with_cb / base - 1:+.2%})"
        )
    return results


def _sweep_module(batch_size: int, width: int, depth: int, seq: int, vocab: int) -> Any:
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Sweep(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = batch_size  # BatchSizeFinder's convention, which tuneup's advice also uses
            self.embed = torch.nn.Embedding(vocab, width)
            self.blocks = torch.nn.Sequential(*[Block() for _ in range(depth)])
            self.head = torch.nn.Linear(width, vocab)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (tokens,) = batch
            logits = self.head(self.blocks(self.embed(tokens[:, :-1])))
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

        def train_dataloader(self) -> Any:
            data = torch.randint(0, vocab, (self.batch_size * 64, seq + 1))
            return DataLoader(
                TensorDataset(data), batch_size=self.batch_size, pin_memory=ACCELERATOR == "gpu"
            )

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return Sweep()


@check("workload sweep (runs for the step-time model)")
def sweep(out: Path, steps: int) -> dict[str, Any]:
    import tarfile

    import lightning.pytorch as L
    import torch

    from tuneup import TuneupCallback, load_run
    from tuneup.analyze.analysis import analyze_run

    gpu = ACCELERATOR == "gpu"
    shape = (
        {"width": 1024, "depth": 8, "seq": 256, "vocab": 8192}
        if gpu
        else {"width": 64, "depth": 2, "seq": 16, "vocab": 128}
    )
    # (precision, batch size, accumulation): fit on 8/16/32 at 32-true; 24 and 64 are unseen sizes; bf16 and
    # accumulation 4 check the precision and accumulation predictions.
    arms = [("32-true", b, 1) for b in (8, 16, 32, 24, 64)] + [("32-true", 16, 4)]
    arms += [("bf16-mixed", b, 1) for b in (8, 16, 32, 64)]
    root = out / "sweep"
    results = {}
    print(
        f"{'precision':<11} {'batch':>5} {'accum':>5} {'median ms':>10} {'MFU':>7} {'peak GiB (torch)':>17} {'recorded GiB':>13}"
    )
    for precision, batch, accumulate in arms:
        name = f"{precision}-b{batch}-a{accumulate}"
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        trainer = L.Trainer(
            accelerator=ACCELERATOR, devices=1, max_steps=steps, precision=precision, accumulate_grad_batches=accumulate,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[TuneupCallback(dirpath=root / name)], default_root_dir=str(out),
        )  # fmt: skip
        trainer.fit(_sweep_module(batch, **shape))
        peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
        run = load_run(root / name)
        analysis = analyze_run(run)
        step_ms = statistics.median(s.wall_ms for s in run.steps(0)[steps // 4 :])
        mfu = analysis.cost.flops.mfu if analysis.cost is not None else None
        peaks = [s.peak_mem_bytes for s in run.steps(0) if s.peak_mem_bytes is not None]
        recorded = max(peaks) / 2**30 if peaks else None
        ns = analysis.noise_scale
        results[name] = {"step_ms": step_ms, "mfu": mfu, "peak_gib": peak, "recorded_peak": recorded,
                         "b_simple": ns.b_simple if ns else None}  # fmt: skip
        if ns is not None:
            print(
                f"  noise scale of {name}: B_simple {ns.b_simple} [{ns.ci_low}, {ns.ci_high}] over {ns.steps} steps ({ns.method})"
            )
        print(f"{precision:<11} {batch:>5} {accumulate:>5} {step_ms:>10.2f} {mfu if mfu is not None else '-':>7} "
              f"{peak if peak is not None else '-':>17} {recorded if recorded is not None else '-':>13}")  # fmt: skip
        del trainer
    with tarfile.open(out / "sweep_runs.tgz", "w:gz") as tar:
        tar.add(root, arcname="sweep")
    print(f"  packed {out / 'sweep_runs.tgz'} ({(out / 'sweep_runs.tgz').stat().st_size / 1e6:.1f} MB)")
    return results


@check("advice on the device (step-time model, bf16, memory)")
def advice_check(out: Path) -> dict[str, Any]:
    from tuneup.advise import AdviceOptions, advise
    from tuneup.advise.model import Setting
    from tuneup.advise.observe import observe
    from tuneup.advise.step_model import fit_step_model
    from tuneup.report import analyze

    root = out / "sweep"
    fit = [observe(analyze(root / f"32-true-b{b}-a1")) for b in (16, 8, 32)]
    model = fit_step_model(fit)
    result: dict[str, Any] = {}
    print(f"{'unseen run':<22} {'predicted median ms':>28} {'measured':>10} {'error':>8}")
    for name, batch, accumulation in (
        ("32-true-b24-a1", 24, 1),
        ("32-true-b64-a1", 64, 1),
        ("32-true-b16-a4", 16, 4),
    ):
        measured = observe(analyze(root / name))
        p = model.predict(Setting(batch, accumulation, 1)).median_ms
        err = p.value / measured.step_median_ms - 1
        result[name] = {
            "predicted": p.value,
            "low": p.low,
            "high": p.high,
            "measured": measured.step_median_ms,
        }
        print(
            f"{name:<22} {f'{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]':>28} {measured.step_median_ms:>10.2f} {err:>+8.1%}"
        )
    for batch in (8, 32, 64):
        base = analyze(root / f"32-true-b{batch}-a1")
        advice = advise([base], AdviceOptions(whatif=False))
        rec = next((r for r in advice.recommendations if r.id == "precision.bf16"), None)
        measured_ms = analyze(root / f"bf16-mixed-b{batch}-a1").step_time.median_ms
        if rec is None or rec.predicted is None:
            print(
                f"  bf16 at batch {batch}: not recommended ({[c.reason for c in advice.considered if 'precision' in c.knob]})"
            )
            continue
        p = rec.predicted.step_ms
        inside = p.low <= measured_ms <= p.high  # type: ignore[operator]
        result[f"bf16-b{batch}"] = {
            "predicted": p.value,
            "low": p.low,
            "high": p.high,
            "measured": measured_ms,
        }
        print(f"  bf16-mixed at batch {batch}: predicted {p.value:.2f} ms [{p.low:.2f}, {p.high:.2f}], measured "
              f"{measured_ms:.2f} ms ({measured_ms / p.value - 1:+.1%} from the point; inside: {inside})")  # fmt: skip
    from tuneup.advise.memory import memory_model

    observations = [observe(analyze(root / f"32-true-b{b}-a1")) for b in (8, 16, 32)]
    line = memory_model(observations, observations[0])
    measured64 = observe(analyze(root / "32-true-b64-a1")).gpu_peak_allocated_bytes
    if line is not None and measured64:
        predicted64 = line.peak_bytes(64, 1)
        result["memory_b64"] = {"predicted_bytes": predicted64, "measured_bytes": measured64}
        print(f"  peak memory at batch 64: predicted {predicted64 / 2**30:.2f} GiB, measured {measured64 / 2**30:.2f} GiB "
              f"({predicted64 / measured64 - 1:+.1%}; {line.basis})")  # fmt: skip
    return result


TUNE_SCRIPT = """
import sys
import lightning.pytorch as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TunedLM(L.LightningModule):
    def __init__(self, width: int = 64, depth: int = 2, vocab: int = 128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, vocab)

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self.head(self.blocks(self.embed(tokens[:, :-1])))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Tokens(L.LightningDataModule):
    def __init__(self, batch_size: int = 8, num_workers: int = 0, seq: int = 16, vocab: int = 128):
        super().__init__()
        self.batch_size, self.num_workers, self.seq, self.vocab = batch_size, num_workers, seq, vocab

    def train_dataloader(self):
        data = torch.randint(0, self.vocab, (4096, self.seq + 1))
        return DataLoader(TensorDataset(data), batch_size=self.batch_size, num_workers=self.num_workers,
                          shuffle=True, persistent_workers=self.num_workers > 0)


if __name__ == "__main__":
    LightningCLI(TunedLM, Tokens, save_config_callback=None,
                 trainer_defaults={"max_steps": 1000, "logger": False, "enable_checkpointing": False,
                                   "enable_progress_bar": False, "enable_model_summary": False})
"""


@check("tuning on the device (tuneup tune: micro-batch x precision x workers, out of memory)")
def tune_check(out: Path) -> dict[str, Any]:
    import subprocess

    gpu = ACCELERATOR == "gpu"
    script = out / "tune_lm.py"
    script.write_text(TUNE_SCRIPT)
    tune_dir = out / "tune"
    if gpu:
        # Logits of batch x 1024 x 32768 floats: 128 MiB a sample in 32-true, so 512 and up cannot fit in the
        # H200's 141 GB with their gradients; 2048 never is tried once 512 ran out.
        model = ["--model.width=1024", "--model.depth=8", "--model.vocab=32768", "--data.seq=1024",
                 "--data.vocab=32768", "--trainer.accelerator=gpu", "--trainer.devices=1"]  # fmt: skip
        knobs = ["--batch-size", "8,32,128,512,2048", "--precision", "32-true,bf16-mixed", "--workers", "0,2"]
        budget = ["--max-trials", "8", "--max-minutes", "3", "--trial-steps", "60", "--confirm-runs", "1"]
    else:
        model = ["--trainer.accelerator=cpu", "--trainer.devices=1"]
        knobs = ["--batch-size", "4,8", "--precision", "32-true", "--workers", "0,1"]
        budget = ["--max-trials", "3", "--trial-steps", "40", "--min-steps", "20", "--confirm-runs", "1"]
    command = [sys.executable, "-m", "tuneup", "tune", "--out", str(tune_dir), "--accumulate", "1",
               *knobs, *budget, "--", sys.executable, str(script), "fit", "--data.batch_size=8", *model]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=330, check=False)
    print(proc.stdout[-6000:])
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
    state = json.loads((tune_dir / "tune.json").read_text())
    trials = [
        {
            k: t.get(k)
            for k in ("index", "role", "config", "status", "reason", "samples_per_s", "step_ms", "wall_s")
        }
        for t in state["trials"]
    ]
    return {
        "returncode": proc.returncode,
        "trials": trials,
        "infeasible": [t["config"] for t in trials if t["status"] == "infeasible"],
        "result": state.get("result"),
        "stopped_because": state.get("stopped_because"),
    }


def _run_for_result(command: list[str], run_out: Path, timeout_s: float) -> dict[str, Any]:
    """Run a workload script that writes RUN_OUT/result.json: that JSON, or {"returncode": N} (its stderr's
    tail printed) where it failed."""
    import subprocess

    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        print(proc.stderr[-2000:])
        return {"returncode": proc.returncode}
    return json.loads((run_out / "result.json").read_text())


@check("sync strategy")
def sync_check(out: Path) -> dict[str, Any]:
    """TuneupDDPStrategy under NCCL on the one GPU (world size 1): each compression mode trains, its comm
    hook runs on CUDA tensors, and the bytes it sends are what the mode promises; bf16 is accepted over
    NCCL (refused over gloo); a faulty compressor falls back. With one rank the all-reduce sums nothing and
    the probe (which needs 2 ranks) records no collective: the bytes are the strategy's own count."""

    workload = Path(__file__).resolve().parents[1] / "tests" / "workloads" / "sync_demo.py"
    modes: dict[str, tuple[dict[str, Any], list[str]]] = {
        "fp16": ({"compression": "fp16"}, []),
        "bf16": ({"compression": "bf16"}, []),
        "powersgd": ({"compression": "powersgd"}, []),
        "powersgd-fault": ({"compression": "powersgd"}, ["--fault", "-1"]),
        "local-sgd": ({"local_sgd_period": 4}, []),
    }
    results: dict[str, Any] = {}
    for name, (config, extra) in modes.items():
        if ACCELERATOR == "cpu" and name == "bf16":
            continue  # gloo refuses it (tested on the CPU)
        run_out = out / f"sync-{name}"
        command = [sys.executable, str(workload), str(run_out), "--devices", "1", "--steps", "60",
                   "--accelerator", ACCELERATOR, "--strategy", json.dumps({**config, "warmup_steps": 5}), *extra]  # fmt: skip
        result = _run_for_result(command, run_out, timeout_s=240)
        if "returncode" in result:
            results[name] = result
            continue
        summary = result["strategy"]
        # Sent against exact over the steps after the 5-step warm-up.
        warm = summary["exact_bytes"] / summary["hook_iterations"] * 5
        sent = summary["sent_bytes"] + summary["param_avg_bytes"]  # local SGD's averages too
        ratio = (summary["exact_bytes"] - warm) / max(1.0, sent - warm)
        results[name] = {
            "held_out_loss": round(result["held_out_loss"], 4),
            "bytes_cut": round(ratio, 2),
            "mode_at_end": summary["mode_at_end"],
            "fallbacks": [(f["step"], f["reasons"]) for f in summary["fallbacks"]],
            "checks": summary["checks"],
        }
        print(name, results[name], flush=True)
    return results


@check("sharded")
def sharded_check(out: Path, steps: int) -> dict[str, Any]:
    """FSDP2 on one GPU: memory by kind (tuneup/recording/memory_kinds.py) against the tensors' expected
    bytes and the allocator's peak, under three settings."""

    from tuneup import load_run

    workload = Path(__file__).resolve().parent / "sharded_workload.py"
    width = 1024 if ACCELERATOR == "gpu" else 64
    settings = {
        "fp32": [],
        "bf16-params": ["--bf16-params"],
        "checkpointing": ["--checkpointing"],
        "fp32-pytorch_lightning": ["--namespace", "pytorch_lightning"],
        # FSDP1 (Lightning's FSDPStrategy) runs on CUDA devices only.
        "fsdp1": ["--strategy", "fsdp1"],
        "fsdp1-pytorch_lightning": ["--strategy", "fsdp1", "--namespace", "pytorch_lightning"],
    }
    results: dict[str, Any] = {}
    for name, extra in settings.items():
        if ACCELERATOR == "cpu" and "fsdp1" in extra:
            print(f"{name}: skipped in a dry run (Lightning's FSDPStrategy needs CUDA)")
            continue
        run_out = out / f"sharded-{name}"
        command = [sys.executable, str(workload), str(run_out), "--accelerator", ACCELERATOR,
                   "--steps", str(steps), "--width", str(width), *extra]  # fmt: skip
        result = _run_for_result(command, run_out, timeout_s=300)
        if "returncode" in result:
            results[name] = result
            continue
        run = load_run(result["run_dir"])
        kinds = next((e for e in run.ranks[0].events if e.get("kind") == "memory_kinds"), None)
        if kinds is None:
            results[name] = {"error": "no memory_kinds event in the record"}
            continue
        n = result["parameters"]
        # AdamW: exp_avg and exp_avg_sq per parameter (fp32), one float32 `step` per parameter tensor.
        expected = {"parameters_bytes": 4 * n, "gradients_bytes": 4 * n, "optimizer_state_min": 8 * n}
        row = {
            "parameters": n,
            "parameters_bytes": kinds["parameters_bytes"],
            "parameters_bytes_expected": expected["parameters_bytes"],
            "gradients_bytes": kinds["gradients_bytes"],
            "optimizer_state_bytes": kinds["optimizer_state_bytes"],
            "optimizer_state_expected_at_least": expected["optimizer_state_min"],
            "tuneup_peak_bytes": kinds.get("peak_allocated_bytes"),
            "tuneup_other_at_peak_bytes": kinds.get("other_at_peak_bytes"),
            "allocator_peak_at_end_bytes": result["max_memory_allocated"],
        }
        results[name] = row
        print(name, json.dumps(row), flush=True)
    fp32, ckpt = results.get("fp32", {}), results.get("checkpointing", {})
    if fp32.get("tuneup_other_at_peak_bytes") and ckpt.get("tuneup_other_at_peak_bytes"):
        results["checkpointing_lowers_other_at_peak"] = (
            ckpt["tuneup_other_at_peak_bytes"] < fp32["tuneup_other_at_peak_bytes"]
        )
    return results


@check("environment")
def environment() -> dict[str, Any]:
    import torch

    from tuneup.collect.nvml import gpu_inventory

    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
        "inventory": gpu_inventory(),
    }
    print(json.dumps(info, indent=1, default=str)[:2000])
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where runs are written (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument(
        "--dry-run", action="store_true", help="run every check on the CPU, to test the script"
    )
    args = parser.parse_args(argv)
    import torch

    global ACCELERATOR
    if args.dry_run:
        ACCELERATOR = "cpu"
    elif not torch.cuda.is_available():
        print("no CUDA device: this script is for the device machine", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="tuneup-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    environment()
    phases(out, 30 if args.quick else 60)
    timeline(out)
    operators(out)
    telemetry(out)
    sync_debug(out)
    overhead(out, 2 if args.quick else 3)
    sweep(out, 30 if args.quick else 50)
    advice_check(out)
    tune_check(out)
    sync_check(out)
    sharded_check(out, 10 if args.quick else 20)
    (out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"\nwrote {out / 'gpu_check.json'}")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
