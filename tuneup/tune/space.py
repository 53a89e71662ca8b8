"""What can a tuning trial change, and which combinations are tried? The knobs, one configuration of them,
and the search space: every combination of the allowed values that meets the constraints.

A knob left at None in a configuration is not touched: the training runs with what its script says. The
batch size is per rank and micro-batch (Lightning's `batch_size` convention); the global batch is
batch x accumulation x ranks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

# The DDP communication hooks a trial can apply, by the name `tuneup tune --comm-hook` takes. "allreduce" is
# DDP's default; "fp16"/"bf16" compress the gradients to 16 bits on the wire (torch's fp16_compress_hook,
# bf16_compress_hook); bf16 needs NCCL, since gloo cannot all-reduce bf16.
COMM_HOOKS = ("allreduce", "fp16", "bf16")
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", "transformer-engine")


class SpaceError(ValueError):
    """A knob value or constraint that cannot be tuned: names the option and the fix (exit code 2)."""


@dataclass(frozen=True, slots=True, order=True, kw_only=True)
class Config:
    """One trial's settings; None leaves a knob as the training script sets it."""

    batch_size: int | None = None
    accumulate_grad_batches: int | None = None
    num_workers: int | None = None
    comm_hook: str | None = None
    precision: str | None = None
    bucket_cap_mb: int | None = None  # DDP's gradient bucket size (its default is 25)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpaceError(
                f"unknown knob(s) {', '.join(unknown)}; the knobs are {', '.join(sorted(known))}"
            )
        return cls(**dict(data))

    def label(self) -> str:
        """Short, for tables and plots: "b32 a2 w1 fp16 bf16-mixed" (only the knobs set)."""
        parts = []
        if self.batch_size is not None:
            parts.append(f"b{self.batch_size}")
        if self.accumulate_grad_batches is not None:
            parts.append(f"a{self.accumulate_grad_batches}")
        if self.num_workers is not None:
            parts.append(f"w{self.num_workers}")
        if self.comm_hook is not None:
            parts.append(self.comm_hook)
        if self.precision is not None:
            parts.append(self.precision)
        if self.bucket_cap_mb is not None:
            parts.append(f"bucket{self.bucket_cap_mb}MB")
        return " ".join(parts) or "as scripted"

    def over(self, base: Config) -> Config:
        """This configuration with `base`'s values where this one leaves a knob unset."""
        return replace(base, **self.as_dict())

    def changes_from(self, baseline: Config) -> dict[str, tuple[Any, Any]]:
        """knob -> (current, new) for every knob this configuration sets to another value than `baseline`."""
        out = {}
        for f in fields(self):
            new, current = getattr(self, f.name), getattr(baseline, f.name)
            if new is not None and new != current:
                out[f.name] = (current, new)
        return out

    def global_batch(self, world_size: int) -> int | None:
        if self.batch_size is None or self.accumulate_grad_batches is None:
            return None
        return self.batch_size * self.accumulate_grad_batches * world_size


KNOBS = tuple(f.name for f in fields(Config))


def _positive_ints(name: str, values: Sequence[Any], minimum: int = 1) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise SpaceError(f"--{name} values must be whole numbers >= {minimum}, got {v!r}")
        out.append(v)
    return tuple(sorted(set(out)))


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The values each knob may take (an empty tuple: the knob is not tuned) and the constraints.

    keep_global_batch: only configurations whose batch x accumulation equals the baseline's (the global
    batch the user's optimizer settings were chosen for).
    """

    batch_size: tuple[int, ...] = ()
    accumulate_grad_batches: tuple[int, ...] = ()
    num_workers: tuple[int, ...] = ()
    comm_hook: tuple[str, ...] = ()
    precision: tuple[str, ...] = ()
    bucket_cap_mb: tuple[int, ...] = ()
    keep_global_batch: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", _positive_ints("batch-size", self.batch_size))
        object.__setattr__(
            self, "accumulate_grad_batches", _positive_ints("accumulate", self.accumulate_grad_batches)
        )
        object.__setattr__(self, "num_workers", _positive_ints("workers", self.num_workers, minimum=0))
        object.__setattr__(self, "bucket_cap_mb", _positive_ints("bucket-cap-mb", self.bucket_cap_mb))
        for hook in self.comm_hook:
            if hook not in COMM_HOOKS:
                raise SpaceError(f"--comm-hook {hook!r} is not one of {', '.join(COMM_HOOKS)}")
        for p in self.precision:
            if p not in PRECISIONS:
                raise SpaceError(f"--precision {p!r} is not one of Lightning's: {', '.join(PRECISIONS)}")
        object.__setattr__(self, "comm_hook", tuple(dict.fromkeys(self.comm_hook)))
        object.__setattr__(self, "precision", tuple(dict.fromkeys(self.precision)))

    def tuned(self) -> tuple[str, ...]:
        """The knobs with more than one value: what the search decides."""
        return tuple(k for k in KNOBS if len(getattr(self, k)) > 1)

    def with_baseline(self, baseline: Config) -> SearchSpace:
        """Every knob that is tuned also allows the baseline's value (the user's current settings are always
        a candidate: the winner is measured against them)."""
        changes: dict[str, tuple[Any, ...]] = {}
        for knob in KNOBS:
            values = getattr(self, knob)
            current = getattr(baseline, knob)
            if values and current is not None and current not in values:
                changes[knob] = (*values, current)
        return replace(self, **changes) if changes else self

    def configs(self, baseline: Config) -> list[Config]:
        """Every allowed combination, the baseline's value for a knob not in the space, sorted."""
        axes = [getattr(self, k) or (getattr(baseline, k),) for k in KNOBS]
        out = []
        for values in itertools.product(*axes):
            config = Config(**dict(zip(KNOBS, values, strict=True)))
            if self.keep_global_batch and not _same_global_batch(config, baseline):
                continue
            out.append(config)
        return sorted(set(out), key=_sort_key)

    def size(self, baseline: Config) -> int:
        return len(self.configs(baseline))

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _same_global_batch(config: Config, baseline: Config) -> bool:
    if None in (config.batch_size, config.accumulate_grad_batches):
        return True
    if None in (baseline.batch_size, baseline.accumulate_grad_batches):
        return True
    return config.batch_size * config.accumulate_grad_batches == (  # type: ignore[operator]
        baseline.batch_size * baseline.accumulate_grad_batches  # type: ignore[operator]
    )


def _sort_key(config: Config) -> tuple[Any, ...]:
    return tuple((v is None, v if v is not None else 0) for v in (getattr(config, k) for k in KNOBS))


def neighbours(config: Config, space: SearchSpace, baseline: Config) -> Iterator[Config]:
    """The configurations that differ from `config` in one knob, within the space."""
    allowed = set(space.configs(baseline))
    for knob in space.tuned():
        for value in getattr(space, knob):
            if value != getattr(config, knob):
                other = replace(config, **{knob: value})
                if other in allowed:
                    yield other
