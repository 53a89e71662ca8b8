"""How a report writes a figure: every number goes through one of these, so it reads the same in every
format, carries its unit, and a missing one is always `MISSING`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
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


def recorded_steps(recorded: int, seen: int | None, detail: int | None, every: int | None) -> str:
    """How many steps the record kept, and how it chose them where it did not keep them all:
    "1,012 of 2,100 steps: every step up to 1,000, then one in 101"."""
    if not (is_number(seen) and seen > recorded):
        return count(recorded)
    how = (
        f": every step up to {count(detail)}, then one in {count(every)}"
        if is_number(detail) and is_number(every)
        else ""
    )
    return f"{count(recorded)} of {count(seen)} steps{how}"


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


def _significant(value: float, digits: int = 3) -> str:
    """A figure below 1 to `digits` significant digits, never rounded to a misleading zero."""
    out = f"{value:.{digits}g}"
    if "e" in out:  # format "g" turns to exponents below 1e-4; a report reads decimals
        out = f"{value:.{digits - 1 - math.floor(math.log10(abs(value)))}f}".rstrip("0")
    return out


def usd(value: object) -> str:
    """US dollars: cents from a dollar up ("$1,234.56"), three significant digits below ("$0.0123")."""
    if not is_number(value):
        return text(value)
    sign, size = ("-" if value < 0 else ""), abs(value)
    if size == 0:
        return "$0.00"
    if size >= 1:
        out = f"{size:,.2f}"
    else:
        out = _significant(size)
        if float(out) >= 1:  # 0.9996 rounds up to a whole dollar
            out = f"{float(out):,.2f}"
        elif len(out.partition(".")[2]) < 2:  # cents always show: $0.50, not $0.5
            out = f"{float(out):.2f}"
    return f"{sign}${out}"


def usd_rate(value: object, per: str) -> str:
    """A price per unit: usd_rate(21.69, "h") -> "$21.69/h"."""
    return f"{usd(value)}/{per}" if is_number(value) else text(value)


def figure(value: object) -> str:
    """A ratio of any size: `number` from 1 up, three significant digits below (0.00222, not 0.00)."""
    if not is_number(value):
        return text(value)
    if value == 0 or abs(value) >= 1:
        return number(value)
    return _significant(value)


_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: object, unit: str) -> str:
    """A value with an SI prefix on its unit: si(1.2e13, "FLOP") -> "12.0 TFLOP"."""
    if not is_number(value):
        return text(value)
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{number(value / scale)} {prefix}{unit}"
    return f"{figure(value)} {unit}"


def flop_count(value: object) -> str:
    """A count of floating-point operations: 1.2e13 -> "12.0 TFLOP"."""
    return si(value, "FLOP")


def tflops_rate(tflops_per_s: object) -> str:
    """A rate given in TFLOP/s, shown with the prefix its size needs: 312 -> "312.0 TFLOP/s",
    0.0123 -> "12.3 GFLOP/s"."""
    return si(tflops_per_s * 1e12, "FLOP/s") if is_number(tflops_per_s) else text(tflops_per_s)


def kwh(value: object) -> str:
    """Energy given in kWh, shown in Wh below one kWh: 1.2 -> "1.20 kWh", 0.0025 -> "2.50 Wh"."""
    if not is_number(value):
        return text(value)
    if value == 0 or abs(value) >= 1:
        return with_unit(value, "kWh")
    wh = value * 1000
    return f"{number(wh) if abs(wh) >= 1 else _significant(wh)} Wh"


def large(value: object) -> str:
    """A count big enough that its last digits say nothing: 4067240 -> "4.07 M", 2.3e9 -> "2.30 B"."""
    if not is_number(value):
        return text(value)
    if abs(value) >= 1e9:
        return f"{number(value / 1e9)} B"
    if abs(value) >= 1e6:
        return f"{number(value / 1e6)} M"
    return number(round(value)) if abs(value) >= 1000 else figure(value)


def fraction_percent(fraction: object) -> str:
    """A fraction of 1 as a percentage, with a second digit below 1%: 0.165 -> "16.5%",
    0.00042 -> "0.042%"."""
    if not is_number(fraction):
        return text(fraction)
    pct = fraction * 100
    if pct == 0 or abs(pct) >= 1:
        return f"{number(pct, 1)}%"
    return f"{_significant(pct, 2)}%"


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


def aligned_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int], indent: str = ""
) -> list[str]:
    """A plain-text table for the terminal: the header, a rule of dashes, then the rows; the columns in `right`
    right-aligned (figures), the others left-aligned; every line starts with `indent`."""
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = (
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        return (indent + "  ".join(cells)).rstrip()

    return [line(header), indent + "  ".join("-" * w for w in widths), *(line(row) for row in rows)]
