"""What the fleet's money bought: the index of many runs (`tuneup index`) aggregated into a typed `FleetView`.

One DuckDB connection reads the index's two Parquet files (`runs.parquet`, one row per run;
`steps.parquet`, up to 32 step windows per run) and answers, for the runs the command's filters keep:

- spend over time, by the group-by tag's value and by instance type;
- $ per 1M samples (and tokens) by configuration (instance, world size, precision, strategy, global batch);
- the badput ledger summed across runs: seconds, $ and share of each category;
- the most expensive runs with their top recommendation;
- regressions between consecutive runs (by start) of one tag value and one configuration, judged by the
  compare rule (`tuneup.compare.rule.decide`) on the two runs' step windows.

The page filters by tag value and period without a server, so every figure above except the regressions
(rows, filtered as rows) is pre-aggregated into `Slice`s: one per (tag value, period), per tag value, per
period, and the whole. Tag values and periods are capped (MAX_GROUPS, MAX_PERIODS) so that the slices stay
few however many runs there are.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tuneup.analyze.model import BADPUT_CATEGORIES, decimals, significant
from tuneup.compare.rule import MIN_RUNS_FOR_TEST, Rule, Verdict, decide
from tuneup.fleet.index import FleetIndexError, connect
from tuneup.report.format import plural

# The tag a run's group is read from when --group-by is not given: the first of these that any selected
# run carries. A run without the tag belongs to no group: it is in every total, but never paired as a
# regression (two runs that share only an instance type are not "the run before").
DEFAULT_GROUP_TAGS = ("project", "experiment")
NO_GROUP = "(no tag)"
OTHER_GROUP = "(other)"

# The page's filter buttons, and so its pre-aggregated slices ((groups + 1) x (periods + 1)): tag values
# beyond MAX_GROUPS (by spend) share one "(other)" button; the period is the finest of day, week, month,
# quarter and year that gives at most MAX_PERIODS of them.
MAX_GROUPS = 8
MAX_PERIODS = 12
PERIOD_UNITS = ("day", "week", "month", "quarter", "year")

# Long lists are capped: the whole selection's slice lists more than a filtered one.
TOP_RUNS_ALL = 50
TOP_RUNS_SLICE = 10
TOP_ROWS_ALL = 25  # instances and configurations of the whole selection
TOP_ROWS_SLICE = 10
# Pairs kept with their figures (the rest are counted by verdict): regressions first, then improvements,
# inconclusive and no change, each by the size of the change.
MAX_PAIRS = 100
# A change this close below min_effect is still left to the rule: its own arithmetic may round it over.
NEAR_ONE = 1 - 1e-9

# The first step window is warm-up (compilation, caches, the data loader's first fill): never a sample.
WARMUP_WINDOWS = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetFilters:
    """What the command narrowed the index to, and how runs were grouped."""

    tags: dict[str, str]  # --tag k=v: every one must match
    since: str | None  # ISO dates or times as given, inclusive
    until: str | None
    group_by: str  # the tag whose value groups runs
    group_by_basis: str  # why that tag: given, or the default's rule


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerLine:
    """One badput category summed over a slice's runs."""

    category: str  # one of BADPUT_CATEGORIES
    seconds: float = decimals(3)  # each run's ledger seconds (its wall time), summed
    share: float | None = decimals(4)  # of the summed ledger seconds
    usd: float | None = significant(6)  # None where no run of the slice priced it
    usd_share: float | None = decimals(4)  # of the summed ledger dollars


@dataclass(frozen=True, slots=True, kw_only=True)
class Totals:
    runs: int
    priced_runs: int  # runs with a price: the dollar figures are theirs
    usd: float | None = significant(9)
    device_hours: float | None = decimals(6)
    samples: int | None = None
    tokens: int | None = None
    usd_per_million_samples: float | None = significant(6)  # pooled: the runs' $ over their samples
    usd_per_million_tokens: float | None = significant(6)
    useful_share: float | None = decimals(4)  # useful ledger seconds over all ledger seconds
    badput_usd: float | None = significant(9)
    badput_usd_share: float | None = decimals(4)  # badput $ over the $ of the runs that priced it


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSpend:
    instance: str
    runs: int
    usd: float | None = significant(9)
    device_hours: float | None = decimals(6)
    useful_share: float | None = decimals(4)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigurationCost:
    """One configuration's runs pooled: $ per 1M samples is their dollars over their samples."""

    instance: str
    world_size: int | None
    precision: str | None
    strategy: str | None
    global_batch_size: int | None
    runs: int
    usd: float | None = significant(9)
    samples_per_s_median: float | None = significant(6)
    usd_per_million_samples: float | None = significant(6)
    usd_per_million_tokens: float | None = significant(6)
    mfu_median: float | None = decimals(4)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpensiveRun:
    run_key: str
    run_id: str | None
    group: str
    start_unix: float | None = decimals(3)
    instance: str | None = None
    world_size: int | None = None
    duration_s: float | None = decimals(3)
    device_hours: float | None = decimals(6)
    usd: float | None = significant(9)
    useful_share: float | None = decimals(4)
    badput_usd: float | None = significant(9)
    top_recommendation: str | None = None
    top_gain: float | None = decimals(4)  # a fraction


@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    """The figures for one choice of the page's filters: `group` None is every tag value, `period` None
    every period."""

    group: str | None
    period: str | None
    totals: Totals
    ledger: list[LedgerLine]
    instances: list[InstanceSpend]  # by spend, capped
    configurations: list[ConfigurationCost]  # by spend, capped
    expensive_runs: list[ExpensiveRun]  # by spend, capped (TOP_RUNS_ALL / TOP_RUNS_SLICE)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpendCell:
    """Spend in one period by one value (a tag value or an instance type)."""

    period: str
    key: str
    runs: int
    usd: float | None = significant(9)
    device_hours: float | None = decimals(6)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegressionPair:
    """Two consecutive runs of one tag value and configuration, judged on samples/s."""

    group: str
    configuration: str
    baseline_key: str
    baseline_run_id: str | None
    candidate_key: str
    candidate_run_id: str | None
    candidate_start_unix: float = decimals(3)
    period: str  # the candidate's
    baseline_windows: int  # step windows used as samples (the first, warm-up, left out)
    candidate_windows: int
    baseline_samples_per_s: float | None = significant(6)  # geometric mean of the windows
    candidate_samples_per_s: float | None = significant(6)
    change: float | None = decimals(4)  # signed fraction, positive = slower
    ratio_low: float | None = decimals(4)  # the rule's interval of candidate / baseline
    ratio_high: float | None = decimals(4)
    p_worse: float | None = significant(4)
    verdict: str  # Verdict's text: REGRESSION, IMPROVEMENT, NO CHANGE, INCONCLUSIVE
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Regressions:
    rule: str  # the rule, in words
    samples: str  # what the rule's samples are here, and why that is weaker evidence
    pairs_judged: int
    verdicts: dict[str, int]  # every pair's verdict, counted
    pairs: list[RegressionPair]  # capped at MAX_PAIRS: regressions first
    ungrouped_runs: int  # runs without the group-by tag: never paired


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    index: str
    generated_unix: float = decimals(3)
    filters: FleetFilters
    runs_in_index: int
    unreadable_runs: int  # rows the index marks with an error (no figures), within the filters
    unreadable_examples: list[str]  # their run keys, a few
    period_unit: str  # day, week, month, quarter or year
    first_start_unix: float | None = decimals(3)
    last_start_unix: float | None = decimals(3)
    groups: list[str]  # the page's tag-value buttons, by spend (OTHER_GROUP last where used)
    periods: list[str]  # the page's period buttons, in time order
    slices: list[Slice]  # the first is the whole selection
    spend_by_group: list[SpendCell]  # period x tag value
    spend_by_instance: list[SpendCell]  # period x instance
    regressions: Regressions
    notes: list[str] = field(default_factory=list)

    @property
    def whole(self) -> Slice:
        return self.slices[0]

    def slice(self, group: str | None, period: str | None) -> Slice | None:
        return next((s for s in self.slices if s.group == group and s.period == period), None)


# -- reading the index -------------------------------------------------------------------------------


def parse_when(text: str, option: str, end_of_day: bool = False) -> datetime:
    """--since/--until: an ISO date (2026-11-01) or date and time (2026-11-01T12:00, UTC unless it says
    otherwise). A bare date as --until means the whole day. FleetIndexError names the option and the fix."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            moment = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
            return moment + timedelta(days=1) if end_of_day else moment
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise FleetIndexError(
            f"{option} {text!r} is not a date; write it as YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def parse_tag(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise FleetIndexError(f"--tag {text!r} is not KEY=VALUE; write it as --tag project=llm")
    return key.strip(), value.strip()


# -- the view ----------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def _ratio(part: Any, whole: Any) -> float | None:
    return float(part) / float(whole) if part is not None and whole else None


_CATEGORY_S = " + ".join(f"coalesce({c}_s, 0)" for c in BADPUT_CATEGORIES)
_ANY_CATEGORY = " OR ".join(f"{c}_s IS NOT NULL" for c in BADPUT_CATEGORIES)


def _totals_columns() -> str:
    ledger = ", ".join(f"sum({c}_s) AS {c}_s, sum({c}_usd) AS {c}_usd" for c in BADPUT_CATEGORIES)
    return (
        "count(*) AS runs, count(usd) AS priced, sum(usd) AS usd, sum(device_hours) AS device_hours, "
        "sum(samples) AS samples, sum(tokens) AS tokens, "
        "sum(usd) FILTER (WHERE samples > 0) AS usd_s, sum(samples) FILTER (WHERE usd IS NOT NULL) AS samples_p, "
        "sum(usd) FILTER (WHERE tokens > 0) AS usd_t, sum(tokens) FILTER (WHERE usd IS NOT NULL) AS tokens_p, "
        "sum(useful_share * wall_s) AS useful_s, sum(wall_s) FILTER (WHERE useful_share IS NOT NULL) AS useful_wall_s, "
        "sum(badput_usd) AS badput_usd, sum(usd) FILTER (WHERE badput_usd IS NOT NULL) AS badput_base_usd, "
        f"{ledger}"
    )


def _totals(row: dict[str, Any]) -> Totals:
    def per_million(usd: Any, amount: Any) -> float | None:
        return float(usd) / float(amount) * 1e6 if usd is not None and amount else None

    return Totals(
        runs=int(row["runs"]),
        priced_runs=int(row["priced"]),
        usd=_num(row["usd"]),
        device_hours=_num(row["device_hours"]),
        samples=None if row["samples"] is None else int(row["samples"]),
        tokens=None if row["tokens"] is None else int(row["tokens"]),
        usd_per_million_samples=per_million(row["usd_s"], row["samples_p"]),
        usd_per_million_tokens=per_million(row["usd_t"], row["tokens_p"]),
        useful_share=_ratio(row["useful_s"], row["useful_wall_s"]),
        badput_usd=_num(row["badput_usd"]),
        badput_usd_share=_ratio(row["badput_usd"], row["badput_base_usd"]),
    )


def _ledger(row: dict[str, Any]) -> list[LedgerLine]:
    seconds = {c: float(row[f"{c}_s"] or 0.0) for c in BADPUT_CATEGORIES}
    usd = {c: _num(row[f"{c}_usd"]) for c in BADPUT_CATEGORIES}
    total_s = sum(seconds.values())
    priced = [v for v in usd.values() if v is not None]
    total_usd = sum(priced) if priced else None
    return [
        LedgerLine(
            category=c,
            seconds=seconds[c],
            share=_ratio(seconds[c], total_s),
            usd=usd[c],
            usd_share=_ratio(usd[c], total_usd),
        )
        for c in BADPUT_CATEGORIES
    ]


def _rows(con: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


# The four ways a slice is chosen: (tag value, period), tag value only, period only, neither.
_SLICE_KEYS = (("g", "p"), ("g",), ("p",), ())


def _slice_key(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[str | None, str | None]:
    return (row["g"] if "g" in keys else None, row["p"] if "p" in keys else None)


def _ranked(
    con: Any, select: str, group_extra: str, order: str, cap_all: int, cap_slice: int
) -> dict[tuple[str | None, str | None], list[dict[str, Any]]]:
    """Rows of `select` over `sel` per slice, ranked by `order` within each slice and capped."""
    out: dict[tuple[str | None, str | None], list[dict[str, Any]]] = {}
    for keys in _SLICE_KEYS:
        cols = ", ".join(keys)
        partition = f"PARTITION BY {cols}" if keys else ""
        cap = cap_all if not keys else cap_slice
        group = ", ".join([*keys, group_extra]) if group_extra else ""
        sql = (
            f"SELECT {', '.join(keys) + ', ' if keys else ''}{select} FROM sel "
            f"{'GROUP BY ' + group if group else ''} "
            f"QUALIFY row_number() OVER ({partition} ORDER BY {order}) <= {cap}"
        )
        for row in _rows(con, sql):
            out.setdefault(_slice_key(row, keys), []).append(row)
    for rows in out.values():
        # Unpriced runs rank by their device hours: the most expensive had a price been set.
        rows.sort(
            key=lambda r: (
                -(r.get("usd") or 0.0),
                -(r.get("device_hours") or 0.0),
                str(r.get("sort_key", "")),
            )
        )
    return out


def build_fleet_view(
    index_dir: str | Path,
    *,
    tags: dict[str, str] | None = None,
    since: str | None = None,
    until: str | None = None,
    group_by: str | None = None,
    rule: Rule | None = None,
) -> FleetView:
    """The fleet's figures over the runs of `index_dir` that match every tag in `tags` and started within
    [since, until] (ISO dates; a bare --until date is the whole day). FleetIndexError for an index that
    cannot be read or a date that cannot."""
    index_dir = Path(index_dir)
    tags = dict(tags or {})
    since_at = parse_when(since, "--since") if since else None
    until_at = parse_when(until, "--until", end_of_day=True) if until else None
    con = connect(index_dir)
    try:
        return _view(con, index_dir, tags, since, until, since_at, until_at, group_by, rule or Rule())
    finally:
        con.close()


def _view(
    con: Any,
    index_dir: Path,
    tags: dict[str, str],
    since: str | None,
    until: str | None,
    since_at: datetime | None,
    until_at: datetime | None,
    group_by: str | None,
    rule: Rule,
) -> FleetView:
    where, params = ["true"], []
    for key, value in tags.items():
        where.append("element_at(tags, ?)[1] = ?")
        params += [key, value]
    if since_at is not None:
        where.append("start >= ?")
        params.append(since_at)
    if until_at is not None:
        where.append("start < ?" if until and len(until.strip()) == 10 else "start <= ?")
        params.append(until_at)
    runs_in_index = int(con.execute("SELECT count(*) FROM runs").fetchone()[0])
    con.execute(f"CREATE TEMP TABLE chosen AS SELECT * FROM runs WHERE {' AND '.join(where)}", params)
    # A row the index could not read has no figures, and often no start: counted, never summed. (A filter
    # on the start leaves out such rows whose start is unknown.)
    bad = _rows(con, "SELECT run_key FROM chosen WHERE error IS NOT NULL ORDER BY run_key")

    if group_by is None:
        group_by, basis = DEFAULT_GROUP_TAGS[0], f"the default: tag {DEFAULT_GROUP_TAGS[0]!r}"
        for candidate in DEFAULT_GROUP_TAGS:
            hit = con.execute(
                "SELECT count(*) FROM chosen WHERE error IS NULL AND element_at(tags, ?)[1] IS NOT NULL",
                [candidate],
            ).fetchone()[0]
            if hit:
                group_by = candidate
                basis = f"the default: the first of tags {', '.join(DEFAULT_GROUP_TAGS)} that the runs carry"
                break
    else:
        basis = "--group-by"

    period_unit = _period_unit(con)
    con.execute(
        f"""CREATE TEMP TABLE base AS SELECT *,
            element_at(tags, ?)[1] AS group_value,
            CASE WHEN {_ANY_CATEGORY} THEN {_CATEGORY_S} END AS wall_s,
            date_trunc('{period_unit}', start) AS period_start
        FROM chosen WHERE error IS NULL""",
        [group_by],
    )
    groups = _top_groups(con)
    shown = groups[:MAX_GROUPS]
    con.execute(
        "CREATE TEMP TABLE sel AS SELECT *, "
        "CASE WHEN group_value IS NULL THEN ? WHEN list_contains(?, group_value) THEN group_value ELSE ? END AS g, "
        f"{_period_label(period_unit, 'period_start')} AS p FROM base",
        [NO_GROUP, shown, OTHER_GROUP],
    )
    group_buttons = _group_buttons(con)
    # Every period of the span, those without a run too: the charts' axis is time, and a gap is news.
    periods = [
        r["p"]
        for r in _rows(
            con,
            f"SELECT {_period_label(period_unit, 't')} AS p "
            "FROM (SELECT min(period_start) AS a, max(period_start) AS b FROM sel), "
            f"unnest(generate_series(a, b, INTERVAL 1 {period_unit})) AS g(t) WHERE a IS NOT NULL ORDER BY t",
        )
    ]
    first_last = con.execute("SELECT epoch(min(start)), epoch(max(start)) FROM sel").fetchone()

    slices = _slices(con, group_buttons, periods)
    spend_by_group = _spend(con, "g")
    spend_by_instance = _spend(con, "coalesce(instance, gpu, 'unknown')")
    regressions = _regressions(con, group_by, period_unit, rule)

    notes = [
        "Dollars are each run's device time at its own price (the index's usd); a run without a price is "
        "counted in runs and hours, not in dollars.",
        f"Runs are grouped by their {group_by!r} tag ({basis}); runs without it are {NO_GROUP}.",
    ]
    if len(groups) > MAX_GROUPS:
        notes.append(
            f"{len(groups)} values of the tag: the {MAX_GROUPS} with the most spend have their own filter, "
            f"the rest share {OTHER_GROUP}."
        )
    return FleetView(
        index=str(index_dir),
        generated_unix=time.time(),
        filters=FleetFilters(tags=tags, since=since, until=until, group_by=group_by, group_by_basis=basis),
        runs_in_index=runs_in_index,
        unreadable_runs=len(bad),
        unreadable_examples=[r["run_key"] for r in bad[:5]],
        period_unit=period_unit,
        first_start_unix=_num(first_last[0]),
        last_start_unix=_num(first_last[1]),
        groups=group_buttons,
        periods=periods,
        slices=slices,
        spend_by_group=spend_by_group,
        spend_by_instance=spend_by_instance,
        regressions=regressions,
        notes=notes,
    )


def _period_label(unit: str, column: str) -> str:
    """SQL for a period's label: 2026-11-23, ISO week 2026-W48, 2026-11, 2026-Q4, 2026."""
    if unit == "quarter":
        return f"strftime({column}, '%Y') || '-Q' || quarter({column})"
    pattern = {"day": "%Y-%m-%d", "week": "%G-W%V", "month": "%Y-%m", "year": "%Y"}[unit]
    return f"strftime({column}, '{pattern}')"


def _period_unit(con: Any) -> str:
    """The finest period that spans the selected runs' starts in at most MAX_PERIODS of them."""
    spans = con.execute(
        "SELECT "
        + ", ".join(
            f"date_diff('{u}', date_trunc('{u}', min(start)), date_trunc('{u}', max(start))) + 1"
            for u in PERIOD_UNITS
        )
        + " FROM chosen WHERE error IS NULL"
    ).fetchone()
    return next(
        (u for u, n in zip(PERIOD_UNITS, spans, strict=True) if n is None or n <= MAX_PERIODS), "year"
    )


def _top_groups(con: Any) -> list[str]:
    """The tag's values, by spend (then runs)."""
    rows = _rows(
        con,
        "SELECT group_value AS g, coalesce(sum(usd), 0) AS usd, count(*) AS n FROM base "
        "WHERE group_value IS NOT NULL GROUP BY group_value ORDER BY usd DESC, n DESC, g",
    )
    return [r["g"] for r in rows]


def _group_buttons(con: Any) -> list[str]:
    """The page's tag-value filters: the named values by spend, then OTHER_GROUP and NO_GROUP where used."""
    rows = _rows(
        con,
        "SELECT g, coalesce(sum(usd), 0) AS usd, count(*) AS n FROM sel GROUP BY g ORDER BY usd DESC, n DESC, g",
    )
    found = [r["g"] for r in rows]
    named = [g for g in found if g not in (OTHER_GROUP, NO_GROUP)]
    return named + [g for g in (OTHER_GROUP, NO_GROUP) if g in found]


def _slices(con: Any, groups: list[str], periods: list[str]) -> list[Slice]:
    totals: dict[tuple[str | None, str | None], dict[str, Any]] = {}
    for keys in _SLICE_KEYS:
        cols = ", ".join(keys)
        sql = f"SELECT {cols + ', ' if keys else ''}{_totals_columns()} FROM sel {'GROUP BY ' + cols if keys else ''}"
        for row in _rows(con, sql):
            if row["runs"]:
                totals[_slice_key(row, keys)] = row
    instances = _ranked(
        con,
        "coalesce(instance, gpu, 'unknown') AS instance, count(*) AS runs, sum(usd) AS usd, "
        "sum(device_hours) AS device_hours, sum(useful_share * wall_s) / "
        "sum(wall_s) FILTER (WHERE useful_share IS NOT NULL) AS useful_share, "
        "coalesce(instance, gpu, 'unknown') AS sort_key",
        "coalesce(instance, gpu, 'unknown')",
        "coalesce(sum(usd), 0) DESC, coalesce(sum(device_hours), 0) DESC, coalesce(instance, gpu, 'unknown')",
        TOP_ROWS_ALL,
        TOP_ROWS_SLICE,
    )
    config = "coalesce(instance, gpu, 'unknown'), world_size, precision, strategy, global_batch_size"
    configurations = _ranked(
        con,
        "coalesce(instance, gpu, 'unknown') AS instance, world_size, precision, strategy, global_batch_size, "
        "count(*) AS runs, sum(usd) AS usd, sum(device_hours) AS device_hours, median(samples_per_s) AS sps, "
        "median(mfu) AS mfu, "
        "sum(usd) FILTER (WHERE samples > 0) AS usd_s, sum(samples) FILTER (WHERE usd IS NOT NULL) AS samples_p, "
        "sum(usd) FILTER (WHERE tokens > 0) AS usd_t, sum(tokens) FILTER (WHERE usd IS NOT NULL) AS tokens_p, "
        "concat_ws('|', coalesce(instance, gpu, 'unknown'), world_size, precision, strategy, global_batch_size) "
        "AS sort_key",
        config,
        f"coalesce(sum(usd), 0) DESC, coalesce(sum(device_hours), 0) DESC, {config}",
        TOP_ROWS_ALL,
        TOP_ROWS_SLICE,
    )
    expensive = _ranked(
        con,
        "run_key, run_id, g AS grp, epoch(start) AS start_unix, instance, world_size, duration_s, usd, "
        "useful_share, badput_usd, top_recommendation, top_gain, device_hours, run_key AS sort_key",
        "",
        "coalesce(usd, 0) DESC, coalesce(device_hours, 0) DESC, run_key",
        TOP_RUNS_ALL,
        TOP_RUNS_SLICE,
    )

    def config_cost(r: dict[str, Any]) -> ConfigurationCost:
        return ConfigurationCost(
            instance=r["instance"],
            world_size=r["world_size"],
            precision=r["precision"],
            strategy=r["strategy"],
            global_batch_size=r["global_batch_size"],
            runs=int(r["runs"]),
            usd=_num(r["usd"]),
            samples_per_s_median=_num(r["sps"]),
            usd_per_million_samples=(
                float(r["usd_s"]) / float(r["samples_p"]) * 1e6
                if r["usd_s"] is not None and r["samples_p"]
                else None
            ),
            usd_per_million_tokens=(
                float(r["usd_t"]) / float(r["tokens_p"]) * 1e6
                if r["usd_t"] is not None and r["tokens_p"]
                else None
            ),
            mfu_median=_num(r["mfu"]),
        )

    out: list[Slice] = []
    for group in [None, *groups]:
        for period in [None, *periods]:
            key = (group, period)
            row = totals.get(key)
            if row is None:
                continue  # no runs in this choice: the page says so
            out.append(
                Slice(
                    group=group,
                    period=period,
                    totals=_totals(row),
                    ledger=_ledger(row),
                    instances=[
                        InstanceSpend(
                            instance=r["instance"],
                            runs=int(r["runs"]),
                            usd=_num(r["usd"]),
                            device_hours=_num(r["device_hours"]),
                            useful_share=_num(r["useful_share"]),
                        )
                        for r in instances.get(key, [])
                    ],
                    configurations=[config_cost(r) for r in configurations.get(key, [])],
                    expensive_runs=[
                        ExpensiveRun(
                            run_key=r["run_key"],
                            run_id=r["run_id"],
                            group=r["grp"],
                            start_unix=_num(r["start_unix"]),
                            instance=r["instance"],
                            world_size=r["world_size"],
                            duration_s=_num(r["duration_s"]),
                            device_hours=_num(r["device_hours"]),
                            usd=_num(r["usd"]),
                            useful_share=_num(r["useful_share"]),
                            badput_usd=_num(r["badput_usd"]),
                            top_recommendation=r["top_recommendation"],
                            top_gain=_num(r["top_gain"]),
                        )
                        for r in expensive.get(key, [])
                    ],
                )
            )
    return out


def _spend(con: Any, key: str) -> list[SpendCell]:
    rows = _rows(
        con,
        f"SELECT p, {key} AS k, count(*) AS n, sum(usd) AS usd, sum(device_hours) AS dh, min(period_start) AS ps "
        f"FROM sel GROUP BY p, {key} ORDER BY ps, coalesce(sum(usd), 0) DESC, k",
    )
    return [
        SpendCell(
            period=r["p"], key=str(r["k"]), runs=int(r["n"]), usd=_num(r["usd"]), device_hours=_num(r["dh"])
        )
        for r in rows
    ]


# -- regressions -------------------------------------------------------------------------------------

_VERDICT_ORDER = {
    Verdict.REGRESSION.value: 0,
    Verdict.IMPROVEMENT.value: 1,
    Verdict.INCONCLUSIVE.value: 2,
    Verdict.NO_CHANGE.value: 3,
}
SAMPLES_SENTENCE = (
    "The rule's samples are each run's step windows (samples/s per window, the first window left out as "
    "warm-up; its sentences say 'runs' for them). Windows within one run are autocorrelated (one host, one "
    "data order, one compile), so this is weaker evidence than separate runs: confirm a regression with "
    "repeated runs and tuneup compare."
)


def _configuration_text(r: dict[str, Any]) -> str:
    parts = [
        str(r["instance"] or r["gpu"] or "unknown instance"),
        plural(r["world_size"], "rank") if r["world_size"] is not None else "ranks unknown",
        str(r["precision"] or "precision unknown"),
        f"global batch {r['global_batch_size']}" if r["global_batch_size"] is not None else "batch unknown",
    ]
    return ", ".join(parts)


def _regressions(con: Any, group_by: str, period_unit: str, rule: Rule) -> Regressions:
    """Consecutive runs (by start) of one tag value and configuration, judged on their step windows'
    samples/s. Every pair is judged without the interval (a bisection each: seconds over 10,000 pairs),
    and one whose change is within min_effect is NO CHANGE without the test; the pairs kept are judged again
    with the interval."""
    rows = _rows(
        con,
        "SELECT run_key, run_id, group_value, instance, gpu, world_size, precision, global_batch_size, p, "
        "epoch(start) AS start_unix, lag(run_key) OVER w AS prev_key, lag(run_id) OVER w AS prev_id "
        "FROM sel WHERE group_value IS NOT NULL AND start IS NOT NULL "
        "WINDOW w AS (PARTITION BY group_value, coalesce(instance, gpu, 'unknown'), world_size, precision, "
        "global_batch_size "
        "ORDER BY start, run_key) "
        "ORDER BY start, run_key",
    )
    ungrouped = int(con.execute("SELECT count(*) FROM sel WHERE group_value IS NULL").fetchone()[0])
    pairs = [r for r in rows if r["prev_key"] is not None]
    windows = _windows(con)
    quick = dataclasses.replace(rule, resamples=0)  # every field of the rule, the interval left out
    mean_logs = {
        key: math.fsum(math.log(v) for v in values) / len(values) for key, values in windows.items() if values
    }
    judged: list[tuple[dict[str, Any], str, float]] = []  # (pair, verdict, size of the change)
    counts = {v.value: 0 for v in Verdict}
    for r in pairs:
        base, cand = windows.get(r["prev_key"], []), windows.get(r["run_key"], [])
        if len(base) >= MIN_RUNS_FOR_TEST and len(cand) >= MIN_RUNS_FOR_TEST:
            size = abs(math.expm1(mean_logs[r["run_key"]] - mean_logs[r["prev_key"]]))
            if size < rule.min_effect * NEAR_ONE:
                # The rule claims no change within min_effect (its threshold is never below it): NO CHANGE
                # without its test, a t distribution's tail each (seconds over 10,000 pairs).
                counts[Verdict.NO_CHANGE.value] += 1
                judged.append((r, Verdict.NO_CHANGE.value, size))
                continue
        result = decide("samples/s", base, cand, higher_is_better=True, unit="samples/s", rule=quick)
        counts[result.verdict.value] += 1
        judged.append((r, result.verdict.value, abs(result.change or 0.0)))
    judged.sort(key=lambda pair: (_VERDICT_ORDER[pair[1]], -pair[2]))
    kept: list[RegressionPair] = []
    for r, verdict, _size in judged[:MAX_PAIRS]:
        result = decide(
            "samples/s",
            windows.get(r["prev_key"], []),
            windows.get(r["run_key"], []),
            higher_is_better=True,
            unit="samples/s",
            rule=rule,
        )
        assert result.verdict.value == verdict  # neither the interval nor the shortcut changes a verdict
        kept.append(
            RegressionPair(
                group=r["group_value"],
                configuration=_configuration_text(r),
                baseline_key=r["prev_key"],
                baseline_run_id=r["prev_id"],
                candidate_key=r["run_key"],
                candidate_run_id=r["run_id"],
                candidate_start_unix=float(r["start_unix"]),
                period=r["p"],
                baseline_windows=len(result.baseline),
                candidate_windows=len(result.candidate),
                baseline_samples_per_s=result.baseline_mean,
                candidate_samples_per_s=result.candidate_mean,
                change=result.change,
                ratio_low=result.ci_low,
                ratio_high=result.ci_high,
                p_worse=result.p_worse,
                verdict=result.verdict.value,
                reason=result.reason,
            )
        )
    return Regressions(
        rule=f"samples/s, higher is better: {rule.describe()}",
        samples=SAMPLES_SENTENCE,
        pairs_judged=len(pairs),
        verdicts=counts,
        pairs=kept,
        ungrouped_runs=ungrouped,
    )


def _windows(con: Any) -> dict[str, list[float]]:
    """Each selected run's step windows' samples/s, in window order, the warm-up windows left out; only
    finite positive figures (the rule compares logs)."""
    rows = con.execute(
        f"""SELECT run_key, list(samples_per_s ORDER BY "window") FROM (
            SELECT s.run_key, s."window", s.samples_per_s,
                   row_number() OVER (PARTITION BY s.run_key ORDER BY s."window") AS nth
            FROM steps s SEMI JOIN sel ON s.run_key = sel.run_key)
        WHERE nth > {WARMUP_WINDOWS} AND samples_per_s > 0 AND isfinite(samples_per_s)
        GROUP BY run_key"""
    ).fetchall()
    return {key: list(values) for key, values in rows}
