"""The fleet view: many runs at once, above the per-run layers (it reads records and analyses; nothing
below imports it).

- `tuneup index PATH_OR_URL...` walks directories or object-storage prefixes of run records and keeps a
  Parquet index of them (one row per run, and a compact step-time summary per run), incrementally;
- `tuneup fleet INDEX` renders the index: spend by tag and instance, $ per 1M samples by configuration, the
  badput ledger summed across runs, the most expensive runs and regressions between consecutive runs.

pyarrow and DuckDB are the `fleet` extra: recording and a run's report need neither.
"""
