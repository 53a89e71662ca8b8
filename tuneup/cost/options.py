"""What a run is priced with: the report's options (`tuneup report --instance ...`), else the choice the run
recorded, resolved into the job's price and the electricity price. The analysis (tuneup.analyze.cost)
turns them into the report's money figures; this layer knows nothing of the analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneup.cost.pricing import JobPrice, PriceChoice, price_for_run

if TYPE_CHECKING:
    from tuneup.record.schema import Run


@dataclass(frozen=True)
class CostOptions:
    """What `tuneup report` may add or replace: a price, a user catalog, electricity, targets."""

    price: PriceChoice | None = None
    catalog: str | None = None
    electricity_usd_per_kwh: float | None = None
    target_tokens: float | None = None
    target_steps: int | None = None
    # The badput ledger counts validation as useful work (model selection, early stopping), not as badput.
    validation_useful: bool = False


@dataclass(frozen=True)
class CostInputs:
    """What the report's caller adds to the run: a price, an electricity price, targets to project to."""

    price: JobPrice | None = None
    not_priced_reason: str | None = None
    electricity_usd_per_kwh: float | None = None
    target_tokens: float | None = None
    target_steps: int | None = None


def cost_inputs(run: Run, options: CostOptions | None) -> tuple[CostInputs, list[str]]:
    """The report's price and electricity: the command line's, else what the run recorded."""
    options = options or CostOptions()
    recorded = run.manifest.raw.get("pricing")
    recorded = recorded if isinstance(recorded, dict) else None
    price, reason, warnings = price_for_run(
        recorded,
        options.price,
        devices=run.manifest.world_size,
        nodes=run.manifest.num_nodes,
        catalog_path=options.catalog,
    )
    electricity = options.electricity_usd_per_kwh
    if electricity is None and recorded is not None:
        value = recorded.get("electricity_usd_per_kwh")
        valid = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        electricity = float(value) if valid and value >= 0 else None
    inputs = CostInputs(price, reason, electricity, options.target_tokens, options.target_steps)
    return inputs, warnings
