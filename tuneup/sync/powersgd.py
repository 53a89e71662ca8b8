"""PowerSGD (Vogels et al., NeurIPS 2019): a rank-r approximation of each gradient matrix, all-reduced as
two thin factors, with error feedback; one bucket at a time, on gloo as on NCCL.

torch's `powerSGD_hook` launches its second all-reduce from the first one's completion callback. On gloo
that callback runs on a communication thread while the autograd thread launches the next bucket's first
all-reduce, so the ranks can issue their collectives in different orders: over several buckets it aborted
or hung in 3 of 3 tries here. This compressor issues the bucket's three all-reduces from the hook itself,
in one order on every rank (DDP calls the hook for bucket 0, 1, 2... on every rank), and waits for the
first factor before computing the second. On NCCL `wait()` only orders the streams; on gloo the autograd
thread waits for each factor: the price of a fixed order.

Per bucket, with every rank's gradient already divided by the world size (so sums are averages):
- 1-D tensors, and matrices too small to gain from a factorisation, go in one exact all-reduce;
- for each other gradient, reshaped to an n x m matrix M: P = M Q (Q kept from the last step, a warm
  start), all-reduced (sum = the average's M̄ Q), orthonormalised; Q = Mᵀ P, all-reduced; the bucket gets
  P Qᵀ = P Pᵀ M̄, the average projected on P's columns;
- with error feedback, what the approximation left out of this rank's input is added to its next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneup._log import info_once

# A matrix is factored only when its factors are at least this many times smaller (torch's default).
MIN_COMPRESSION_RATE = 2.0


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a bucket's gradients lie in its flat buffer, and which of them are factored."""

    matrices: tuple[tuple[int, int, int], ...]  # (offset, rows, cols) of each factored gradient
    exact: tuple[tuple[int, int], ...]  # (offset, numel) of each gradient sent as it is
    numel: int

    def factor_numel(self, rank: int) -> int:
        return sum((n + m) * rank for _, n, m in self.matrices)

    @property
    def exact_numel(self) -> int:
        return sum(numel for _, numel in self.exact)


def bucket_layout(shapes: list[tuple[int, ...]], rank: int) -> _Layout:
    matrices, exact, offset = [], [], 0
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= d
        if len(shape) >= 2:
            n, m = shape[0], numel // max(1, shape[0])
            r = min(rank, n, m)
            if n * m > (n + m) * r * MIN_COMPRESSION_RATE:
                matrices.append((offset, n, m))
                offset += numel
                continue
        exact.append((offset, numel))
        offset += numel
    return _Layout(tuple(matrices), tuple(exact), offset)


class PowerSGD:
    """The compressor's state across steps: each bucket's layout, its Q factors (warm start) and, with
    error feedback, its residual. Keyed by bucket index, valid once DDP's buckets are final."""

    def __init__(self, rank: int, error_feedback: bool, seed: int = 0) -> None:
        self.rank = rank
        self.error_feedback = error_feedback
        self.seed = seed
        self._layouts: dict[int, _Layout] = {}
        self._q: dict[int, list[Any]] = {}
        self._residual: dict[int, Any] = {}

    def layout(self, index: int, bucket: Any) -> _Layout:
        layout = self._layouts.get(index)
        if layout is None or layout.numel != bucket.buffer().numel():
            layout = bucket_layout([tuple(p.shape) for p in bucket.parameters()], self.rank)
            if not layout.matrices:
                info_once(
                    f"powersgd-nothing:{index}",
                    f"PowerSGD: no gradient in DDP bucket {index} is a matrix large enough to gain from rank-"
                    f"{self.rank} factors (at least {MIN_COMPRESSION_RATE:g}x fewer numbers); it is all-reduced "
                    "exactly",
                )
            self._layouts[index] = layout
            self._q.pop(index, None)
            self._residual.pop(index, None)
        return layout

    def sent_numel(self, index: int, bucket: Any) -> int:
        layout = self.layout(index, bucket)
        return layout.exact_numel + layout.factor_numel(self.rank)

    def reduce(self, index: int, bucket: Any, flat: Any, all_reduce: Any, exact_of: Any = None) -> Any:
        """Replace `flat` (this rank's gradient over the world size) by the approximated average, in
        place; `all_reduce(tensor)` sums a tensor over the ranks in place and returns when it is done.
        `exact_of(tensor)`, where given, is handed the compressor's input (with error feedback: the
        gradient plus the residual) to average exactly, for the safeguard; what it returns is returned."""
        import torch

        layout = self.layout(index, bucket)
        if self.error_feedback:
            residual = self._residual.get(index)
            if residual is None:
                residual = self._residual[index] = torch.zeros_like(flat)
            flat.add_(residual)
            compensated = flat.clone()
        checked = exact_of(flat) if exact_of is not None else None
        uncompressed = torch.cat([flat[o : o + n] for o, n in layout.exact]) if layout.exact else None
        mats = [flat[o : o + n * m].view(n, m) for o, n, m in layout.matrices]
        qs = self._q.get(index)
        if qs is None:
            # The same Q on every rank: a generator seeded alike, never the global one (whose state is
            # the training's).
            gen = torch.Generator().manual_seed(self.seed + 1_000_003 * index)
            qs = [
                torch.randn(m, min(self.rank, n, m), generator=gen).to(flat.device, flat.dtype)
                for _, n, m in layout.matrices
            ]
            self._q[index] = qs
        if uncompressed is not None:
            all_reduce(uncompressed)
            parts = torch.split(uncompressed, [n for _, n in layout.exact])
            for (o, n), part in zip(layout.exact, parts, strict=True):
                flat[o : o + n].copy_(part)
        if mats:
            ps = [mat @ q for mat, q in zip(mats, qs, strict=True)]
            p_flat = torch.cat([p.reshape(-1) for p in ps])
            all_reduce(p_flat)
            ps = [_orthonormal(p) for p in _split_like(p_flat, ps)]
            new_qs = [mat.t() @ p for mat, p in zip(mats, ps, strict=True)]
            q_flat = torch.cat([q.reshape(-1) for q in new_qs])
            all_reduce(q_flat)
            new_qs = _split_like(q_flat, new_qs)
            for mat, p, q in zip(mats, ps, new_qs, strict=True):
                mat.copy_(p @ q.t())
            self._q[index] = new_qs
        if self.error_feedback:
            # What this rank's compensated input lost; its uncompressed parts lost nothing locally that
            # matters (they were averaged exactly), so only the factored matrices carry a residual.
            residual = compensated.sub_(flat)
            for o, n in layout.exact:
                residual[o : o + n].zero_()
            self._residual[index] = residual
        return checked


def _split_like(flat: Any, like: list[Any]) -> list[Any]:
    import torch

    return [
        part.view_as(t) for part, t in zip(torch.split(flat, [t.numel() for t in like]), like, strict=True)
    ]


def _orthonormal(p: Any) -> Any:
    import torch

    # Reduced QR: P's columns made orthonormal. A column that vanished (an all-zero gradient) gives a
    # zero column of Q; the approximation then just drops that direction.
    q, _ = torch.linalg.qr(p.float(), mode="reduced")
    return q.to(p.dtype)
