"""The report makes a run's advice once per analysis, and its cache keeps no analysis alive (it was keyed by
`id(analysis)` and held up to nine analyses, a 1,024-rank one among them, until a tenth cleared them all)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from tests.synthetic import make_run
from tuneup.report import analyze
from tuneup.report.advice import advice_for


def test_the_advice_is_made_once_per_analysis_and_leaves_with_it(tmp_path: Path) -> None:
    analysis = analyze(make_run(tmp_path / "run", steps=40))
    advice = advice_for(analysis)
    assert advice_for(analysis) is advice  # the terminal, HTML, Markdown and JSON share one

    gone = weakref.ref(analysis)
    del analysis
    gc.collect()
    kept_alive = gone() is not None
    assert not kept_alive, "the advice cache keeps the analysis alive"

    again = analyze(tmp_path / "run")  # may be given the freed analysis' id: it must get advice of its own
    assert advice_for(again) is not advice
