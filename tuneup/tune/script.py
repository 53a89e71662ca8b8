"""How a trial's settings reach the user's training command.

Two kinds of script:
- "cli": a LightningCLI script. Settings become command-line overrides after the user's own arguments
  (later ones win): `--trainer.accumulate_grad_batches=4`, `--data.batch_size=64`,
  `--trainer.precision=bf16-mixed`, `--data.num_workers=2`. Each knob's key is in the registry
  (tuneup.tune.knobs): a Trainer argument's is fixed (`cli_key`); an init argument (`cli_arg`) is wherever
  the script's own resolved configuration (`--print_config`) has the datamodule or model take it
  (`data.batch_size`, `data.init_args.batch_size`, `model.batch_size`, ...). What has no key (the comm
  hook, a worker count the datamodule does not take) goes to TuneupCallback through the environment, and
  `--trainer.callbacks+=tuneup.TuneupCallback` is added when the config has none.
- "callback": any other script that trains with `TuneupCallback()`: every setting goes through the
  environment (TUNEUP_TRIAL) and the callback applies it (plugins/lightning/trial.py).

A script is taken for LightningCLI when its source mentions LightningCLI; `--script-kind` overrides that.
The configuration is only printed for a LightningCLI script: a plain script given `--print_config` might
ignore it and train.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneup.tune import knobs as registry
from tuneup.tune.space import Config

CALLBACK_PATH = "tuneup.TuneupCallback"
PRINT_CONFIG_TIMEOUT_S = 300.0


class ScriptError(ValueError):
    """A command that cannot be tuned: names the problem and the fix (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Script:
    argv: tuple[str, ...]
    kind: str  # "cli" or "callback"
    overrides: dict[str, str] = field(default_factory=dict)  # knob -> CLI key, for "cli"
    current: dict[str, Any] = field(default_factory=dict)  # knob -> value in the resolved config
    add_callback: bool = False

    def trial_argv(self, config: Config, baseline: Config) -> tuple[list[str], dict[str, Any]]:
        """(argv, settings for the callback) that run `config`. Knobs at the baseline's value are left to
        the script; the rest become overrides where the CLI has a key, else callback settings."""
        argv = list(self.argv)
        settings: dict[str, Any] = {}
        if self.add_callback:
            argv.append(f"--trainer.callbacks+={CALLBACK_PATH}")
        for knob, value in config.as_dict().items():
            if value == getattr(baseline, knob):
                continue
            key = self.overrides.get(knob) if self.kind == "cli" else None
            if key is not None:
                argv.append(f"--{key}={value}")
            else:
                settings[knob] = value
        return argv, settings


def script_file(argv: list[str]) -> Path | None:
    """The Python file a command runs: `python x.py ...`, `x.py ...`, `python -m pkg.mod ...`, or a torchrun
    or launcher in front of them."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and Path(arg).is_file():
            return Path(arg)
        if arg == "-m" and i + 1 < len(argv):
            try:
                spec = importlib.util.find_spec(argv[i + 1])
            except (ImportError, ValueError):
                return None
            return Path(spec.origin) if spec is not None and spec.origin else None
    return None


def detect_kind(argv: list[str]) -> str:
    path = script_file(argv)
    if path is None:
        return "callback"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "callback"
    return "cli" if "LightningCLI" in text else "callback"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping):
                out.update(_flatten(v, key))
            else:
                out[key] = v
    return out


def _find_key(flat: Mapping[str, Any], sections: tuple[str, ...], name: str) -> str | None:
    """The first key `<section>[.init_args].<name>` present, in the order of `sections`."""
    for section in sections:
        for key in (f"{section}.{name}", f"{section}.init_args.{name}"):
            if key in flat:
                return key
    return None


_TOP_LEVEL_KEY = re.compile(r"^[A-Za-z_][\w.-]*:(\s|$)")


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def parse_printed_config(stdout: str) -> dict[str, Any] | None:
    """The LightningCLI configuration in what `--print_config` printed, or None.

    Lightning's examples call `cli_lightning_logo()` before `LightningCLI(...)`, so the YAML may follow an
    ASCII logo (with terminal colour codes) or anything else the script prints first. The configuration is
    the YAML from the first top-level key (`trainer:`, `seed_everything:`, ...) on: each line that starts one
    is tried in turn until the rest parses as a mapping with a `trainer` section."""
    import yaml

    lines = stdout.splitlines()
    starts = [0] + [i for i, line in enumerate(lines) if i > 0 and _TOP_LEVEL_KEY.match(line)]
    for start in starts:
        try:
            config = yaml.safe_load("\n".join(lines[start:]))
        except yaml.YAMLError:
            continue
        if isinstance(config, Mapping) and "trainer" in config:
            return dict(config)
    return None


def read_cli_config(argv: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    """The script's resolved configuration, from `--print_config` (parsed as YAML)."""
    if importlib.util.find_spec("yaml") is None:
        raise ScriptError(
            "reading a LightningCLI script's configuration needs PyYAML (jsonargparse installs it): "
            "pip install pyyaml, or pass --script-kind callback"
        )
    try:
        proc = subprocess.run(
            [*argv, "--print_config"],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=PRINT_CONFIG_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ScriptError(f"cannot run {argv[0]!r} ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise ScriptError(
            f"{' '.join(argv)} --print_config did not finish in {PRINT_CONFIG_TIMEOUT_S:.0f} s; "
            "pass --script-kind callback to tune it through TuneupCallback instead"
        ) from None
    if proc.returncode != 0:
        raise ScriptError(
            f"{' '.join(argv)} --print_config failed (exit {proc.returncode}: {_tail(proc.stderr or proc.stdout)}); "
            "fix the command so that it runs with --print_config appended"
        )
    config = parse_printed_config(proc.stdout)
    if config is None:
        raise ScriptError(
            f"{' '.join(argv)} --print_config exited 0 but printed no YAML mapping with a 'trainer' section "
            f"(its last lines: {_tail(proc.stdout)}); a LightningCLI script prints one (after anything it prints "
            "first, such as cli_lightning_logo()); if the script only mentions LightningCLI and is not one, "
            "pass --script-kind callback"
        )
    return dict(config)


# Where a knob's init argument (its `cli_arg`) is looked for in a LightningCLI config, in this order.
CLI_ARG_SECTIONS = ("data", "model")


def cli_script(argv: list[str], config: Mapping[str, Any]) -> Script:
    """A LightningCLI script: each knob's override key is its fixed `cli_key` (a Trainer argument), or its
    `cli_arg` where the resolved config has one (tuneup.tune.knobs)."""
    flat = _flatten(config)
    overrides: dict[str, str] = {}
    for knob in registry.knobs():
        key = knob.cli_key
        if key is None and knob.cli_arg is not None:
            key = _find_key(flat, CLI_ARG_SECTIONS, knob.cli_arg)
        if key is not None:
            overrides[knob.name] = key
    current = {knob: flat.get(key) for knob, key in overrides.items() if key in flat}
    callbacks = (config.get("trainer") or {}).get("callbacks") or []
    if not isinstance(callbacks, list):
        callbacks = [callbacks]
    has_callback = any("TuneupCallback" in str(c) for c in callbacks)
    return Script(tuple(argv), "cli", overrides, current, add_callback=not has_callback)


def inspect_script(argv: list[str], env: Mapping[str, str], kind: str = "auto") -> Script:
    if not argv:
        raise ScriptError("no command to tune: put it after --, e.g. tuneup tune -- python train.py")
    kind = detect_kind(argv) if kind == "auto" else kind
    if kind == "cli":
        return cli_script(argv, read_cli_config(argv, env))
    if kind != "callback":
        raise ScriptError(f"--script-kind {kind!r} is not one of auto, cli, callback")
    return Script(tuple(argv), "callback")
