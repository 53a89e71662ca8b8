"""Trainer integrations of tuneup, installed as `tuneup.plugins`.

- `lightning`: `TuneupCallback` for a PyTorch Lightning Trainer (either namespace, or a LightningCLI
  config), and `TuneupDDPStrategy`, Lightning's DDP strategy with tuneup's gradient compression, local SGD
  and safeguard (tuneup.sync);
- `fabric`: `instrument(fabric)`, one line that records a Lightning Fabric loop;
- `huggingface`: `TuneupTrainerCallback` for the `transformers.Trainer`;
- `loop`: `track(...)` (`tuneup.track`), for a hand-written PyTorch loop, one process or torchrun.

Each recorder is a thin adapter over the trainer-agnostic recording session (`tuneup.recording`): it
translates its trainer's events into the session's calls, records what it cannot see as not timed, and does
no analysis of its own. The strategy applies `tuneup.sync` the Lightning way, and the callback records it.
"""
