"""Gradient synchronisation strategies that apply the advice: compression and local SGD, with a safeguard.

- `config`: the settings (`SyncConfig`) and their checks; no torch.
- `safeguard`: when the measured error or the loss says the strategy is hurting training; no torch.
- `powersgd`: low-rank gradient compression that runs on gloo as on NCCL.
- `hook`: the DDP comm hook that carries every mode (exact, fp16, bf16, PowerSGD, local).
- `averaging`: local SGD's parameter averaging, within and across nodes.
- `controller`: what happens at each optimizer step (warm-up, averaging, checks, fallback).

The Lightning strategy that uses them is `tuneup.plugins.lightning.strategy`.
"""
