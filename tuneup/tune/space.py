"""What can a tuning trial change, and which combinations are tried? One configuration of the knobs, and the
search space: every combination of the allowed values that meets the constraints.

The knobs themselves, their values and how each is applied are the registry's (tuneup.tune.knobs): a
configuration has one attribute per registered knob, in the registry's order.

A knob left at None in a configuration is not touched: the training runs with what its script says. The
batch size is per rank and micro-batch (Lightning's `batch_size` convention); the global batch is
batch x accumulation x ranks.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from tuneup.tune import knobs as registry
from tuneup.tune.knobs import COMM_HOOKS, PRECISIONS, SpaceError

__all__ = ["COMM_HOOKS", "PRECISIONS", "Config", "SearchSpace", "SpaceError", "neighbours"]


def _unknown(given: Mapping[str, Any]) -> None:
    unknown = sorted(set(given) - set(registry.names()))
    if unknown:
        raise SpaceError(
            f"unknown knob(s) {', '.join(unknown)}; the knobs are {', '.join(sorted(registry.names()))}"
        )


@functools.total_ordering
class Config:
    """One trial's settings, one attribute per registered knob; None leaves a knob as the training script
    sets it. Immutable and hashable; configurations compare and sort by their values in the registry's order
    (as a dataclass of those fields would)."""

    __slots__ = ("_values",)
    _values: dict[str, Any]

    def __init__(self, **values: Any) -> None:
        _unknown(values)
        object.__setattr__(self, "_values", {k: v for k, v in values.items() if v is not None})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or registry.knob(name) is None:
            raise AttributeError(f"{type(self).__name__} has no knob {name!r}")
        return self._values.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: use replace()")

    def _key(self) -> tuple[Any, ...]:
        return tuple(self._values.get(k) for k in registry.names())

    def __eq__(self, other: object) -> bool:
        return self._values == other._values if isinstance(other, Config) else NotImplemented

    def __lt__(self, other: Config) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._values[k]!r}" for k in registry.names() if k in self._values)
        return f"Config({shown})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_config, (tuple(self._values.items()),))

    def replace(self, **changes: Any) -> Config:
        """This configuration with `changes` (a value of None unsets the knob)."""
        return Config(**{**self._values, **changes})

    def as_dict(self) -> dict[str, Any]:
        """The knobs set, in the registry's order."""
        return {k: self._values[k] for k in registry.names() if k in self._values}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """A configuration as tune.json keeps it; SpaceError names an unknown knob or a value of the wrong
        type."""
        _unknown(data)
        for name, value in data.items():
            entry = registry.knob(name)
            if entry is not None and not entry.accepts(value):
                raise SpaceError(f"knob {name}: expected {entry.value_type.__name__}, got {value!r:.40}")
        return cls(**dict(data))

    def label(self) -> str:
        """Short, for tables and plots: "b32 a2 w1 fp16 bf16-mixed" (only the knobs set)."""
        parts = [k.label(self._values[k.name]) for k in registry.knobs() if k.name in self._values]
        return " ".join(parts) or "as scripted"

    def over(self, base: Config) -> Config:
        """This configuration with `base`'s values where this one leaves a knob unset."""
        return base.replace(**self._values)

    def changes_from(self, baseline: Config) -> dict[str, tuple[Any, Any]]:
        """knob -> (current, new) for every knob this configuration sets to another value than `baseline`."""
        out = {}
        for name in registry.names():
            new, current = self._values.get(name), baseline._values.get(name)
            if new is not None and new != current:
                out[name] = (current, new)
        return out

    def global_batch(self, world_size: int) -> int | None:
        if self.batch_size is None or self.accumulate_grad_batches is None:
            return None
        return int(self.batch_size * self.accumulate_grad_batches * world_size)


def _config(items: tuple[tuple[str, Any], ...]) -> Config:
    return Config(**dict(items))


class SearchSpace:
    """The values each knob may take (an empty tuple: the knob is not tuned) and the constraints, one
    attribute per registered knob.

    keep_global_batch: only configurations whose batch x accumulation equals the baseline's (the global
    batch the user's optimizer settings were chosen for).
    """

    __slots__ = ("_values", "keep_global_batch")
    _values: dict[str, tuple[Any, ...]]
    keep_global_batch: bool

    def __init__(self, *, keep_global_batch: bool = False, **values: Any) -> None:
        _unknown(values)
        checked = {}
        for entry in registry.knobs():
            given = values.get(entry.name)
            if given:
                checked[entry.name] = entry.check(tuple(given))
        object.__setattr__(self, "_values", checked)
        object.__setattr__(self, "keep_global_batch", bool(keep_global_batch))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or registry.knob(name) is None:
            raise AttributeError(f"{type(self).__name__} has no knob {name!r}")
        return self._values.get(name, ())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: use replace()")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SearchSpace):
            return NotImplemented
        return (self._values, self.keep_global_batch) == (other._values, other.keep_global_batch)

    def __hash__(self) -> int:
        return hash((frozenset(self._values.items()), self.keep_global_batch))

    def __repr__(self) -> str:
        shown = [f"{k}={v!r}" for k, v in self._values.items()]
        return f"SearchSpace({', '.join([*shown, f'keep_global_batch={self.keep_global_batch}'])})"

    def replace(self, **changes: Any) -> SearchSpace:
        keep = changes.pop("keep_global_batch", self.keep_global_batch)
        return SearchSpace(keep_global_batch=keep, **{**self._values, **changes})

    def tuned(self) -> tuple[str, ...]:
        """The knobs with more than one value: what the search decides."""
        return tuple(k for k in registry.names() if len(self._values.get(k, ())) > 1)

    def with_baseline(self, baseline: Config) -> SearchSpace:
        """Every knob that is tuned also allows the baseline's value (the user's current settings are always
        a candidate: the winner is measured against them)."""
        changes: dict[str, tuple[Any, ...]] = {}
        for knob, values in self._values.items():
            current = getattr(baseline, knob)
            if values and current is not None and current not in values:
                changes[knob] = (*values, current)
        return self.replace(**changes) if changes else self

    def configs(self, baseline: Config) -> list[Config]:
        """Every allowed combination, the baseline's value for a knob not in the space, sorted."""
        names = registry.names()
        axes = [self._values.get(k) or (getattr(baseline, k),) for k in names]
        out = []
        for values in itertools.product(*axes):
            config = Config(**dict(zip(names, values, strict=True)))
            if self.keep_global_batch and not _same_global_batch(config, baseline):
                continue
            out.append(config)
        return sorted(set(out), key=_sort_key)

    def size(self, baseline: Config) -> int:
        return len(self.configs(baseline))

    def as_dict(self) -> dict[str, Any]:
        """Every registered knob's values (an empty list: not tuned), and the constraint."""
        out: dict[str, Any] = {k: list(self._values.get(k, ())) for k in registry.names()}
        out["keep_global_batch"] = self.keep_global_batch
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _same_global_batch(config: Config, baseline: Config) -> bool:
    if None in (config.batch_size, config.accumulate_grad_batches):
        return True
    if None in (baseline.batch_size, baseline.accumulate_grad_batches):
        return True
    return bool(
        config.batch_size * config.accumulate_grad_batches
        == baseline.batch_size * baseline.accumulate_grad_batches
    )


def _sort_key(config: Config) -> tuple[Any, ...]:
    return tuple((v is None, v if v is not None else 0) for v in config._key())


def neighbours(config: Config, space: SearchSpace, baseline: Config) -> Iterator[Config]:
    """The configurations that differ from `config` in one knob, within the space."""
    allowed = set(space.configs(baseline))
    for knob in space.tuned():
        for value in getattr(space, knob):
            if value != getattr(config, knob):
                other = config.replace(**{knob: value})
                if other in allowed:
                    yield other
