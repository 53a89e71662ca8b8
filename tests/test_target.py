"""The one spelling of a quality target (tuneup.target): parsed the same everywhere, refused in one line."""

from __future__ import annotations

import math

import pytest

from tuneup.target import Target, TargetError, parse_target


@pytest.mark.parametrize(
    ("text", "metric", "value", "lower"),
    [
        ("val_loss<=2.1", "val_loss", 2.1, True),
        (" val_acc >= 0.9 ", "val_acc", 0.9, False),
        ("val_loss<2.1", "val_loss", 2.1, True),  # strictness no curve can show reads as <=
        ("eval/top-1 accuracy>=75", "eval/top-1 accuracy", 75.0, False),
        ("loss<=1e-3", "loss", 0.001, True),
    ],
)
def test_a_target_reads_its_metric_direction_and_value(
    text: str, metric: str, value: float, lower: bool
) -> None:
    target = parse_target(text)
    assert (target.metric, target.value, target.lower_is_better) == (metric, value, lower)
    assert parse_target(str(target)) == target  # printed as it is read


@pytest.mark.parametrize(
    "text", ["val_loss", "val_loss=2", "<=2.1", "val_loss<=two", "val_loss<=nan", "a<=1<=2"]
)
def test_a_target_that_cannot_be_read_names_the_form_that_works(text: str) -> None:
    with pytest.raises(TargetError) as err:
        parse_target(text)
    assert "val_loss<=2.1" in str(err.value) and "\n" not in str(err.value)


def test_reached_and_better_follow_the_direction() -> None:
    loss, acc = Target("val_loss", 2.0, True), Target("val_acc", 0.9, False)
    assert loss.reached(2.0) and loss.reached(1.5) and not loss.reached(2.01)
    assert acc.reached(0.9) and not acc.reached(0.89)
    for bad in (None, math.nan, math.inf, -math.inf):
        assert not loss.reached(bad) and not acc.reached(bad)
    assert loss.better(1.0, 2.0) and not loss.better(2.0, 1.0)
    assert acc.better(0.95, 0.9) and not acc.better(0.9, 0.9)
