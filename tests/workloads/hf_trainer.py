"""A tiny GPT-2 (2 layers, width 32, built from its config in-process: nothing is downloaded) trained by
`transformers.Trainer` on CPU, recorded by `TuneupTrainerCallback`, with a known delay in each phase
(workloads.loops): in the collator (data), before the first block's forward (forward), in the backward
through the final layer norm (backward) and in the optimizer's step (optimizer). In-process (`train`) or
as a script under torchrun (DDP over gloo):

    python -m torch.distributed.run --nproc-per-node=2 tests/workloads/hf_trainer.py --out RUN_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.loops import Delays, SleepySGD, _sleep_ms, _SlowBackward
from workloads.phase_check import AlternateControlSteps

DEFAULT_DELAYS = Delays()

BATCH_SIZE = 4
SEQUENCE = 16
VOCAB = 64


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQUENCE), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_model(delays: Delays, validation_ms: float = 0.0) -> Any:
    """`validation_ms`: the delay of each evaluation batch's forward."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    model.transformer.h[0].register_forward_pre_hook(
        lambda m, a: (
            _sleep_ms(delays.forward_ms, "forward") if m.training else _sleep_ms(validation_ms, "validation")
        )
    )
    model.transformer.ln_f.register_forward_hook(
        lambda m, a, out: _SlowBackward.apply(out, delays.backward_ms) if m.training else out
    )
    return model


def make_trainer(
    out_dir: Path | str,
    callback: Any,
    steps: int,
    accumulate: int,
    delays: Delays,
    world_size: int = 1,
    logging_steps: int = 5,
    validate_every: int = 0,
    validation_ms: float = 0.0,
) -> Any:
    """`validate_every`: evaluate on two batches (`validation_ms` each) and save a checkpoint after every
    that many steps."""
    from transformers import Trainer, TrainingArguments

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        _sleep_ms(delays.data_ms, "data")
        return {k: torch.stack([item[k] for item in items]) for k in items[0]}

    model = make_model(delays, validation_ms)
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=accumulate,
        logging_steps=logging_steps,
        eval_strategy="steps" if validate_every else "no",
        eval_steps=validate_every or None,
        save_strategy="steps" if validate_every else "no",
        save_steps=validate_every or 500,
        per_device_eval_batch_size=BATCH_SIZE,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=Tokens((steps * accumulate + 4) * BATCH_SIZE * world_size),
        eval_dataset=Tokens(2 * BATCH_SIZE) if validate_every else None,
        data_collator=collate,
        optimizers=(SleepySGD(model.parameters(), delays.optimizer_ms), None),
        callbacks=[callback],
    )


class AlternateControl(TrainerCallback):
    """After tuneup's callback: every odd step a control step (workloads.phase_check.AlternateControlSteps)."""

    def __init__(self, session: Any) -> None:
        self._steps = AlternateControlSteps(session.exclude_start, session.exclude_end)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.step_ended()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.close()


def train(
    out: Path | str,
    steps: int,
    accumulate: int = 2,
    delays: Delays = DEFAULT_DELAYS,
    alternate_control: bool = False,
    world_size: int = 1,
    validate_every: int = 0,
    validation_ms: float = 0.0,
    **options: Any,
) -> Any:
    """Train `steps` optimizer steps; returns the callback (its record closed). `alternate_control`: every
    odd step is a control step (`AlternateControl`)."""
    from tuneup.plugins.huggingface import TuneupTrainerCallback

    callback = TuneupTrainerCallback(dirpath=out, **options)
    trainer = make_trainer(
        Path(out).parent / "hf-output",
        callback,
        steps,
        accumulate,
        delays,
        world_size,
        validate_every=validate_every,
        validation_ms=validation_ms,
    )
    if alternate_control:
        trainer.add_callback(AlternateControl(callback.session))
    trainer.train()
    return callback


def main(argv: list[str] | None = None) -> None:
    import os

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--accumulate", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    train(
        args.out,
        args.steps,
        args.accumulate,
        Delays(2.0, 2.0, 2.0, 2.0),
        world_size=world_size,
        telemetry_interval_s=0.5,
        count_flops=False,
    )


if __name__ == "__main__":
    main()
