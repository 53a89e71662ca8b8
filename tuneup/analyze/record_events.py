"""Findings from what the callback saw happen to the training setup, recorded as events: settings the
trainer did not apply. They change what ran, so the report says them beside the figures, not only the
training log."""

from __future__ import annotations

from tuneup.analyze.model import Finding
from tuneup.record.schema import Run


def event_findings(run: Run) -> list[Finding]:
    out: list[Finding] = []
    hooks = sorted(
        {
            str(e.get("hook"))
            for rec in run.ranks.values()
            for e in rec.events
            if e.get("kind") == "ddp_comm_hook_dropped"
        }
    )
    if hooks:
        out.append(
            Finding(
                "comm_hook_dropped",
                "warning",
                f"The DDP communication hook you passed was not applied ({', '.join(hooks)})",
                "Lightning applies DDPStrategy(ddp_comm_hook=...) only on CUDA devices: this run all-reduced "
                "uncompressed gradients with the default hook, and its communication figures are the default "
                "hook's. On CPU, register the hook yourself from on_fit_start: "
                "trainer.strategy.model.register_comm_hook(state, hook).",
            )
        )
    return out
