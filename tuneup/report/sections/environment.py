"""The Environment section: what the run ran with (versions, git state, seeds, host, GPUs, allow-listed
environment variables, trainer and data loader configuration), as the manifest captured it.

These are the manifest's own records, free-form by nature, so this section reads their keys; it shows each
value by what its key's unit suffix says it is (`by_name`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, KeyValues, Paragraph, table
from tuneup.report.format import byte_rate, duration, ms, size_bytes, text, unix_time, yes_no
from tuneup.report.plotting import Plot

ID = "environment"
TITLE = "Environment"
PLOTS: tuple[Plot, ...] = ()


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    env = analysis.environment
    out: list[Block] = [_kv("Versions", env.versions)]
    git = env.git
    if isinstance(git, dict):
        out.append(
            KeyValues(
                "Git",
                (
                    ("Commit", text(git.get("commit"))),
                    ("Branch", text(git.get("branch"))),
                    ("Uncommitted changes", yes_no(git.get("dirty"))),
                    ("Remote", text(git.get("remote"))),
                ),
            )
        )
    else:
        out.append(Paragraph("Git: the training script was not in a git checkout.", True))
    out.append(_kv("Seeds", env.seeds))
    out.append(_kv("Host", env.host))
    gpus = env.gpus if isinstance(env.gpus, dict) else {}
    inventory = [g for g in gpus.get("gpus") or [] if isinstance(g, dict)]
    if inventory:
        rows = [
            (
                text(g.get("index")),
                text(g.get("name")),
                text(g.get("pci_bus_id")),
                size_bytes(g.get("memory_total_bytes")),
            )
            for g in inventory
        ]
        title = (
            f"GPUs (driver {text(gpus.get('driver_version'))}, "
            f"CUDA driver {text(gpus.get('cuda_driver_version'))})"
        )
        out.append(table(title, ("Index", "Name", "PCI bus id", "Memory"), rows, (3,)))
    variables = env.env if isinstance(env.env, dict) else {}
    if variables:
        rows = [(str(k), text(v)) for k, v in sorted(variables.items(), key=lambda kv: str(kv[0]))]
        out.append(
            table(
                "Environment variables (allow-listed, secrets redacted)",
                ("Variable", "Value"),
                rows,
                detail=True,
            )
        )
    else:
        out.append(Paragraph("Environment variables: none captured.", True))
    out.append(_kv("Trainer configuration", env.trainer, detail=True))
    out.append(_kv("Data loader configuration", env.dataloader, detail=True))
    return out


def by_name(key: object, value: object) -> str:
    """A value shown by what its name says it is: the report's names end in their unit."""
    name = str(key)
    if name.endswith("_bytes"):
        return size_bytes(value)
    if name.endswith("_bytes_per_s"):
        return byte_rate(value)
    if name.endswith("_unix"):
        return unix_time(value)
    if name.endswith("_ms"):
        return ms(value)
    if name.endswith("_s"):
        return duration(value)
    return text(value)


def _kv(title: str, value: dict[str, Any] | None, detail: bool = False) -> KeyValues | Paragraph:
    # The manifest's records are free-form: anything but a non-empty mapping reads as not recorded.
    if not isinstance(value, dict) or not value:
        return Paragraph(f"{title}: not recorded.", True)
    return KeyValues(title, tuple((str(k), by_name(k, v)) for k, v in value.items()), detail)
