"""The embedded demo: a small transformer language model on synthetic tokens, trained with TuneupCallback.

The tokens follow a random first-order Markov chain, so the model has something real to learn and the
loss falls. On a 2-core machine it trains with DDP over 2 gloo processes; on GPUs it uses them (up to 2)
in bf16-mixed where supported. DDP relaunches this same command for rank 1 (with LOCAL_RANK set), so
everything that must happen once (clearing the old run) is guarded on being the launching process.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB_SIZE = 256
SEQ_LEN = 64
BATCH_SIZE = 16
D_MODEL = 128
N_LAYERS = 2
N_HEADS = 4
# Held-out sequences from the same chain, validated every VAL_EVERY_STEPS steps: the report's convergence
# section shows val_loss against steps, hours and dollars, and when it reached TARGET (the chain's entropy,
# ln 4 = 1.39 nats, is the floor no model can go below).
VAL_SEQUENCES = 64
VAL_EVERY_STEPS = 50
TARGET = "val_loss<=1.55"


@dataclass(frozen=True)
class DemoConfig:
    out_dir: Path = Path("reports/demo")
    max_steps: int = 300
    devices: int | None = None

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"--steps must be at least 1, got {self.max_steps}")
        if self.devices is not None and self.devices < 1:
            raise ValueError(f"--devices must be at least 1, got {self.devices}")

    @property
    def run_dir(self) -> Path:
        return self.out_dir / "run"


def _lightning() -> Any:
    try:
        import lightning.pytorch as L
    except ImportError:
        import pytorch_lightning as L
    return L


def _markov_tokens(n_sequences: int, seed: int = 0) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    # Each token has 4 likely successors: learnable, but not trivially.
    successors = torch.randint(0, VOCAB_SIZE, (VOCAB_SIZE, 4), generator=g)
    seqs = torch.empty(n_sequences, SEQ_LEN + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, VOCAB_SIZE, (n_sequences,), generator=g)
    for t in range(1, SEQ_LEN + 1):
        choice = torch.randint(0, 4, (n_sequences,), generator=g)
        seqs[:, t] = successors[seqs[:, t - 1], choice]
    return seqs


def build_model(learning_rate: float = 3e-3) -> Any:
    import torch
    from torch import nn

    L = _lightning()

    class TinyLM(L.LightningModule):
        """A decoder-only transformer: embeddings, causal self-attention blocks, a tied output head."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB_SIZE, D_MODEL)
            self.pos = nn.Parameter(torch.zeros(1, SEQ_LEN, D_MODEL))
            layer = nn.TransformerEncoderLayer(
                D_MODEL, N_HEADS, dim_feedforward=4 * D_MODEL, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(D_MODEL)
            self.register_buffer(
                "mask", nn.Transformer.generate_square_subsequent_mask(SEQ_LEN), persistent=False
            )
            # Small embeddings, as GPT-2 does: the output head shares them, and unit-variance rows would
            # start the loss near 100 instead of near ln(vocab) = 5.5.
            nn.init.normal_(self.embed.weight, std=0.02)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
            x = self.blocks(x, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
            return self.norm(x) @ self.embed.weight.T

        def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = self(batch["input_ids"])
            return nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch["labels"].reshape(-1))

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            # Reduced over the ranks by Lightning: the report's convergence section reads it (issue 28).
            self.log("val_loss", self._loss(batch), sync_dist=True)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=learning_rate, weight_decay=0.01)
            warm = 20
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / 2000)))
            )
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return TinyLM()


class _TokenDataset:
    def __init__(self, seqs: Any) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        seq = self.seqs[i]
        return {"input_ids": seq[:-1], "labels": seq[1:]}


def _placement(devices: int | None) -> tuple[str, int, str]:
    import torch

    if torch.cuda.is_available():
        n = devices or min(2, torch.cuda.device_count())
        precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
        return "gpu", n, precision
    n = devices or (2 if (os.cpu_count() or 1) >= 2 else 1)
    return "cpu", n, "32-true"


def run_demo(config: DemoConfig) -> Path | None:
    """Train the demo; returns the run directory on rank 0, None on the other ranks."""
    import torch
    from torch.utils.data import DataLoader

    from tuneup import TuneupCallback

    L = _lightning()
    accelerator, devices, precision = _placement(config.devices)
    launching = "LOCAL_RANK" not in os.environ
    if launching and config.run_dir.exists():
        shutil.rmtree(config.run_dir)  # the demo's run is replaced each time, never mixed with the last
    if accelerator == "cpu":
        # Two processes on two cores: one intra-op thread each, or they fight over the cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // devices))

    L.seed_everything(0, workers=True, verbose=False)
    seqs = _markov_tokens(BATCH_SIZE * devices * config.max_steps + VAL_SEQUENCES)
    loader = DataLoader(
        _TokenDataset(seqs[VAL_SEQUENCES:]), batch_size=BATCH_SIZE, shuffle=True, drop_last=True
    )
    val_loader = DataLoader(_TokenDataset(seqs[:VAL_SEQUENCES]), batch_size=BATCH_SIZE)
    callback = TuneupCallback(dirpath=config.run_dir, target=TARGET, tags={"project": "tuneup-demo"})
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        precision=precision,
        max_steps=config.max_steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=str(config.out_dir),
        log_every_n_steps=VAL_EVERY_STEPS,
        val_check_interval=min(VAL_EVERY_STEPS, config.max_steps),
        num_sanity_val_steps=0,
    )
    trainer.fit(build_model(), loader, val_loader)
    rank = trainer.global_rank
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # A gloo group left alive at interpreter exit can abort the process.
        torch.distributed.destroy_process_group()
    return callback.run_dir if rank == 0 else None
