"""How a report writes a figure: every number goes through one of these, so it reads the same in every
format, carries its unit, and a missing one is always `MISSING`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TypeGuard

MISSING = "—"


def is_number(value: object) -> TypeGuard[int | float]:
    # bool is an int to Python but never a figure in a report; NaN and inf are not figures either.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(value: object, digits: int | None = None) -> str:
    """A figure with thousands separators; by default as many decimals as its size deserves."""
    if not is_number(value):
        return text(value)
    if digits is None:
        if isinstance(value, int):
            return f"{value:,}"
        size = abs(value)
        digits = 0 if size >= 1000 else 1 if size >= 10 else 2
    out = f"{value:,.{digits}f}"
    # "-0.0" reads as a sign error.
    return out.lstrip("-") if float(out.replace(",", "")) == 0 else out


def with_unit(value: object, unit: str, digits: int | None = None) -> str:
    return f"{number(value, digits)} {unit}" if is_number(value) else text(value)


def ms(value: object) -> str:
    return with_unit(value, "ms")


def count(value: object) -> str:
    return f"{round(value):,}" if is_number(value) else text(value)


def percent(value: object, digits: int = 1) -> str:
    """A value already in percent (utilization, CPU %): 100.8 -> "100.8%"."""
    return f"{number(value, digits)}%" if is_number(value) else text(value)


def share(fraction: object) -> str:
    """A fraction of 1 as a percentage: 0.317 -> "31.7%"."""
    return f"{number(fraction * 100, 1)}%" if is_number(fraction) else text(fraction)


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_bytes(value: object) -> str:
    """Binary units, as memory is sold and as nvidia-smi and free show it: 890888192 -> "849.6 MiB"."""
    if not is_number(value):
        return text(value)
    size, unit = float(value), 0
    while abs(size) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{number(size, 0 if unit == 0 else None)} {_BYTE_UNITS[unit]}"


def byte_rate(value: object) -> str:
    return f"{size_bytes(value)}/s" if is_number(value) else text(value)


def parameters(value: object) -> str:
    """Model size: millions (or billions) once the count is large enough that digits stop helping."""
    if not is_number(value):
        return text(value)
    if abs(value) >= 1e9:
        return f"{number(value / 1e9)} B"
    if abs(value) >= 1e5:
        return f"{number(value / 1e6)} M"
    return count(value)


def duration(seconds: object) -> str:
    if not is_number(seconds):
        return text(seconds)
    if seconds < 60:
        return with_unit(seconds, "s")
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def energy(joules: object) -> str:
    """Watt-hours, the unit energy is billed in."""
    if not is_number(joules):
        return text(joules)
    wh = joules / 3600
    return with_unit(wh / 1000, "kWh") if abs(wh) >= 1000 else with_unit(wh, "Wh")


def unix_time(value: object) -> str:
    if not is_number(value):
        return text(value)
    try:
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return number(value)


def yes_no(value: object) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else text(value)


def text(value: object) -> str:
    """Any recorded value as plain text: config entries, versions, seeds, names."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, float):
        # repr keeps a config value as the user wrote it (1.0 stays 1.0, 1e-05 stays 1e-05).
        return repr(value) if math.isfinite(value) else MISSING
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(text(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items()) if value else "none"
    return str(value)


def pair(left: str, right: str) -> str:
    """Two formatted figures as "a / b", the unit written once when they share it: "130 / 140 GiB"."""
    head, _, unit = left.rpartition(" ")
    if head and right.endswith(" " + unit):
        left = head
    return f"{left} / {right}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word if n == 1 else word + 's'}"


def ranks_text(ranks: Iterable[object]) -> str:
    """ "rank 3", "ranks 0, 2", "ranks 0–7, 16–23": runs of consecutive ranks shortened, for big jobs."""
    listed = list(ranks)
    if not listed:
        return "no ranks"
    if len(listed) == 1:
        return f"rank {text(listed[0])}"
    ints = [int(r) for r in listed if isinstance(r, int) or (isinstance(r, str) and r.isdigit())]
    if len(ints) != len(listed):
        return f"ranks {', '.join(text(r) for r in listed)}"
    runs: list[list[int]] = []
    for r in sorted(ints):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "ranks " + ", ".join(
        str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in runs
    )


def sentence(value: object) -> str:
    """Recorded prose (finding evidence, a straggler summary) shown as a sentence: capital, full stop."""
    out = text(value).strip()
    if out == MISSING:
        return out
    out = out[:1].upper() + out[1:]
    return out if out.endswith((".", "!", "?")) else out + "."
