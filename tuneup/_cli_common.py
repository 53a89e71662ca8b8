"""What the `tuneup` commands share: the error for bad input, the RUN_DIR argument, and --target.

Its own module so that a command defined elsewhere (`tuneup advise`) can use it without importing
tuneup.cli, which imports every command to build its parser: that was an import circle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneup.target import Target, TargetError, parse_target

if TYPE_CHECKING:
    from tuneup.cost.options import CostOptions

# How far below a RUN_DIR that is not a run to look for one: `reports/demo/run` is one level down,
# `reports/bench/<time>/candidate/run-00` (a set) two. Deeper would walk whole trees of runs.
RUN_SEARCH_DEPTH = 2
RUNS_LISTED = 5  # in the error for a directory of several runs: enough to pick one, not a wall of paths


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def runs_under(path: Path, depth: int = RUN_SEARCH_DEPTH) -> list[Path]:
    """The run directories (those with a manifest) under `path`, up to `depth` levels down, sorted.

    A run's own subdirectories are not searched: a resumed run keeps its later segments there, each
    with a manifest of its own, and they are that run, not other runs.
    """
    from tuneup.record.schema import MANIFEST_FILE

    found: list[Path] = []
    try:
        # Hidden directories (.git, a report's scratch directory) hold no run a user means.
        children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return found  # unreadable: load_run names the directory and the problem
    for child in children:
        if (child / MANIFEST_FILE).is_file():
            found.append(child)
        elif depth > 1:
            found.extend(runs_under(child, depth - 1))
    return found


def resolve_run_dir(path: str | Path, command: str) -> str | Path:
    """The run a RUN_DIR argument names: `path` itself when it is a run (or is no directory at all,
    which load_run then explains, or a URL on object storage, which load_run reads); else the one run
    under it, said on stderr. UsageError names the runs when there are several."""
    from tuneup.record.remote import is_url
    from tuneup.record.schema import MANIFEST_FILE

    if is_url(path):
        return str(path)
    path = Path(path)

    if not path.is_dir() or (path / MANIFEST_FILE).is_file():
        return path
    runs = runs_under(path)
    if not runs:
        return path  # load_run says why it is not a run (empty, or no manifest) and what to pass
    if len(runs) == 1:
        print(f"tuneup {command}: {path} is not a run; using the one run in it, {runs[0]}", file=sys.stderr)
        return runs[0]
    shown = ", ".join(str(r) for r in runs[:RUNS_LISTED])
    more = f" and {len(runs) - RUNS_LISTED} more" if len(runs) > RUNS_LISTED else ""
    raise UsageError(
        f"{path} is not a run but holds {len(runs)} runs ({shown}{more}); pass one of them, "
        f"e.g. tuneup {command} {runs[0]}"
    )


def target_option(args: Any) -> Target | None:
    """The command's --target, parsed (None where not given); UsageError with TargetError's message for one
    that cannot be read. `tuneup report`, `show` and `advise` take it so."""
    text = getattr(args, "target", None)
    if text is None:
        return None
    try:
        return parse_target(text)
    except TargetError as exc:
        raise UsageError(str(exc)) from None


def add_cost_arguments(
    parser: argparse.ArgumentParser,
    what: str = "price the run (replaces a price it recorded); `tuneup catalog` lists the instances",
) -> None:
    """Options that price a run after the fact; `what` says whether they replace a price the run recorded."""
    group = parser.add_argument_group("cost", what)
    price = group.add_mutually_exclusive_group()
    price.add_argument("--instance", metavar="KEY", help="a catalog instance, e.g. aws:p4d.24xlarge")
    price.add_argument("--price-per-hour", metavar="USD", type=float, help="your own price in USD per hour")
    group.add_argument("--spot", action="store_true", help="with --instance: its spot price")
    group.add_argument(
        "--price-per",
        choices=("node", "gpu"),
        default="node",
        help="with --price-per-hour: the price of one node or of one GPU (default: %(default)s)",
    )
    group.add_argument(
        "--catalog", metavar="CSV", help="instances that extend or override the packaged catalog"
    )
    group.add_argument(
        "--electricity-price", metavar="USD_PER_KWH", type=float, help="to cost the GPUs' energy"
    )
    group.add_argument(
        "--target-tokens", metavar="N", type=float, help="also project time and cost to N tokens"
    )
    group.add_argument("--target-steps", metavar="N", type=int, help="also project time and cost to N steps")
    group.add_argument(
        "--validation-useful",
        action="store_true",
        help="the badput ledger counts validation as useful work (model selection, early stopping), not badput",
    )


def cost_options(args: argparse.Namespace) -> CostOptions | None:
    """The cost options given on the command line, checked; UsageError names the option and the fix."""
    from tuneup.catalog import CatalogError, load_instances
    from tuneup.cost.options import CostOptions
    from tuneup.cost.pricing import PriceChoice, PricingError, check_choice

    for name in ("electricity_price", "target_tokens", "target_steps"):
        value = getattr(args, name, None)
        if value is not None and not (value > 0 and value != float("inf")):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    try:
        if args.catalog is not None:
            load_instances(args.catalog)  # a bad file fails here, naming its line
        choice = None
        if args.instance is not None or args.price_per_hour is not None:
            choice = PriceChoice(
                instance=args.instance,
                spot=args.spot,
                price_per_hour=args.price_per_hour,
                price_per=args.price_per,
                catalog=args.catalog,
                source="command line",
            )
            choice = check_choice(choice, where="--instance" if args.instance else "--price-per-hour")
        elif args.spot:
            raise PricingError("--spot needs --instance")
    except (CatalogError, PricingError) as exc:
        raise UsageError(str(exc)) from None
    options = CostOptions(
        price=choice,
        catalog=args.catalog,
        electricity_usd_per_kwh=args.electricity_price,
        target_tokens=args.target_tokens,
        target_steps=args.target_steps,
        validation_useful=bool(getattr(args, "validation_useful", False)),
    )
    return options if options != CostOptions() else None
