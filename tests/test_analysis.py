"""The analysis behind a report, on synthetic runs whose right answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.ranks import RankProfile, find_straggler
from tuneup.analyze.steady import warmup_steps
from tuneup.record import RankWriter, load_run, write_manifest

from synthetic import step_record


def write_run(
    path: Path, per_rank: dict[int, list[dict]], telemetry: dict[int, list[dict]] | None = None
) -> Path:
    write_manifest(
        path,
        {
            "run_id": "synthetic",
            "created_unix": 1000.0,
            "world_size": len(per_rank),
            "num_nodes": 1,
            "dataloader": {"batch_size": 8, "num_workers": 0},
        },
    )
    for rank, records in per_rank.items():
        w = RankWriter(path, rank)
        w.open({"host": "h", "start_unix": 1000.0})
        for rec in records:
            w.add_step(rec)
        for sample in (telemetry or {}).get(rank, []):
            w.add_telemetry(sample)
        w.close(status="completed")
    return path


def phased(
    step: int,
    data: float = 1.0,
    forward: float = 3.0,
    backward: float = 4.0,
    optimizer: float = 1.0,
    other: float = 1.0,
) -> dict:
    rec = step_record(step)
    wall = data + forward + backward + optimizer + other
    rec.update(
        data_ms=data,
        forward_ms=forward,
        backward_ms=backward,
        optimizer_ms=optimizer,
        other_ms=other,
        wall_ms=wall,
        t_end=1000.0 + step * wall / 1000.0,
    )
    return rec


def test_warmup_rule() -> None:
    assert warmup_steps([100, 90, 80, 11, 10, 10, 10, 10, 10, 10]) == 3
    assert warmup_steps([10.0] * 20) == 1  # the first step always carries setup
    assert (
        warmup_steps([50, 10, 10, 40, 10, 10, 10, 10, 10, 10]) == 1
    )  # a lone slow step is a stall, not warm-up
    assert warmup_steps([90, 10, 80, 85, 95, 10, 10, 10, 10, 10, 10, 10]) == 5  # one fast step inside warm-up
    assert warmup_steps([10, 10, 10, 10, 10, 10, 100, 10, 10, 10]) == 1  # second half: not warm-up
    assert warmup_steps([5.0]) == 0 and warmup_steps([]) == 0


def test_warmup_steps_are_left_out_of_throughput(tmp_path: Path) -> None:
    records = [phased(s, forward=93.0 if s < 5 else 3.0) for s in range(50)]  # 5 slow steps, then 10 ms
    report = analyze_run(load_run(write_run(tmp_path / "run", {0: records})))
    assert report.warmup.steps == 5 and report.warmup.first_steady_step == 5
    assert report.throughput.samples_per_s == pytest.approx(8 / 0.010)  # 8 samples per 10 ms step
    assert report.step_time.median_ms == pytest.approx(10.0)
    assert report.step_time.phases["forward"].share == pytest.approx(0.3)


def test_straggler_is_found_with_rank_and_phase(tmp_path: Path) -> None:
    # Rank 2 loads data 20 ms slower; the other ranks wait 20 ms longer in backward for its gradients.
    per_rank = {
        r: [phased(s, data=21.0 if r == 2 else 1.0, backward=4.0 if r == 2 else 24.0) for s in range(40)]
        for r in range(4)
    }
    report = analyze_run(load_run(write_run(tmp_path / "run", per_rank)))
    straggler = report.ranks.straggler
    assert straggler is not None and straggler.rank == 2 and straggler.phase == "data"
    assert straggler.excess_ms == pytest.approx(20.0)
    assert straggler.others_wait_ms == pytest.approx(20.0)
    assert any(f.id == "straggler" and "Rank 2" in f.title for f in report.findings)
    # The spread of the ranks, for readers of many: rank 2 is the slowest only by a hair, as ranks wait.
    assert report.ranks.median_step_ms is not None and len(report.ranks.per_host) == 1
    assert report.ranks.per_host[0].ranks == 4


def test_equal_ranks_have_no_straggler() -> None:
    phases = {"data_ms": 1.0, "forward_ms": 3.0, "backward_ms": 4.0, "optimizer_ms": 1.0, "other_ms": 1.0}
    profiles = [
        RankProfile(r, 10, 10.0 + 0.2 * r, 11.0, {**phases, "forward_ms": 3.0 + 0.2 * r}) for r in range(8)
    ]
    assert find_straggler(profiles) is None  # 1.4 ms of jitter on a 10 ms step is below the 10% bar
    assert find_straggler(profiles[:1]) is None


def test_data_stalls_and_data_wait_finding(tmp_path: Path) -> None:
    records = [phased(s, data=40.0 if s % 10 == 7 else 2.0) for s in range(60)]
    report = analyze_run(load_run(write_run(tmp_path / "run", {0: records})))
    dl = report.data_loader
    assert dl.stall_count == 6 and dl.worst_stalls[0].data_ms == 40.0
    assert {f.id for f in report.findings} >= {"data_stalls", "data_wait"}


def test_gpu_and_host_telemetry_figures(tmp_path: Path) -> None:
    samples = [
        {
            "t": 1000.0 + i,
            "process": {"cpu_percent": 100.0, "rss_bytes": 2**30 + i},
            "system": {
                "cpu_percent": 50.0,
                "mem_used_bytes": 4 * 2**30,
                "mem_total_bytes": 8 * 2**30,
                "disk_read_bytes": 1000 * i,
                "disk_write_bytes": 0,
                "net": {
                    "eth0": {"sent_bytes": 10_000 * i, "recv_bytes": 0},
                    "lo": {"sent_bytes": 5, "recv_bytes": 5},
                },
            },
            "gpus": [
                {
                    "index": 0,
                    "bus_id": "00000000:19:00.0",
                    "util_percent": 30.0,
                    "power_w": 200.0 + i,
                    "energy_j": 5000.0 + 200.0 * i,
                    "mem_used_bytes": 79 * 2**30,
                    "mem_total_bytes": 80 * 2**30,
                    "throttle": ["gpu_idle", "hw_slowdown"],
                }
            ],
        }
        for i in range(11)
    ]
    report = analyze_run(
        load_run(write_run(tmp_path / "run", {0: [phased(s) for s in range(20)]}, {0: samples}))
    )
    gpu = report.telemetry.gpus[0]
    assert gpu.util_percent_mean == 30.0 and gpu.energy_j == pytest.approx(2000.0)
    assert gpu.throttle_reasons == ["hw_slowdown"]  # idle is not a throttle worth reporting
    host = report.telemetry.hosts[0]
    assert host.disk_read_bytes_per_s == pytest.approx(1000.0)
    assert host.net_bytes_per_s["eth0"].sent_bytes_per_s == pytest.approx(10_000.0)
    assert report.telemetry.processes[0].cpu_percent_mean == 100.0
    ids = {f.id for f in report.findings}
    assert {"low_gpu_util", "gpu_memory_full", "gpu_throttled"} <= ids


def test_collectives_far_below_the_gpus_link_are_flagged(tmp_path: Path) -> None:
    # Two H200s on NVLink 4 whose 256 MiB all-reduces take 1 s each: ~0.27 GB/s of bus bandwidth where
    # NVLink carries hundreds, as when NCCL has fallen back to sockets.
    path = tmp_path / "run"
    gpu = {
        "name": "NVIDIA H200",
        "nvml_nvlink_version": 6,
        "nvlink_links_active": 18,
        "pcie_max_gen": 5,
        "pcie_max_width": 16,
    }
    write_manifest(
        path,
        {
            "run_id": "slow-link",
            "created_unix": 1000.0,
            "world_size": 2,
            "num_nodes": 1,
            "gpus": {"gpus": [gpu, gpu]},
            "communication": {"backend": "nccl", "ranks_per_node": 2},
        },
    )
    size = 256 * 2**20
    for rank in range(2):
        w = RankWriter(path, rank)
        w.open({"host": "h", "start_unix": 1000.0})
        for step in range(10):
            rec = phased(step, backward=1000.0)
            rec.update(comm_ms=1000.0, comm_exposed_ms=900.0, comm_bytes=size, comm_count=1)
            rec["_collectives"] = [
                {
                    "kind": "all_reduce",
                    "bytes": size,
                    "dtype": "bfloat16",
                    "bucket": 0,
                    "duration_ms": 1000.0,
                    "source": "ddp_hook",
                    "world_size": 2,
                }
            ]
            w.add_step(rec)
        w.close()
    report = analyze_run(load_run(path))
    assert report.communication is not None
    link = report.communication.link
    assert link is not None and link.name.startswith("NVLink4") and link.far_below is True
    assert link.measured_busbw_gbytes_per_s == pytest.approx(2 * 0.5 * size / 1e9, rel=0.01)
    assert {"slow_link", "exposed_communication"} <= {f.id for f in report.findings}
    assert report.communication.late_rank is None  # everyone is slow alike: the link, not a rank
