"""Reading a catalog's CSV text: records with the line numbers an editor shows, typed cells, and
errors of one line that name the file, the line and the fix.

Shared by the instance and GPU catalogs (tuneup.catalog.instances, tuneup.catalog.gpus). The packaged
files are tuneup/data/*.csv; their columns are in tuneup.data.catalog_format. No torch here.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import resources

# How the packaged files name themselves in errors: the path a developer would open.
PACKAGED_LABEL = "tuneup/data/{}"
VERSION_LINE_PREFIX = "# tuneup catalog version "


class CatalogError(ValueError):
    """A catalog that cannot be used. The message is one line: the file, the line and the fix."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def row_error(label: str, line: int, problem: str, fix: str) -> CatalogError:
    return CatalogError(f"{label}:{line}: {problem}; fix: {fix}", path=label, line=line)


def catalog_version_from_text(text: str) -> str | None:
    """The version a catalog file names in its first line, `# tuneup catalog version X ...`."""
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    if not first.startswith(VERSION_LINE_PREFIX):
        return None
    rest = first[len(VERSION_LINE_PREFIX) :].split()
    return rest[0].rstrip(";,") if rest else None


def read_records(
    text: str, label: str, columns: Sequence[str], required: Sequence[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number of the record's first line, cells by column) for each data row of a CSV text.

    Lines starting with "#" are comments; blank lines are skipped. Line numbers are 1-based, as an editor
    shows them.
    """
    # Comment lines become empty lines rather than disappearing, so csv's line count stays the editor's.
    lines = []
    for line in io.StringIO(text.lstrip("\ufeff"), newline=""):
        body = line.rstrip("\r\n")
        lines.append((line[len(body) :] or "\n") if body.lstrip().startswith("#") else line)
    reader = csv.reader(lines)
    header: list[str] | None = None
    header_line = 0
    rows = 0
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as error:
            raise row_error(
                label, reader.line_num, f"not valid CSV ({error})", "quote fields that hold commas or quotes"
            ) from None
        if not any(c.strip() for c in cells):
            continue
        line = reader.line_num - sum(c.count("\n") for c in cells)
        if header is None:
            header, header_line = _header(cells, label, line, columns, required), line
            continue
        if len(cells) > len(header) and any(c.strip() for c in cells[len(header) :]):
            raise row_error(
                label,
                line,
                f"{len(cells)} fields, but the header (line {header_line}) names {len(header)} columns",
                "quote fields that hold commas, or add the column to the header",
            )
        cells = cells + [""] * (len(header) - len(cells))
        rows += 1
        yield line, {name: cells[i].strip() for i, name in enumerate(header)}
    if header is None:
        raise row_error(
            label,
            1,
            "empty: no header line",
            f"start with a header naming the columns (required: {', '.join(required)})",
        )
    if rows == 0:
        raise row_error(
            label, header_line + 1, "no rows after the header", "add one row per entry, or drop the file"
        )


def _header(
    cells: list[str], label: str, line: int, columns: Sequence[str], required: Sequence[str]
) -> list[str]:
    names = [c.strip().lower() for c in cells]
    for name in names:
        if not name:
            raise row_error(label, line, "the header has an empty column name", "name every column")
        if name not in columns:
            close = difflib.get_close_matches(name, columns, n=1)
            fix = f"did you mean {close[0]!r}? " if close else ""
            raise row_error(
                label, line, f"unknown column {name!r}", f"{fix}use only these columns: {', '.join(columns)}"
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise row_error(label, line, f"column(s) named twice: {', '.join(repeated)}", "name each column once")
    missing = [c for c in required if c not in names]
    if missing:
        raise row_error(label, line, f"missing column(s) {', '.join(missing)}", "add them to the header")
    return names


class Cells:
    """One row's cells with typed, checked access; every failure names the file, line and column."""

    def __init__(self, label: str, line: int, cells: Mapping[str, str]) -> None:
        self.label, self.line, self.cells = label, line, cells

    def error(self, problem: str, fix: str) -> CatalogError:
        return row_error(self.label, self.line, problem, fix)

    def text(self, column: str, required: bool = False) -> str | None:
        value = self.cells.get(column, "")
        if not value:
            if required:
                raise self.error(f"{column} is empty", f"every row needs a {column}")
            return None
        return value

    def number(self, column: str, *, required: bool = False) -> float | None:
        text = self.text(column, required)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            raise self.error(
                f"{column} is {text!r}, not a number", f"write {column} as a plain number"
            ) from None
        if not math.isfinite(value) or value <= 0:
            raise self.error(f"{column} is {text!r}", f"{column} must be a number above 0")
        return value

    def required_text(self, column: str) -> str:
        value = self.text(column, required=True)
        assert value is not None  # text() raised otherwise
        return value

    def required_number(self, column: str) -> float:
        value = self.number(column, required=True)
        assert value is not None  # number() raised otherwise
        return value

    def whole(self, column: str, *, required: bool = False, minimum: int = 1) -> int | None:
        text = self.text(column, required)
        if text is None:
            return None
        if not (text.isascii() and text.isdigit()) or int(text) < minimum:
            raise self.error(f"{column} is {text!r}", f"{column} must be a whole number, at least {minimum}")
        return int(text)


@cache
def packaged_text(name: str) -> str:
    return resources.files("tuneup.data").joinpath(name).read_text(encoding="utf-8")
