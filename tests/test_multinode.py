"""Where the record goes when the run directory is not a local path every rank shares: multi-node jobs
simulated on one machine (two torchrun launches with --nnodes=2, each in its own working directory, which
plays that node's own disk), and object-storage URLs, not recorded to yet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run

NODE_JOB = Path(__file__).resolve().parent / "workloads" / "node_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_nodes(tmp_path: Path, namespace: str) -> list[subprocess.CompletedProcess[str]]:
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
            "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", str(NODE_JOB), namespace,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    for d in done:
        assert d.returncode == 0, d.stderr[-4000:]
    return done


@pytest.mark.slow
@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_node_that_cannot_see_the_run_directory_says_so_and_the_report_names_its_host(
    tmp_path: Path, namespace: str
) -> None:
    node0, node1 = _two_nodes(tmp_path, namespace)
    host = socket.gethostname()
    # The second node's rank looked for rank 0's marker in "run" under its own working directory.
    assert "rank 1 on host" in node1.stderr and "cannot see the run directory run" in node1.stderr
    assert "cannot see the run directory" not in node0.stderr
    run = load_run(tmp_path / "node0" / "run")
    assert run.missing_ranks == [1] and sorted(run.ranks) == [0]
    assert run.manifest.raw["hosts_by_rank"] == [host, host]
    (finding,) = [f for f in analyze_run(run).findings if f.id == "missing_ranks"]
    assert f"host {host} ran rank(s) 1" in finding.evidence
    # What the second node recorded stayed on its own disk, with the reason.
    (event,) = [
        e
        for e in (tmp_path / "node1" / "run" / "rank-1" / "events.jsonl").read_text().splitlines()
        if '"run_dir_not_shared"' in e
    ]
    assert f'"rank0_host":"{host}"' in event.replace(" ", "")


def test_an_object_storage_root_dir_records_locally_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Lightning takes fsspec URLs for default_root_dir; tuneup used to make a local directory literally
    # named "memory:/exp/job/tuneup/...".
    import lightning.pytorch as L
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from tuneup import TuneupCallback

    monkeypatch.chdir(tmp_path)
    callback = TuneupCallback()
    trainer = L.Trainer(
        default_root_dir="memory://exp/job", max_steps=3, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="tuneup"):
        trainer.fit(BoringModel(), BoringDataModule())
    assert callback.run_dir is not None
    assert callback.run_dir.parent == tmp_path / "tuneup-runs" / "exp" / "job" / "tuneup"
    assert len(load_run(callback.run_dir).steps(0)) == 3
    assert not (tmp_path / "memory:").exists()
    assert "default_root_dir memory://exp/job is on object storage" in caplog.text
