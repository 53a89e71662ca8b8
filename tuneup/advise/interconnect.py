"""Interconnect: when the collectives ran far below the link the catalog expects, which NCCL setting the
run's own environment shows to be the cause, and what the step would be at the link's bandwidth.

Evidence, and nothing else (a rule of thumb on a healthy link costs a rerun and buys nothing):

- the link check (tuneup/analyze/communication.py, the `slow_link` finding): the biggest collective's bus
  bandwidth under a quarter of the catalog link's typical low end (a tenth of its nominal);
- the NCCL variables the run recorded (the manifest keeps NCCL_*): NCCL_P2P_DISABLE or NCCL_SHM_DISABLE
  on one node (no NVLink/PCIe peer-to-peer, or no shared memory: traffic staged through the host),
  NCCL_IB_DISABLE or NCCL_NET=Socket between nodes (plain TCP where InfiniBand or EFA was there);
- on plain TCP between nodes (NCCL_NET=Socket, NCCL_IB_DISABLE=1 or an Ethernet link) without
  NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD: more socket threads (NCCL's docs: 4 × 4 for 100G networks,
  the product at most 64). These help on plain TCP only. NCCL_ALGO and NCCL_PROTO are never proposed: NCCL
  calls them debugging variables, unsafe for production.

The gain: the step-time model with the catalog link as the collectives' fit: β = 1 / bus bandwidth
(s/byte; the ring model's bandwidth term is the bus factor times n·β, so 1/β is the bus bandwidth), α the
run's own fitted latency. The figure is at the typical low end of the link (its nominal where the
catalog has no typical); the interval reaches its typical high end. Where the cause is not in the record,
the advice is a diagnostic (NCCL_DEBUG=INFO names the transport) with the same predicted gain and low
confidence.
"""

from __future__ import annotations

from tuneup.advise import code
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Predicted, Range, Recommendation
from tuneup.analyze.model import CollectiveFit, LinkCheck

GB = 1e9
WHERE = "in every rank's environment, before the training starts (the job script or the launcher's env)"
SOCKET_THREADS = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
_TRUE = {"1", "true", "yes", "on"}


def _link_fit(ctx: AdviceContext, gbytes_per_s: float) -> CollectiveFit:
    own = next((f for f in ctx.observation.fits if f.kind == "all_reduce"), None)
    alpha = own.alpha_us if own is not None and own.alpha_us is not None else 0.0
    return CollectiveFit(
        kind="all_reduce",
        alpha_us=alpha,
        beta_ns_per_byte=1.0 / gbytes_per_s,  # 1/(G·1e9) s per byte = 1/G ns per byte
        busbw_gbytes_per_s=gbytes_per_s,
        r_squared=None,
        points=0,
        sizes=0,
        notes=["the catalog link's bandwidth, the run's own latency"],
    )


def _catalog_high(link: LinkCheck) -> float | None:
    """The link's typical high end (GB/s) from the packaged catalog, where it has one."""
    try:
        from tuneup.catalog.interconnects import load_interconnects

        row = next((r for r in load_interconnects() if r.name == link.name), None)
    except Exception:  # the catalog is a refinement of the interval, never a reason to fail
        return None
    high = row.typical_busbw_high_bytes_per_s if row is not None else None
    return high / GB if high else None


def _at_link(ctx: AdviceContext, link: LinkCheck) -> Predicted | None:
    ref = link.reference_gbytes_per_s
    if not ref:
        return None
    if ctx.model.base_sync_ms is None:
        return _scaled_exposed(ctx, link)
    setting = ctx.setting
    mid = ctx.predict(setting, fits=[_link_fit(ctx, ref)])
    high_bw = _catalog_high(link)
    if high_bw and high_bw > ref:
        fast = ctx.predict(setting, fits=[_link_fit(ctx, high_bw)])
        return Predicted(
            step_ms=Range(mid.step_ms.value, fast.step_ms.low, mid.step_ms.high),
            mean_step_ms=(
                Range(mid.mean_step_ms.value, fast.mean_step_ms.low, mid.mean_step_ms.high)
                if mid.mean_step_ms is not None and fast.mean_step_ms is not None
                else None
            ),
            samples_per_s=Range(mid.samples_per_s.value, mid.samples_per_s.low, fast.samples_per_s.high),
            usd_per_million_samples=mid.usd_per_million_samples,
            usd_per_million_tokens=mid.usd_per_million_tokens,
            goodput_samples_per_s=mid.goodput_samples_per_s,
            statistical_efficiency=mid.statistical_efficiency,
            breakdown_ms=mid.breakdown_ms,
        )
    return mid


def _scaled_exposed(ctx: AdviceContext, link: LinkCheck) -> Predicted | None:
    """Without a latency-bandwidth fit (one bucket size), the exposed wait shrinks with the bandwidth:
    exposed × measured/reference is left. Where a rank is slow, part of the wait is for it, not the link:
    the interval's low end leaves that part out."""
    from tuneup.advise.ranks import without_ms

    o = ctx.observation
    if not o.exposed_ms or not link.ratio or link.ratio >= 1:
        return None
    # What the mean step waited for collectives: under local SGD, the exact warm-up's wait on its share of
    # the steps and the parameter averages over the rest (0 without local SGD); the low end leaves the
    # averages out (copies into and out of their buffer are part of them, and no link shortens those).
    gradient_wait_ms = o.exposed_in_backward_ms
    saved = (gradient_wait_ms + o.averaging_per_step_ms) * (1 - link.ratio)
    excess = ctx.analysis.ranks.straggler.excess_ms if ctx.analysis.ranks.straggler is not None else None
    least = max(0.0, gradient_wait_ms - (excess or 0.0)) * (1 - link.ratio)
    return without_ms(ctx.current, o.step_mean_ms, (saved, least, saved))


def _env(ctx: AdviceContext) -> dict[str, str]:
    return {str(k): str(v) for k, v in (ctx.analysis.environment.env or {}).items()}


def _culprits(env: dict[str, str], num_nodes: int) -> dict[str, str]:
    """The recorded NCCL variables that keep NCCL off the fast transport, by name and value."""
    names = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") if num_nodes <= 1 else ("NCCL_IB_DISABLE",)
    found = {n: env[n] for n in names if env.get(n, "").strip().lower() in _TRUE}
    if num_nodes > 1 and env.get("NCCL_NET", "").strip().lower() == "socket":
        found["NCCL_NET"] = env["NCCL_NET"]
    return found


def _plain_tcp(env: dict[str, str], link: LinkCheck | None) -> str | None:
    if env.get("NCCL_NET", "").strip().lower() == "socket":
        return f"NCCL_NET={env['NCCL_NET']}"
    if env.get("NCCL_IB_DISABLE", "").strip().lower() in _TRUE:
        return f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']}"
    if link is not None and ("GbE" in link.name or "socket" in link.name.lower()):
        return f"the link is {link.name}"
    return None


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    comm = ctx.analysis.communication
    if o.world_size <= 1 or comm is None:
        ctx.skip("NCCL transport", "one rank or no collectives timed: nothing crosses a link")
        return []
    if (o.backend or comm.backend or "").lower() != "nccl":
        ctx.skip("NCCL transport", f"backend {o.backend or comm.backend}: the NCCL variables do not apply")
        return []
    env = _env(ctx)
    link = comm.link
    if o.sharding is not None:
        # The step-time model holds a sharded run's gathers and scatters at their measured time: no link
        # change is predicted for them.
        ctx.skip(
            "NCCL transport",
            f"{link.summary if link is not None and link.summary else 'no link figure'}; a faster link is not "
            f"predicted for {o.sharding}'s all-gathers and reduce-scatters yet",
        )
        return []
    out: list[Recommendation] = []
    if link is not None and link.far_below:
        out.extend(_slow_link(ctx, link, env))
    elif link is not None and link.measured_busbw_gbytes_per_s is not None:
        ctx.skip("NCCL transport", f"the collectives are not far below the link: {link.summary or link.name}")
    else:
        ctx.skip(
            "NCCL transport",
            "no link to compare the measured bandwidth with"
            + (f" ({link.reason})" if link is not None else "")
            + ": nothing shows the link to be slow",
        )
    out.extend(_socket_threads(ctx, link, env))
    return out


def _slow_link(ctx: AdviceContext, link: LinkCheck, env: dict[str, str]) -> list[Recommendation]:
    o = ctx.observation
    proposed = _at_link(ctx, link)
    if proposed is None:
        ctx.skip("NCCL transport", f"{link.name} has no bandwidth figure in the catalog to predict with")
        return []
    culprits = _culprits(env, o.num_nodes)
    evidence = [
        link.summary or f"measured {link.measured_busbw_gbytes_per_s} GB/s bus bandwidth on {link.name}",
        f"collectives {o.comm_ms or 0:.1f} ms per step, {o.exposed_ms or 0:.1f} ms of it exposed, in a "
        f"{o.step_mean_ms:.1f} ms mean step",
        f"predicted at {link.name}'s {link.reference} {link.reference_gbytes_per_s:.1f} GB/s: "
        + (
            "β = 1/bus bandwidth with the run's own latency, in the step-time model"
            if ctx.model.base_sync_ms is not None
            else "no latency-bandwidth fit (one bucket size), so the exposed wait is scaled by measured/reference"
        ),
    ]
    if culprits:
        shown = ", ".join(f"{k}={v}" for k, v in culprits.items())
        evidence.append(f"the run's environment sets {shown}")
        rec = ctx.recommendation(
            "interconnect.nccl_transport",
            f"Let NCCL use {link.name}: unset {', '.join(culprits)}",
            [Change(k, v, "unset") for k, v in culprits.items()],
            proposed,
            evidence,
            (code.shell_env(dict.fromkeys(culprits), WHERE), None),
            caveats=[
                "these variables are often set to work around a broken peer-to-peer path or fabric; if unsetting "
                "them hangs or fails, fix the path (nvidia-smi topo -m, the container's IPC and device access)"
            ],
            confidence="medium",
        )
    else:
        rec = ctx.recommendation(
            "interconnect.check_transport",
            f"Find out why the collectives run far below {link.name}",
            [Change("NCCL transport", "unknown (slow)", f"{link.name}")],
            proposed,
            evidence,
            (
                code.shell_env({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, WHERE)
                + "\n# then rerun a few steps and read which transport each channel uses (P2P, SHM, NET/IB, "
                "NET/Socket)",
                None,
            ),
            caveats=[
                "a diagnostic, not a fix: the record does not say which transport NCCL chose; the gain is "
                "what the step would be at the link's bandwidth"
            ],
            confidence="low",
        )
    return [rec] if rec is not None else []


def _socket_threads(ctx: AdviceContext, link: LinkCheck | None, env: dict[str, str]) -> list[Recommendation]:
    o = ctx.observation
    if o.num_nodes <= 1:
        ctx.skip("NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD", "one node: no socket transport between nodes")
        return []
    tcp = _plain_tcp(env, link)
    if tcp is None:
        ctx.skip(
            "NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD",
            "nothing in the record shows NCCL on plain TCP; socket threads help on TCP clusters only",
        )
        return []
    already = {k: env[k] for k in SOCKET_THREADS if k in env}
    if already:
        ctx.skip(
            "NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD",
            f"already set ({', '.join(f'{k}={v}' for k, v in already.items())})",
        )
        return []
    target = None
    if ctx.link_fits:
        fit = next((f for f in ctx.link_fits if f.kind == "all_reduce"), None)
        if fit is not None and fit.beta_ns_per_byte:
            target = ctx.predict(ctx.setting, fits=[fit])
    elif link is not None and link.reference_gbytes_per_s:
        target = ctx.predict(ctx.setting, fits=[_link_fit(ctx, link.reference_gbytes_per_s)])
    if target is None:
        ctx.skip(
            "NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD",
            f"NCCL runs on plain TCP ({tcp}) but no bandwidth to predict against: measure the network with "
            "`tuneup probe-network` and pass it to the advice",
        )
        return []
    rec = ctx.recommendation(
        "interconnect.socket_threads",
        "Give NCCL's socket transport more threads and sockets",
        [Change(k, "unset (NCCL's default)", v) for k, v in SOCKET_THREADS.items()],
        target,
        [
            f"NCCL runs on plain TCP between {o.num_nodes} nodes ({tcp})",
            f"collectives {o.comm_ms or 0:.1f} ms per step, {o.exposed_ms or 0:.1f} ms exposed, of a "
            f"{o.step_mean_ms:.1f} ms mean step",
        ],
        (code.shell_env(SOCKET_THREADS, WHERE), None),
        caveats=[
            "NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD must stay at most 64; the gain assumes the threads "
            "bring the network to the bandwidth predicted with, which more CPU per rank may not",
        ],
        confidence="low",
    )
    return [rec] if rec is not None else []
