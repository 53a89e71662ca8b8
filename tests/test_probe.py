"""`tuneup probe-network`: its options, and a real 2-process gloo probe read back from its record."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup import load_run
from tuneup.analyze.interconnect import collective_table, fit_alpha_beta
from tuneup.probe import (
    KIB,
    MIB,
    add_arguments,
    parse_size,
    probe_points,
    probe_records,
    resolve_config,
    run,
    size_ladder,
)

from conftest import free_port


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def no_gpus() -> int:
    return 0


def test_sizes_parse_with_binary_suffixes() -> None:
    assert parse_size("4096", "--min-bytes") == 4096
    assert parse_size("4K", "--min-bytes") == parse_size("4KiB", "--min-bytes") == 4 * KIB
    assert parse_size("16m", "--max-bytes") == 16 * MIB
    assert parse_size("1G", "--max-bytes") == 1024 * MIB
    for bad in ("", "4X", "-4K", "0", "1.5M"):
        with pytest.raises(ValueError, match="--max-bytes"):
            parse_size(bad, "--max-bytes")


def test_size_ladder_doubles_or_quadruples_and_keeps_whole_elements_per_rank() -> None:
    assert size_ladder(1 * KIB, 16 * KIB, 2, 4) == [1024, 2048, 4096, 8192, 16384]
    assert size_ladder(1 * KIB, 16 * KIB, 4, 4) == [1024, 4096, 16384]
    # 3 ranks of float32: every size a multiple of 12 bytes, so each rank's shard is whole elements.
    assert size_ladder(1 * KIB, 4 * KIB, 2, 12) == [1020, 2040, 4092]


def test_defaults_on_a_cpu_machine() -> None:
    config = resolve_config(parse(), gpu_count=no_gpus)
    assert config.backend == "gloo"
    assert config.nproc in (1, 2)
    assert config.collectives == ("all_reduce", "all_gather", "reduce_scatter")
    assert config.sizes_bytes[0] == 1 * KIB and config.sizes_bytes[-1] == 16 * MIB
    assert len(config.sizes_bytes) == 15  # 1 KiB, 2 KiB, ... 16 MiB
    assert (config.iters, config.warmup, config.timeout_s) == (20, 5, 300.0)
    assert config.out_dir.parent == Path("reports") / "probe" and config.out_dir.name == config.run_id


def test_defaults_on_a_gpu_machine() -> None:
    config = resolve_config(parse(), gpu_count=lambda: 8)
    assert (config.backend, config.nproc, config.sizes_bytes[-1]) == ("nccl", 8, 64 * MIB)
    # gloo on a GPU machine probes the host: CPU defaults.
    config = resolve_config(parse("--backend", "gloo"), gpu_count=lambda: 8)
    assert config.sizes_bytes[-1] == 16 * MIB


def test_worker_command_is_torchrun_of_this_module(tmp_path: Path) -> None:
    from tuneup.probe import _torchrun_command

    config = resolve_config(parse("--nproc", "2", "--out", str(tmp_path / "run")), gpu_count=no_gpus)
    command = _torchrun_command(config)
    assert command[:8] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "tuneup.probe",
    ]
    assert command[8] == "--worker"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("--min-bytes", "8M", "--max-bytes", "1M"), "--min-bytes"),
        (("--min-bytes", "32M", "--backend", "gloo"), "--min-bytes"),  # above the CPU default maximum
        (("--nproc", "0"), "--nproc"),
        (("--collectives", "all_reduce,alltoall"), "--collectives"),
        (("--collectives", ","), "--collectives"),
        (("--factor", "1"), "--factor"),
        (("--iters", "0"), "--iters"),
        (("--warmup", "-1"), "--warmup"),
        (("--timeout-s", "0"), "--timeout-s"),
        (("--backend", "mpi"), "--backend"),
        (("--max-bytes", "lots"), "--max-bytes"),
        (("--min-bytes", "4", "--nproc", "2"), "--min-bytes"),  # a 2-byte shard is no float32
    ],
)
def test_bad_options_raise_value_error_naming_the_option(argv: tuple[str, ...], option: str) -> None:
    with pytest.raises(ValueError, match=option) as info:
        run(parse(*argv))
    assert "\n" not in str(info.value)


def test_nccl_without_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="--backend nccl"):
        resolve_config(parse("--backend", "nccl"), gpu_count=no_gpus)
    with pytest.raises(ValueError, match="--nproc 4"):
        resolve_config(parse("--nproc", "4"), gpu_count=lambda: 2)


def test_out_holding_a_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--out .* already holds a run"):
        run(parse("--out", str(tmp_path), "--nproc", "1", "--backend", "gloo"))


def test_options_do_not_import_torch() -> None:
    # `tuneup --help` builds every subcommand's parser: the probe's must not pull torch in.
    code = (
        "import argparse, sys; from tuneup import probe; p = argparse.ArgumentParser(); "
        "probe.add_arguments(p); p.format_help(); "
        "probe.resolve_config(p.parse_args(['--backend', 'gloo', '--nproc', '2'])); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- a real probe -------------------------------------------------------------------------------------

SIZES = [4 * KIB * 2**i for i in range(11)]  # 4 KiB ... 4 MiB, doubling: the sizes probed
# The sizes the alpha-beta check covers: 4 KiB to 1 MiB. Above that, gloo over loopback on this 2-core
# VM grows faster than linearly with size (the buffers leave the caches): with 4 MiB among the fitted
# sizes the line steepens and over-predicts 2 MiB by +8% to +22% (seven runs), always high, which is
# the model bending, not noise. The small sizes are not the trouble: they held within 10%.
CHECKED = [s for s in SIZES if s <= 1 * MIB]


def held_out_errors(run_dir: Path, kind: str, world_size: int) -> dict[int, float]:
    """Fit alpha-beta on every other checked size, from the smallest, as the probe fits (on each size's
    time in its table); the relative error of its prediction of each size in between against that
    size's time in the table."""
    points = {size: seconds for size, seconds, _ in probe_points(probe_records(load_run(run_dir)), kind)}
    fitted, held_out = CHECKED[::2], CHECKED[1::2]
    fit = fit_alpha_beta([(size, points[size]) for size in fitted], kind, world_size)
    return {size: fit.predict(size) / points[size] - 1 for size in held_out}


def probe_all_reduce(out: Path, iters: int, capfd: pytest.CaptureFixture[str]) -> None:
    """Probe all_reduce over 2 gloo ranks at SIZES through `run`, and check what it printed and recorded."""
    args = parse(
        "--nproc", "2", "--backend", "gloo", "--collectives", "all_reduce", "--min-bytes", "4K",
        "--max-bytes", "4M", "--iters", str(iters), "--warmup", "3", "--out", str(out), "--timeout-s", "120",
    )  # fmt: skip
    assert run(args) == 0
    printed = capfd.readouterr()
    print(printed.out)  # the table, for whoever reads the test log
    assert "# all_reduce" in printed.out and "alpha-beta fit" in printed.out
    assert f"run record: {out}" in printed.out

    loaded = load_run(out)
    assert loaded.warnings == []
    assert loaded.world_size == 2 and loaded.manifest.num_nodes == 1
    probe = loaded.manifest.raw["probe"]
    assert probe["backend"] == "gloo" and probe["sizes_bytes"] == SIZES and probe["iters"] == iters
    assert loaded.manifest.environment.get("versions")
    for rank, record in loaded.ranks.items():
        assert record.info.closed and record.info.timing == "host"
        collectives = record.collectives
        assert len(collectives) == iters * len(SIZES)
        assert [c.step for c in collectives] == list(range(len(collectives)))
        assert {(c.kind, c.source, c.dtype, c.world_size) for c in collectives} == {
            ("all_reduce", "probe", "float32", 2)
        }, rank
        # Every size asked for, iters times, and each record's bytes the size of the tensor reduced.
        per_size = {size: sum(c.bytes == size for c in collectives) for size in SIZES}
        assert per_size == dict.fromkeys(SIZES, iters)
        assert all(c.duration_ms > 0 for c in collectives)
    # Both ranks ran the same collective at the same step (they are paired, or gloo would have hung).
    assert [c.bytes for c in loaded.ranks[0].collectives] == [c.bytes for c in loaded.ranks[1].collectives]


@pytest.mark.slow
def test_probe_over_gloo_records_every_iteration_and_the_fit_predicts_held_out_sizes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # 250 rounds (every size once per round, in shuffled order) take about 15 s on 2 cores. So many
    # because this machine is shared: while other processes hold the cores, a third or more of the
    # iterations stall for a scheduler slice (~3 ms), and a size's median sits where its time
    # distribution jumps to the stalls, so a few more stalled iterations for one size than for its
    # neighbours move its median by 20-40%. Under such load about one probe in ten missed 25% at
    # one size; a second probe is run only then. Each probe is judged whole, with the same 25%,
    # which is the acceptance criterion: where the model does not hold, narrow CHECKED and
    # say why, never widen 25%.
    iters = 250
    attempts: list[dict[int, float]] = []
    for attempt in range(2):
        out = tmp_path / f"probe-{attempt}"
        probe_all_reduce(out, iters, capfd)
        errors = held_out_errors(out, "all_reduce", 2)
        print("held-out relative errors:", {f"{s // KIB} KiB": f"{e:+.1%}" for s, e in errors.items()})
        attempts.append(errors)
        if all(abs(e) <= 0.25 for e in errors.values()):
            break
    else:
        pytest.fail(f"the alpha-beta fit missed a held-out size's median by more than 25% twice: {attempts}")


@pytest.mark.slow
def test_probe_of_every_collective_reads_back_in_nccl_tests_sizes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe"
    args = parse(
        "--nproc", "2", "--backend", "gloo", "--min-bytes", "64K", "--max-bytes", "256K", "--iters", "3",
        "--warmup", "1", "--out", str(out),
    )  # fmt: skip
    assert run(args) == 0
    printed = capfd.readouterr().out
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        assert f"# {kind}" in printed
    loaded = load_run(out)
    assert loaded.warnings == []
    records = probe_records(loaded)
    # Every record holds the nccl-tests size asked for (CollectiveRecord.bytes): all-gather's gathered
    # output and reduce-scatter's input, not the 1/world shard each rank sends or keeps.
    sizes = [64 * KIB, 128 * KIB, 256 * KIB]
    by_kind = {k: sorted({c.bytes for c in records if c.kind == k}) for k in ("all_gather", "reduce_scatter")}
    assert by_kind == {"all_gather": sizes, "reduce_scatter": sizes}
    table = collective_table(records, 2)
    assert {(r.kind, r.size_bytes) for r in table} == {
        (k, s) for k in ("all_reduce", "all_gather", "reduce_scatter") for s in sizes
    }
    assert all(r.count == 2 * 3 for r in table)
    # Steps run on across the collectives, so every iteration of the run has its own.
    steps = [c.step for c in loaded.ranks[0].collectives]
    assert steps == list(range(3 * 3 * len(sizes)))
    assert statistics.median(c.duration_ms for c in records) > 0


@pytest.mark.slow
def test_a_probe_past_its_timeout_is_stopped_and_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Far more rounds than 3 s allow: the launcher must stop torchrun and its workers, not wait.
    args = parse(
        "--nproc", "2", "--backend", "gloo", "--collectives", "all_reduce", "--max-bytes", "4K",
        "--iters", "1000000", "--out", str(tmp_path / "probe"), "--timeout-s", "3",
    )  # fmt: skip
    assert run(args) == 1
    err = capfd.readouterr().err
    assert "tuneup probe-network: error: the probe ran past --timeout-s 3" in err


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("--nnodes", "2", "--rdzv-id", "job"), "--rdzv-endpoint"),
        (("--nnodes", "2", "--rdzv-endpoint", "node0"), "--rdzv-endpoint"),  # no port
        (("--nnodes", "2", "--rdzv-endpoint", "node0:29500"), "--rdzv-id"),
        (("--nnodes", "2", "--rdzv-endpoint", "node0:29500", "--rdzv-id", "a/b"), "--rdzv-id"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-id", "j", "--node-rank", "2"), "--node-rank"),
        (("--rdzv-endpoint", "node0:29500"), "--nnodes above 1"),
        (("--nnodes", "0"), "--nnodes"),
    ],
)
def test_multi_node_options_are_checked(argv: tuple[str, ...], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        resolve_config(parse("--backend", "gloo", *argv), gpu_count=no_gpus)


def test_a_multi_node_probe_is_one_rendezvous_and_one_run_named_by_its_id(tmp_path: Path) -> None:
    from tuneup.probe import _torchrun_command

    argv = ("--backend", "gloo", "--nnodes", "2", "--rdzv-endpoint", "node0:29500", "--rdzv-id", "job7")
    config = resolve_config(parse(*argv, "--out", str(tmp_path / "p")), gpu_count=no_gpus)
    command = _torchrun_command(config)
    assert command[3:13] == [
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500", "--rdzv-id", "job7",
        "--nproc-per-node", "2",
    ]  # fmt: skip
    assert config.run_id == "probe-job7" and "--standalone" not in command
    # The second node may find the first one's record begun: the same run, not another one.
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "manifest.json").write_text('{"run_id": "probe-job7"}')
    assert (
        resolve_config(parse(*argv, "--out", str(tmp_path / "p")), gpu_count=no_gpus).run_id == "probe-job7"
    )
    (tmp_path / "p" / "manifest.json").write_text('{"run_id": "probe-other"}')
    with pytest.raises(ValueError, match="already holds a run"):
        resolve_config(parse(*argv, "--out", str(tmp_path / "p")), gpu_count=no_gpus)
    # Every rank's shard of a gather or scatter must be whole over all the nodes' ranks: 4 x 4 bytes.
    with pytest.raises(ValueError, match="at least 16"):
        resolve_config(parse(*argv, "--min-bytes", "8"), gpu_count=no_gpus)


@pytest.mark.slow
def test_two_launches_with_nnodes_2_record_one_run_with_both_nodes_fitted_apart(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "probe"
    command = [
        sys.executable, "-m", "tuneup", "probe-network", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "two-nodes", "--out", str(out), "--nproc", "2", "--backend", "gloo",
        "--collectives", "all_reduce", "--min-bytes", "64K", "--max-bytes", "256K", "--iters", "3",
    ]  # fmt: skip
    launches = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in (0, 1)
    ]
    outputs = [p.communicate(timeout=240) for p in launches]
    assert [p.returncode for p in launches] == [0, 0], outputs
    run_ = load_run(out)
    assert run_.world_size == 4 and sorted(run_.ranks) == [0, 1, 2, 3] and run_.manifest.num_nodes == 2
    nodes = run_.manifest.raw["nodes"]
    assert sorted(r for n in nodes.values() for r in n["ranks"]) == [0, 1, 2, 3] and len(nodes) == 2
    assert {run_.ranks[r].info.node_rank for r in run_.ranks} == {0, 1}
    for rank in run_.ranks.values():
        scopes = {(c.scope, c.world_size) for c in rank.collectives}
        assert scopes == {(None, 4), ("node", 2)}
        per_scope = {s: sum(c.scope == s for c in rank.collectives) for s in (None, "node")}
        assert per_scope == {None: 3 * 3, "node": 3 * 3}  # 3 sizes x 3 iterations, each
    printed = outputs[0][0] + outputs[1][0]
    assert (
        "# all_reduce across 2 nodes (4 ranks)" in printed
        and "# all_reduce within each node (2 ranks)" in printed
    )
