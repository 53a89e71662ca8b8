"""The tuning session's report (tuneup.tune.render): built from hand-made sessions, nothing is trained."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuneup.advise.observe import Observation
from tuneup.report.blocks import Code
from tuneup.tune.render import (
    HTML_NAME,
    JSON_NAME,
    MD_NAME,
    PLOT_NAME,
    format_tune_text,
    gain_text,
    objective_of,
    plot_predicted_vs_measured,
    predicted_figures,
    settings_code,
    tune_sections,
    write_tune_report,
)
from tuneup.tune.space import Config, SearchSpace
from tuneup.tune.state import (
    FAILED,
    INFEASIBLE,
    OK,
    Prediction,
    Trial,
    TuneState,
    TuneStateError,
    load_state,
    save_state,
)


def knobs(b: int, a: int, w: int, hook: str, precision: str = "32-true") -> Config:
    """A configuration by its knobs' values (Config itself takes keywords only)."""
    return Config(batch_size=b, accumulate_grad_batches=a, num_workers=w, comm_hook=hook, precision=precision)


EVIL = "<script>alert('owned')</script>"
BASE = Config(
    batch_size=32, accumulate_grad_batches=1, num_workers=0, comm_hook="allreduce", precision="32-true"
)
WINNER = Config(
    batch_size=64, accumulate_grad_batches=1, num_workers=2, comm_hook="fp16", precision="32-true"
)


def _observation(config: Config, world: int = 2) -> Observation:
    return Observation(
        run_id="r", batch_size=config.batch_size or 1, accumulation=config.accumulate_grad_batches or 1,
        world_size=world, num_nodes=1, precision=config.precision, on_gpu=False, gpu_name=None,
        step_mean_ms=60.0, step_median_ms=59.0, data_ms=5.0, forward_ms=20.0, backward_ms=30.0,
        optimizer_ms=3.0, sync_ms=1.0, other_ms=1.0, comm_ms=None, exposed_ms=None, comm_bytes=None,
        bucket_bytes=(), fits=(), backend="gloo", samples_per_s=1000.0, tokens_per_sample=None,
        flops_per_sample=None, mfu=None, peak_tflops_per_device=None, usd_per_hour=None, devices_priced=None,
        parameters=1000, gpu_peak_allocated_bytes=None, gpu_mem_total_bytes=None, cpu_count=8,
        ranks_per_node=world, num_workers=config.num_workers, pin_memory=False, persistent_workers=False,
    )  # fmt: skip


def _trial(
    index: int,
    config: Config,
    role: str,
    rate: float | None,
    predicted: tuple[float, float, float] | None = None,
    status: str = OK,
    reason: str | None = None,
) -> Trial:
    name = f"{index:02d}-{role}"
    ok = status == OK
    return Trial(
        index=index,
        name=name,
        config=config,
        role=role,
        status=status,
        reason=reason,
        run_dir=f"trials/{name}/run",
        wall_s=40.0 + index,
        steps=200 if ok else None,
        step_ms=64_000.0 / rate if ok and rate else None,
        samples_per_s=rate if ok else None,
        objective=rate if ok else None,
        predicted=Prediction(*predicted) if predicted else None,
        observation=_observation(config) if ok else None,
    )


def _state(kept_current: bool = False, objective: str = "throughput", **options: Any) -> TuneState:
    trials = [
        _trial(0, BASE, "baseline", 1000.0),
        _trial(1, knobs(64, 1, 0, "allreduce"), "search", 1120.0, (1150.0, 1050.0, 1250.0)),
        _trial(2, WINNER, "search", 1260.0, (1300.0, 1150.0, 1450.0)),
        _trial(
            3,
            knobs(128, 1, 0, "allreduce"),
            "search",
            None,
            (1400.0, 1200.0, 1600.0),
            INFEASIBLE,
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        _trial(
            4,
            knobs(32, 1, 4, "allreduce"),
            "search",
            None,
            (1100.0, 1000.0, 1200.0),
            FAILED,
            f"exited: exception on rank 1: ValueError: {EVIL}",
        ),
        _trial(5, WINNER, "confirm", 1250.0),
        _trial(6, BASE, "confirm", 1010.0),
    ]
    if kept_current:
        result = {
            "best_trial": 2,
            "winner": BASE.as_dict(),
            "kept_current": True,
            "verdict": "INCONCLUSIVE",
            "reason": "throughput 25.0% higher, beyond the 5.0% threshold, but not significant (p = 0.09 >= 0.05 "
            "with 3 runs a side): run more repeats",
            "gain": 0.25,
            "gain_low": -0.05,
            "gain_high": 0.4,
            "baseline_rates": [1000.0, 1010.0, 995.0],
            "winner_rates": [1260.0, 1250.0, 1255.0],
        }
    else:
        result = {
            "best_trial": 2,
            "winner": WINNER.as_dict(),
            "kept_current": False,
            "verdict": "IMPROVEMENT",
            "reason": "throughput 25.1% higher (p = 0.002 < 0.05), beyond the 5.0% threshold",
            "gain": 0.25,
            "gain_low": 0.2,
            "gain_high": 0.3,
            "baseline_rates": [1000.0, 1010.0, 995.0],
            "winner_rates": [1260.0, 1250.0, 1255.0],
        }
    return TuneState(
        command=["python", "train.py", "fit", "--config", "cfg.yaml"],
        script_kind="cli",
        objective=objective,
        space=SearchSpace(
            batch_size=(16, 32, 64, 128),
            accumulate_grad_batches=(1, 2, 4),
            num_workers=(0, 1, 2, 4),
            comm_hook=("allreduce", "fp16"),
        ),
        options=dict(options),
        trials=trials,
        dropped={"precision": "the script could not apply it (Trainer(precision=...) is fixed in code)"},
        result=result,
        stopped_because="no untried configuration could gain 5% even at the top of its interval",
    )


@pytest.fixture
def tune_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tune"
    out.mkdir()
    save_state(out, _state())
    return out


@pytest.fixture
def kept_dir(tmp_path: Path) -> Path:
    out = tmp_path / "kept"
    out.mkdir()
    save_state(out, _state(kept_current=True))
    return out


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_tune_report_writes_every_file(tune_dir: Path) -> None:
    written = write_tune_report(tune_dir, None)
    out = tune_dir / "report"
    assert {p.name for p in written} == {HTML_NAME, MD_NAME, JSON_NAME, PLOT_NAME}
    assert all(p.parent == out and p.is_file() for p in written)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no scratch left behind
    document = json.loads((out / JSON_NAME).read_text())
    assert document["objective"] == "throughput"
    assert len(document["trials"]) == 7
    rendered = document["rendered"]
    assert rendered["winner"]["label"] == "b64 a1 w2 fp16 32-true"
    assert rendered["changes"] == {
        "batch_size": {"current": 32, "new": 64},
        "num_workers": {"current": 0, "new": 2},
        "comm_hook": {"current": "allreduce", "new": "fp16"},
    }
    assert rendered["verdict"] == "improvement"
    assert rendered["trials"][2]["predicted"] == {"value": 1300.0, "low": 1150.0, "high": 1450.0}


def test_formats_and_out_dir_are_honoured(tune_dir: Path, tmp_path: Path) -> None:
    written = write_tune_report(tune_dir, tmp_path / "elsewhere", "md")
    assert sorted(p.name for p in written) == sorted([MD_NAME, PLOT_NAME])
    assert not (tune_dir / "report").exists()


def test_html_escapes_recorded_strings(tune_dir: Path) -> None:
    write_tune_report(tune_dir, None, "html")
    page = (tune_dir / "report" / HTML_NAME).read_text()
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)" in page
    assert "Content-Security-Policy" in page
    assert 'id="settings"' in page and "Settings to apply" in page
    assert "data:image/png;base64," in page  # the plot is embedded


def test_markdown_has_the_trials_and_the_yaml(tune_dir: Path) -> None:
    write_tune_report(tune_dir, None, "md")
    md = (tune_dir / "report" / MD_NAME).read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    winner_row = next(r for r in rows if r.startswith("| 2 |"))
    assert "search, winner" in winner_row and "b64 a1 w2 fp16 32-true" in winner_row
    assert "1,260" in winner_row and r"1,300 \[1,150, 1,450\]" in winner_row
    assert any(r.startswith("| 3 |") and "infeasible: out of memory" in r for r in rows)
    assert any(r.startswith("| 0 |") and "baseline" in r for r in rows)
    assert "<script" not in md
    assert "![Each search trial" in md and PLOT_NAME in md
    fragment = md.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    config = yaml.safe_load(fragment)
    assert config["data"] == {"batch_size": 64, "num_workers": 2}
    strategy = config["trainer"]["strategy"]
    assert strategy["class_path"] == "lightning.pytorch.strategies.DDPStrategy"
    assert strategy["init_args"]["ddp_comm_hook"].endswith("default_hooks.fp16_compress_hook")
    assert "accumulate_grad_batches" not in fragment and "precision" not in fragment  # unchanged knobs
    assert "global batch changes from 64 to 128" in md


def test_the_plot_is_a_real_png(tune_dir: Path, tmp_path: Path) -> None:
    plot = plot_predicted_vs_measured(load_state(tune_dir), tmp_path)
    assert plot is not None and plot.path == tmp_path / PLOT_NAME
    width, height = _png_size(plot.path)
    assert width >= 800 and height >= 400
    assert plot.path.stat().st_size > 15_000  # axes, points, labels: far more than an empty canvas
    assert plot.section == "trials"


def test_no_plot_without_a_measured_prediction(tmp_path: Path) -> None:
    state = _state()
    state.trials = [t for t in state.trials if t.role != "search" or not t.measured]
    assert plot_predicted_vs_measured(state, tmp_path) is None
    assert not (tmp_path / PLOT_NAME).exists()


def test_terminal_text_shows_the_winner_and_verdict() -> None:
    text = format_tune_text(_state())
    assert (
        "Winner: b64 a1 w2 fp16 32-true (trial #2), throughput +25.0% [+20.0%, +30.0%] over your current settings"
        in text
    )
    assert "verdict: improvement: throughput 25.1% higher" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    assert "Objective (samples/s)" in header and "Predicted (samples/s)" in header
    row = next(line for line in lines if line.lstrip().startswith("2  search, winner"))
    assert "1,260" in row
    assert "loader = DataLoader(dataset, ..., batch_size=64, num_workers=2)  # batch_size is per rank" in text
    assert "strategy=DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)" in text
    assert "register_comm_hook" in text
    assert "search stopped: no untried configuration" in text


def test_kept_current_shows_no_code(kept_dir: Path) -> None:
    state = load_state(kept_dir)
    sections = {s.id: s for s in tune_sections(state, ())}
    assert not [b for s in sections.values() for b in s.blocks if isinstance(b, Code)]
    settings_text = " ".join(getattr(b, "text", "") for b in sections["settings"].blocks)
    assert "keep your current settings" in settings_text
    text = format_tune_text(state)
    assert "Keep your current settings: no configuration was shown to be better than them." in text
    assert "verdict: inconclusive" in text and "best candidate: b64 a1 w2 fp16 32-true (trial #2)" in text
    assert "DataLoader" not in text and "LightningCLI" not in text
    write_tune_report(kept_dir, None, "md,html")
    md = (kept_dir / "report" / MD_NAME).read_text()
    assert "```" not in md
    assert "search, best" in md and "search, winner" not in md
    assert "Best candidate (not adopted)" in md


def test_time_objective_is_shown_in_hours_lower_is_better() -> None:
    state = _state(objective="time", target_samples=3_600_000.0)
    objective = objective_of(state)
    # 1,000 samples/s to 3.6 M samples is one hour; the rate's interval inverts into the figure's.
    assert predicted_figures(objective, Prediction(1000.0, 800.0, 1250.0)) == pytest.approx((1.0, 0.8, 1.25))
    result = state.result
    assert result is not None
    assert gain_text(objective, result) == "time -20.0% [-23.1%, -16.7%]"
    text = format_tune_text(state)
    assert "Objective (h)" in text
    row = next(line for line in text.splitlines() if line.lstrip().startswith("0  baseline"))
    assert " 1.00 " in row  # the baseline's hour


def test_settings_code_for_trainer_knobs() -> None:
    code = settings_code({"accumulate_grad_batches": 2, "precision": "bf16-mixed"})
    assert code is not None
    fragment, python = code
    assert yaml.safe_load(fragment) == {"trainer": {"accumulate_grad_batches": 2, "precision": "bf16-mixed"}}
    assert "trainer = Trainer(..., accumulate_grad_batches=2, precision='bf16-mixed')" in python
    assert "DataLoader" not in python and "DDPStrategy" not in python
    assert settings_code({}) is None


def test_unreadable_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(TuneStateError, match="not a tuning directory"):
        write_tune_report(tmp_path, None)
    (tmp_path / "tune.json").write_text("{not json")
    with pytest.raises(TuneStateError, match="cannot read"):
        write_tune_report(tmp_path, None)


def test_nothing_measured_better_and_no_result_yet(tmp_path: Path) -> None:
    state = _state()
    state.result = {
        "best_trial": 0,
        "winner": BASE.as_dict(),
        "kept_current": True,
        "verdict": None,
        "reason": "no configuration measured better than your current settings",
    }
    text = format_tune_text(state)
    assert text.endswith("  no configuration measured better than your current settings")
    assert "Winner" not in text and "DataLoader" not in text
    sections = {s.id: s for s in tune_sections(state, ())}
    result_text = [b.text for b in sections["result"].blocks if hasattr(b, "text")]
    assert (
        result_text[0]
        == "Keep your current settings: no configuration measured better than your current settings."
    )
    state.result = None
    text = format_tune_text(state)
    assert "no result yet" in text and "--resume" in text
    out = tmp_path / "undecided"
    out.mkdir()
    save_state(out, state)
    written = write_tune_report(out, None, "md")
    assert "Nothing to apply until the session has chosen a winner." in written[-1].read_text()


def test_terminal_text_drops_control_characters() -> None:
    state = _state()
    state.trials[4].reason = "exited: \x1b[2J\x1b]0;pwned\x07 boom\r\nnext line"
    state.dropped = {"num_workers": "the script said \x1b[31mno\x1b[0m"}
    text = format_tune_text(state)
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "#4 b32 a1 w4 allreduce 32-true: exited: [2J ]0;pwned boom next line" in text
