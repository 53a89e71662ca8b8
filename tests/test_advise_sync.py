"""The advice that prints tuneup's DDP strategy: its code per Lightning namespace, and the local SGD
recommendation's prediction, on synthetic observations (no training)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.archives import extract_all
from tests.synthetic import make_run
from tests.test_advise import obs
from tuneup.advise import code, communication
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Recommendation, Setting
from tuneup.advise.observe import Observation, observe
from tuneup.advise.outcomes import Economics
from tuneup.advise.step_model import fit_step_model
from tuneup.analyze.model import CollectiveFit, RunAnalysis
from tuneup.report import analyze

NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
CLASSES = {"lightning.pytorch": "TuneupDDPStrategy", "pytorch_lightning": "PLTuneupDDPStrategy"}

# The worked example. A link of 100 us latency and 1 ns per byte; two buckets of 1 MB at 2 ranks: the ring
# model gives each 2(p-1)·α + 2(p-1)/p·n·β = 0.2 + 1.0 = 1.2 ms, 2.4 ms for both; the run measured 12 ms,
# so the model is held to 5x the link fit. 20 ms of compute per micro-batch (a third forward), 8 ms of the
# collectives exposed after backward, 2 ms optimizer, 0.5 ms the loop: a 30.5 ms step.
FIT = CollectiveFit("all_reduce", alpha_us=100.0, beta_ns_per_byte=1.0, busbw_gbytes_per_s=1.0,
                    r_squared=1.0, points=10, sizes=3, notes=[])  # fmt: skip
GPU_RUN = dict(on_gpu=True, backend="nccl", cpu_count=64, bucket_bytes=(1_000_000, 1_000_000), fits=(FIT,))


def material(**kw: object) -> Observation:
    fields: dict[str, object] = {**GPU_RUN, "comm_ms": 12.0, "exposed_ms": 8.0, "comm_bytes": 2e6, **kw}
    return obs(16, 20.0, world=2, **fields)


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunAnalysis]:
    """A recorded run (only its namespace is read here), once per Lightning namespace."""
    a = analyze(make_run(tmp_path_factory.mktemp("sync") / "run", world_size=2))
    return {ns: dataclasses.replace(a, run=dataclasses.replace(a.run, namespace=ns)) for ns in NAMESPACES}


def context(analysis: RunAnalysis, o: Observation) -> AdviceContext:
    econ = Economics(None, None, None, o.samples_per_step)
    return AdviceContext(
        analysis=analysis, observation=o, model=fit_step_model([o]), economics=econ, objective="samples/s"
    )


def by_id(recs: list[Recommendation]) -> dict[str, Recommendation]:
    return {r.id: r for r in recs}


# -- the code --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_code_names_the_namespaces_class_and_its_yaml_imports(namespace: str) -> None:
    python, text = code.sync_strategy(namespace, {"compression": "fp16", "hierarchical": False})
    cls_name = CLASSES[namespace]
    assert f'strategy={cls_name}(compression="fp16", hierarchical=False)' in python
    assert f"from {namespace} import Trainer" in python
    ast.parse(python)  # `Trainer(..., strategy=...)` is valid Python
    # The Python's imports bind the namespace's class.
    bound: dict[str, object] = {}
    imports = [line for line in python.splitlines() if line.startswith("from ")]
    exec("\n".join(imports), bound)
    ddp = importlib.import_module(f"{namespace}.strategies").DDPStrategy
    (other_ns,) = set(NAMESPACES) - {namespace}
    other = importlib.import_module(f"{other_ns}.strategies").DDPStrategy
    assert isinstance(bound[cls_name], type) and issubclass(bound[cls_name], ddp)
    # The YAML: LightningCLI resolves class_path by import, and passes init_args as typed values.
    strategy = yaml.safe_load(text)["trainer"]["strategy"]
    assert strategy["init_args"] == {"compression": "fp16", "hierarchical": False}
    module, _, name = strategy["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert name == cls_name and issubclass(cls, ddp)
    # A Trainer of the other namespace would reject it.
    assert not issubclass(cls, other)


def test_unknown_namespace_falls_back_to_lightning_pytorch() -> None:
    python, text = code.sync_strategy(None, {"local_sgd_period": 4})
    assert "TuneupDDPStrategy(local_sgd_period=4)" in python and "PLTuneup" not in python
    assert yaml.safe_load(text)["trainer"]["strategy"]["init_args"] == {"local_sgd_period": 4}


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_fp16_recommendation_prints_the_strategy(analyses: dict[str, RunAnalysis], namespace: str) -> None:
    rec = by_id(communication.recommend(context(analyses[namespace], material())))[
        "communication.fp16_compression"
    ]
    assert f'strategy={CLASSES[namespace]}(compression="fp16")' in rec.code
    assert "ddp_comm_hook" not in rec.code and rec.yaml is not None and "ddp_comm_hook" not in rec.yaml
    assert [(c.knob, c.current, c.proposed) for c in rec.changes] == [("compression", "none", "fp16")]
    assert any("bf16" in c and "NCCL" in c for c in rec.caveats)


def test_powersgd_is_a_try_and_compare_without_a_prediction(analyses: dict[str, RunAnalysis]) -> None:
    ctx = context(analyses["lightning.pytorch"], material())
    communication.recommend(ctx)
    reason = {c.knob: c.reason for c in ctx.considered}["PowerSGD"]
    assert 'TuneupDDPStrategy(compression="powersgd")' in reason and "tuneup compare" in reason
    assert "hung" not in reason


# -- local SGD ---------------------------------------------------------------------------------------------


def test_local_sgd_step_by_hand() -> None:
    # The parameters' average as a run that averaged measured it: 11 ms (the figure the link fit gives too,
    # below). Every 4th step, fully exposed. No gradient collectives, no exposed wait: 20 compute + 2 optimizer
    # + 0.5 loop + 11/4.
    model = fit_step_model([material(averaging_ms=11.0)])
    four = model.predict(Setting(16, 1, 2, local_sgd_period=4))
    assert four.terms_ms["averaging"] == pytest.approx(11.0 / 4)
    assert "averaging_unmeasured" not in four.terms_ms
    assert four.terms_ms["exposed_comm"] == 0.0 and four.terms_ms["interference"] == 0.0
    assert four.mean_ms.value == pytest.approx(22.5 + 11.0 / 4)
    assert four.median_ms.value == pytest.approx(22.5)  # 3 steps of 4 do not average
    # Every other step: the median of two step times is their mean.
    two = model.predict(Setting(16, 1, 2, local_sgd_period=2))
    assert two.mean_ms.value == pytest.approx(22.5 + 11.0 / 2) == pytest.approx(two.median_ms.value)
    # The run itself is unchanged by the extension.
    assert model.predict(Setting(16, 1, 2)).mean_ms.value == pytest.approx(30.5)


def test_unmeasured_parameter_average_is_bounded_honestly() -> None:
    # Not measured: one flat all-reduce of 2 MB, 2·α + n·β = 0.2 + 2.0 = 2.2 ms by the fit (one latency, not
    # one per bucket), 11 ms held to the measured collectives, is only the low end. A 2-rank gloo run measured
    # 350 ms where this said 55 ms: the interval reaches 8x (88 ms), the point the geometric mean.
    model = fit_step_model([material()])
    four = model.predict(Setting(16, 1, 2, local_sgd_period=4))
    assert four.terms_ms["averaging"] == pytest.approx(11.0 * 8**0.5 / 4)
    assert four.terms_ms["averaging_unmeasured"] == 1.0
    assert four.mean_ms.low <= 22.5 + 11.0 / 4
    assert four.mean_ms.high >= 22.5 + 88.0 / 4  # slower than the 30.5 ms run itself: a loss is possible


def test_local_sgd_warmup_is_in_the_prediction_over_the_runs_length() -> None:
    # 150 steps, the strategy's first 50 exact (SyncConfig's default warm-up): a third of the run at 30.5 ms.
    model = fit_step_model([material(averaging_ms=11.0, run_steps=150)])
    four = model.predict(Setting(16, 1, 2, local_sgd_period=4))
    assert four.terms_ms["warmup_share"] == pytest.approx(50 / 150)
    assert four.mean_ms.value == pytest.approx((50 * 30.5 + 100 * (22.5 + 11.0 / 4)) / 150)
    assert four.mean_ms.low <= four.mean_ms.value <= four.mean_ms.high


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_local_sgd_recommended_when_communication_is_material(
    analyses: dict[str, RunAnalysis], namespace: str
) -> None:
    rec = by_id(communication.recommend(context(analyses[namespace], material(averaging_ms=11.0))))[
        "communication.local_sgd"
    ]
    assert rec.predicted is not None and rec.current is not None
    # 32 samples per step: 30.5 ms now, 25.25 ms on average with local SGD (test_local_sgd_step_by_hand).
    assert rec.current.samples_per_s.value == pytest.approx(32_000 / 30.5)
    assert rec.predicted.samples_per_s.value == pytest.approx(32_000 / 25.25)
    assert rec.gain.value == pytest.approx(30.5 / 25.25 - 1)  # +20.8%
    assert 0 < rec.gain.low < rec.gain.value < rec.gain.high
    assert f"strategy={CLASSES[namespace]}(local_sgd_period=4)" in rec.code
    assert yaml.safe_load(rec.yaml or "")["trainer"]["strategy"]["init_args"] == {"local_sgd_period": 4}
    assert [(c.knob, c.current, c.proposed) for c in rec.changes] == [("local_sgd_period", "None", "4")]
    assert any("11.0 ms as measured" in e and "every 4 steps" in e for e in rec.evidence)
    assert any("50 exact steps" in c and "falls back" in c for c in rec.caveats)
    assert any("global batch of 32" in c for c in rec.caveats)
    assert rec.confidence == "low"  # interference not measured: no one-rank run


def test_local_sgd_across_nodes_sets_what_it_predicts(analyses: dict[str, RunAnalysis]) -> None:
    rec = by_id(
        communication.recommend(
            context(analyses["lightning.pytorch"], material(num_nodes=2, averaging_ms=11.0))
        )
    )["communication.local_sgd"]
    assert "TuneupDDPStrategy(local_sgd_period=4, hierarchical=False)" in rec.code
    assert any("hierarchical=True" in c and "within each node every step" in c for c in rec.caveats)


def test_unmeasured_local_sgd_is_measure_first_not_a_recommendation(analyses: dict[str, RunAnalysis]) -> None:
    # Predicted +42.9% [+36.1, +50.4] and measured -15.5% and -5.7% (the average took 350 ms, not 55 ms):
    # unmeasured, the interval's low end is a loss, and the advice says to measure first.
    ctx = context(analyses["lightning.pytorch"], material())
    assert "communication.local_sgd" not in by_id(communication.recommend(ctx))
    reason = {c.knob: c.reason for c in ctx.considered}["local_sgd_period None → 4"]
    assert "measure first" in reason and "tuneup compare" in reason


def test_nothing_the_run_already_has(analyses: dict[str, RunAnalysis]) -> None:
    # A run already averaging every 4 steps was told "Average the parameters every 4 steps".
    ctx = context(analyses["lightning.pytorch"], material(local_sgd_period=4, averaging_ms=11.0))
    recs = by_id(communication.recommend(ctx))
    assert "communication.local_sgd" not in recs and "communication.fp16_compression" not in recs
    reasons = {c.knob: c.reason for c in ctx.considered}
    assert "already uses TuneupDDPStrategy (local_sgd_period=4)" in reasons["local_sgd_period"]
    ctx = context(analyses["lightning.pytorch"], material(compression="fp16"))
    assert "communication.fp16_compression" not in by_id(communication.recommend(ctx))
    assert 'compression="fp16"' in {c.knob: c.reason for c in ctx.considered}["fp16 gradient compression"]


def test_no_local_sgd_when_communication_is_not_material(analyses: dict[str, RunAnalysis]) -> None:
    # 0.5 ms exposed of a 23 ms step: 2%, under the 5% that makes communication material.
    ctx = context(analyses["lightning.pytorch"], material(comm_ms=1.0, exposed_ms=0.5))
    assert communication.recommend(ctx) == []
    assert "under 5%" in {c.knob: c.reason for c in ctx.considered}["DDP communication"]


def test_no_local_sgd_without_the_gradients_size(analyses: dict[str, RunAnalysis]) -> None:
    ctx = context(analyses["lightning.pytorch"], material(bucket_bytes=(), fits=()))
    assert "communication.local_sgd" not in by_id(communication.recommend(ctx))
    assert "local_sgd_period" in {c.knob for c in ctx.considered}


def test_local_steps_cost_what_a_run_without_collectives_costs() -> None:
    # The model's local step agrees with a run that had no collectives at all: the same compute at one
    # rank's figures, plus the averaging.
    one_rank = obs(16, 20.0)
    alone = fit_step_model([one_rank]).predict(Setting(16, 1, 1)).mean_ms.value
    local = (
        fit_step_model([material(averaging_ms=11.0)])
        .predict(Setting(16, 1, 2, local_sgd_period=4))
        .mean_ms.value
    )
    assert local == pytest.approx(alone + 11.0 / 4)


def test_local_sgd_measured_by_a_run_given_is_judged_by_it(analyses: dict[str, RunAnalysis]) -> None:
    # The run that used TuneupDDPStrategy(local_sgd_period=4), passed beside the exact one: its average's
    # time is the model's, and the recommendation is the measured gain.
    exact = material()
    local = material(
        run_id="local", local_sgd_period=4, averaging_ms=40.0, step_mean_ms=26.0, step_median_ms=23.0
    )
    o = exact
    ctx = AdviceContext(
        analysis=analyses["lightning.pytorch"], observation=o, model=fit_step_model([exact, local]),
        economics=Economics(None, None, None, o.samples_per_step), objective="samples/s",
        model_observations=[exact, local],
    )  # fmt: skip
    assert ctx.model.averaging_ms == {2: 40.0}
    rec = by_id(communication.recommend(ctx))["communication.local_sgd"]
    assert rec.predicted is not None and rec.predicted.measured_run == local.run_id
    assert rec.gain.value == pytest.approx(exact.step_mean_ms / 26.0 - 1)
    assert any("40.0 ms as measured" in e for e in rec.evidence)
    from tuneup.report.advice import headline

    assert f"measured (run {local.run_id})" in headline(rec)


def test_the_strategy_a_run_used_is_read_from_its_record(tmp_path: Path) -> None:
    # Real TuneupDDPStrategy runs (2 gloo ranks, the demo transformer, 120 steps): the advice knows what the
    # run has, and a local SGD run's average as it measured it (its strategy-phase mean step over its local
    # median step, times H).
    with tarfile.open(Path(__file__).parent / "data" / "sync_runs.tgz") as tar:
        extract_all(tar, tmp_path)
    local = observe(analyze(tmp_path / "local4"))
    assert (local.local_sgd_period, local.compression, local.run_steps) == (4, None, 120)
    assert local.averaging_ms is not None and 0 < local.averaging_ms < local.step_median_ms
    assert observe(analyze(tmp_path / "fp16")).compression == "fp16"
    assert observe(analyze(tmp_path / "powersgd")).compression == "powersgd"
    # Advice on the local SGD run proposes no strategy: it has one.
    ctx = AdviceContext(
        analysis=analyze(tmp_path / "local4"), observation=local, model=fit_step_model([local]),
        economics=Economics(None, None, None, local.samples_per_step), objective="samples/s",
    )  # fmt: skip
    ids = {r.id for r in communication.recommend(ctx)}
    assert not ids & {"communication.local_sgd", "communication.fp16_compression"}
