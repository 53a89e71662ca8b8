"""Reading a tensor's value, shared by the collectors that resolve device figures after the step (the step
clock, the gradient noise scale). A module of its own so that neither imports the other for it: the noise
scale importing the step clock closed a circle (step_clock -> comm -> grad_noise -> step_clock)."""

from __future__ import annotations

from typing import Any


def to_float(value: Any) -> float | None:
    """A device tensor's (or a number's) value, read on the caller's thread; None where there is none."""
    if value is None:
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
