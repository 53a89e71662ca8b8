"""A quality target on a recorded metric: `val_loss<=2.1`, `val_acc>=0.9`.

One spelling for every place that takes a target (`tuneup report/show/compare --target`, the callback's
`target=`, `tuneup advise` and `tuneup tune`), so that each parses it the same way and says the same thing
about a target it cannot read. Pure: no torch, no trainer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# `<=`/`>=` say the direction: a loss falls to its target, an accuracy rises to it. `<` and `>` are read as
# the same (a recorded value equal to the target has reached it either way), so a user's `val_loss<2.1`
# does not fail on a strictness no curve can show.
_PATTERN = re.compile(r"^\s*(?P<metric>[^<>=\s][^<>=]*?)\s*(?P<op><=|>=|<|>)\s*(?P<value>\S+)\s*$")


class TargetError(ValueError):
    """A target that cannot be read; the message names the text and the form that works."""


@dataclass(frozen=True, slots=True)
class Target:
    """Reach `value` on `metric`: from above when `lower_is_better` (a loss), from below otherwise."""

    metric: str
    value: float
    lower_is_better: bool

    @property
    def op(self) -> str:
        return "<=" if self.lower_is_better else ">="

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def reached(self, value: float | None) -> bool:
        """Whether a recorded value meets the target (NaN, inf or None never does)."""
        if value is None or not math.isfinite(value):
            return False
        return value <= self.value if self.lower_is_better else value >= self.value

    def better(self, a: float, b: float) -> bool:
        """Whether `a` is strictly better than `b` in the target's direction."""
        return a < b if self.lower_is_better else a > b


def parse_target(text: str) -> Target:
    """`"val_loss<=2.1"` -> Target("val_loss", 2.1, lower_is_better=True). Raises TargetError."""
    if not isinstance(text, str):
        raise TargetError(f"a target is text such as 'val_loss<=2.1', got {text!r}")
    match = _PATTERN.match(text)
    if match is None:
        raise TargetError(
            f"cannot read the target {text!r}: write METRIC<=VALUE for a metric that falls (val_loss<=2.1) "
            "or METRIC>=VALUE for one that rises (val_acc>=0.9)"
        )
    raw = match.group("value")
    try:
        value = float(raw)
    except ValueError:
        raise TargetError(
            f"the target {text!r} has {raw!r} where a number belongs, as in val_loss<=2.1"
        ) from None
    if not math.isfinite(value):
        raise TargetError(f"the target {text!r} needs a finite number, as in val_loss<=2.1")
    return Target(
        metric=match.group("metric"), value=value, lower_is_better=match.group("op").startswith("<")
    )
