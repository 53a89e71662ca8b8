"""A run's tags: one reading for `tags=` and `TUNEUP_TAGS`, checked before training, kept in the manifest and
read back into the analysis (what the fleet index groups by)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run
from tuneup.plugins.loop import track
from tuneup.tags import TAGS_ENV, TagError, checked_tags, parse_tags, recorded_tags, run_tags


def test_the_environment_spelling_reads_pairs_and_keeps_later_equals_signs() -> None:
    assert parse_tags(" project=vision , user=ana,,note=a=b ") == {
        "project": "vision",
        "user": "ana",
        "note": "a=b",
    }
    assert parse_tags("") == {}


@pytest.mark.parametrize(
    ("tags", "names"),
    [
        ({"bad key": "x"}, "bad key"),
        ({"1st": "x"}, "1st"),
        ({"project": ["a"]}, "project"),
        ({"project": "two\nlines"}, "project"),
        ({"project": "x" * 300}, "project"),
        ({f"k{i}": "v" for i in range(40)}, "40 tags"),
    ],
)
def test_a_tag_that_cannot_be_kept_is_named(tags: dict, names: str) -> None:
    with pytest.raises(TagError, match=names.replace("\n", "")):
        checked_tags(tags)


def test_code_tags_override_the_environment_and_numbers_become_text() -> None:
    environ = {TAGS_ENV: "project=vision,user=ana"}
    assert run_tags({"user": "bo", "seed": 3, "tuned": True}, environ) == {
        "project": "vision",
        "user": "bo",
        "seed": "3",
        "tuned": "True",
    }
    with pytest.raises(TagError, match=f"{TAGS_ENV}: tag 'project' has no value"):
        run_tags(None, {TAGS_ENV: "project"})


def test_only_string_pairs_are_read_back_from_a_manifest() -> None:
    assert recorded_tags({"project": "vision", "n": 3, 4: "x"}) == {"project": "vision"}
    assert recorded_tags(["project"]) == {}


def test_a_recorded_loop_keeps_its_tags_through_the_manifest_to_the_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAGS_ENV, "project=vision,user=ana")
    with track(tmp_path / "run", batch_size=4, tags={"experiment": "lr-sweep", "user": "bo"}) as run:
        for step in range(3):
            with run.phase("forward"):
                pass
            run.step(loss=1.0 / (step + 1))
    loaded = load_run(run.run_dir)
    expected = {"project": "vision", "user": "bo", "experiment": "lr-sweep"}
    assert loaded.manifest.raw["tags"] == expected
    assert analyze_run(loaded).run.tags == expected


def test_bad_tags_stop_the_recorder_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneup.plugins.lightning import TuneupCallback

    with pytest.raises(ValueError, match=r"TuneupCallback\(tags=...\): tag name 'a b'"):
        TuneupCallback(tags={"a b": "x"})
    monkeypatch.setenv(TAGS_ENV, "oops")
    with pytest.raises(ValueError, match=r"TUNEUP_TAGS: tag 'oops' has no value"):
        TuneupCallback()
