"""Where the record goes when the run directory is not a local path every rank shares: multi-node jobs
simulated on one machine (two torchrun launches with --nnodes=2, each in its own working directory, which
plays that node's own disk), and object-storage URLs, not recorded to yet."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run

from conftest import free_port, run_workload

NODE_JOB = Path(__file__).resolve().parent / "workloads" / "node_job.py"


def _two_nodes(tmp_path: Path, namespace: str, *dirpath: str) -> list[subprocess.CompletedProcess[str]]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
            "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", str(NODE_JOB), namespace,
            *dirpath,
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
@pytest.mark.parametrize("namespace", ["pytorch_lightning"])  # lightning.pytorch: the S3 two-node test
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


# timing: the chunk per flush is the mirror thread's upload between two flushes of a 10-step fit; beside
# another test's processes (make test's parallel pass) the thread ran once, after the last flush.
@pytest.mark.timing
@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_run_on_object_storage_is_uploaded_in_chunks_and_reads_back_as_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    # Lightning takes fsspec URLs for default_root_dir; tuneup used to make a local directory literally
    # named "memory:/exp/job/tuneup/...". memory:// is fsspec's in-process store: the fit runs here.
    import importlib

    import fsspec

    from tuneup import TuneupCallback
    from tuneup.analyze.model import to_json
    from tuneup.report import analyze

    L = importlib.import_module(namespace)
    boring = importlib.import_module(f"{namespace}.demos.boring_classes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEUP_SPOOL", str(tmp_path / "spool"))
    root = f"memory://exp-{namespace}/job"
    callback = TuneupCallback(flush_every_steps=4)
    trainer = L.Trainer(
        default_root_dir=root, max_steps=10, callbacks=[callback], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(boring.BoringModel(), boring.BoringDataModule())
    url = f"{root}/tuneup/{callback.run_id}"
    assert not (tmp_path / "memory:").exists()
    fs = fsspec.filesystem("memory")
    objects = [o.split(callback.run_id, 1)[1] for o in fs.find(url[len("memory://") :])]
    # The steps went up in whole chunks, one per flush and one at close, never an object rewritten.
    steps = sorted(o for o in objects if "/rank-0/steps.jsonl.chunks/" in o)
    assert len(steps) >= 2 and all(o.endswith(".jsonl") for o in steps)
    assert {"/manifest.json", "/rank-0/info.json", "/.tuneup-run"} <= set(objects)
    remote, local = load_run(url), load_run(callback.run_dir)  # the URL and this node's spool
    assert remote.url == url and remote.location == url
    assert [s.step for s in remote.steps(0)] == list(range(10))
    # The report of the uploaded run is the report of the run as recorded, but for where it says it is.
    from_url, from_spool = analyze(url), analyze(callback.run_dir)
    assert from_url.run.path == url and from_spool.run.path == str(local.path)
    same_moment = replace(from_url, generated_unix=from_spool.generated_unix)
    as_recorded = json.dumps(to_json(same_moment)).replace(url, str(local.path))
    assert as_recorded == json.dumps(to_json(from_spool))


def test_a_failing_store_never_fails_training_and_the_spool_keeps_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    import fsspec
    import lightning.pytorch as L
    from fsspec.implementations.memory import MemoryFileSystem
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from tuneup import TuneupCallback
    from tuneup.record import remote

    calls: list[str] = []

    class DownStore(MemoryFileSystem):
        """A store that refuses every write, as an unreachable or failing one does."""

        protocol = "downstore"

        def pipe_file(self, path: str, value: bytes, **kwargs: object) -> None:
            calls.append(threading.current_thread().name)
            raise ConnectionError("the store is down")

    fsspec.register_implementation("downstore", DownStore, clobber=True)
    monkeypatch.setattr(remote, "RETRY_DELAYS_S", (0.01, 0.02))
    monkeypatch.setenv("TUNEUP_SPOOL", str(tmp_path / "spool"))
    callback = TuneupCallback(dirpath="downstore://bucket/run", flush_every_steps=2)
    trainer = L.Trainer(
        max_steps=12, callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path),
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="tuneup"):
        trainer.fit(BoringModel(), BoringDataModule())
    assert trainer.global_step == 12
    # Every attempt was made off the training thread; after three failed rounds the uploads stopped.
    assert calls and "MainThread" not in calls
    assert callback._mirror is not None and callback._mirror.stopped
    spool = callback.run_dir
    assert spool is not None and spool.is_relative_to(tmp_path / "spool")
    assert f"the whole record stays in {spool}" in caplog.text
    assert [s.step for s in load_run(spool).steps(0)] == list(range(12))


# -- a real S3-compatible server (moto's, on loopback) -------------------------------------------------

TINY = Path(__file__).resolve().parent / "workloads" / "tiny.py"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A bucket on a moto S3 server of this test's own; the training processes inherit its endpoint and
    its dummy credentials through the environment (as they would a real store's)."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    _SERVERS.append(server)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }.items():
        monkeypatch.setenv(key, value)
    import fsspec

    # fsspec keeps one S3 filesystem per set of arguments, with the endpoint it was made with.
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    fs = fsspec.filesystem("s3")
    bucket = f"runs-{port}"  # moto keeps its buckets for the whole process: one of this test's own
    fs.mkdir(bucket)
    try:
        yield f"s3://{bucket}"
    finally:
        _stop_s3_server()


_SERVERS: list[Any] = []


def _stop_s3_server() -> None:
    while _SERVERS:
        _SERVERS.pop().stop()


def _tiny(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    spool = {"TUNEUP_SPOOL": str(tmp_path / "spool")}
    return run_workload(url, *args, check=False, cwd=tmp_path, env=spool)


@pytest.mark.slow
def test_a_2_rank_ddp_run_on_s3_is_one_record_and_reports_as_recorded(tmp_path: Path, s3: str) -> None:
    from tuneup.analyze.model import to_json
    from tuneup.report import analyze

    url = f"{s3}/job"
    proc = _tiny(tmp_path, url, "--devices", "2", "--strategy", "ddp", "--namespace", "pytorch_lightning",
                 "--max-steps", "12", "--flush-every-steps", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run record written to {url}" in proc.stderr
    run = load_run(url)
    assert run.url == url and sorted(run.ranks) == [0, 1] and not run.missing_ranks
    assert all([s.step for s in run.steps(r)] == list(range(12)) for r in (0, 1))
    # The same run as this node's spool holds it: the report is the same but for where it says it is.
    (spool,) = (tmp_path / "spool").iterdir()
    from_url, from_spool = analyze(url), analyze(spool)
    same = json.dumps(to_json(replace(from_url, generated_unix=from_spool.generated_unix))).replace(
        url, str(spool)
    )
    assert same == json.dumps(to_json(from_spool))


@pytest.mark.slow
def test_a_run_on_s3_killed_mid_run_loses_at_most_about_one_flush_interval(tmp_path: Path, s3: str) -> None:
    url = f"{s3}/killed"
    proc = _tiny(tmp_path, url, "--max-steps", "100", "--die-at-step", "23", "--flush-every-steps", "5",
                 "--slow-step-ms", "20")  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]
    run = load_run(url)
    kept = [s.step for s in run.steps(0)]
    # Steps 0..22 ran; uploads follow each 5-step flush (the last one may still be in flight at the kill).
    assert kept == list(range(len(kept))) and 15 <= len(kept) <= 23, kept
    assert any("without closing" in w for w in run.warnings)


@pytest.mark.slow
def test_an_s3_server_stopped_mid_run_never_fails_training_and_the_spool_keeps_it(
    tmp_path: Path, s3: str
) -> None:
    import time

    import fsspec

    url = f"{s3}/outage"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TUNEUP_SPOOL": str(tmp_path / "spool"),
    }
    proc = subprocess.Popen(
        [sys.executable, str(TINY), "--out", url, "--max-steps", "120", "--flush-every-steps", "5",
         "--slow-step-ms", "25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    fs = fsspec.filesystem("s3")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # the first chunks are up: stop the store
        fs.invalidate_cache()
        if any("/steps.jsonl.chunks/" in o for o in fs.find(url[len("s3://") :])):
            break
        time.sleep(0.2)
    _stop_s3_server()
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    (spool,) = (tmp_path / "spool").iterdir()
    assert f"the whole record stays in {spool}" in err
    run = load_run(spool)
    assert [s.step for s in run.steps(0)] == list(range(120)) and run.ranks[0].info.closed


@pytest.mark.slow
def test_the_same_two_node_job_recording_to_s3_gives_one_complete_record(tmp_path: Path, s3: str) -> None:
    url = f"{s3}/two-nodes"
    node0, node1 = _two_nodes(tmp_path, "lightning.pytorch", url)
    assert "cannot see the run directory" not in node0.stderr + node1.stderr
    run = load_run(url)
    assert sorted(run.ranks) == [0, 1] and not run.missing_ranks
    assert all(len(run.steps(r)) == 6 for r in (0, 1))


def test_compare_reads_a_run_and_a_baseline_file_on_object_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec
    import lightning.pytorch as L
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from tuneup import TuneupCallback
    from tuneup.compare.runs import baseline_document, load_side

    monkeypatch.setenv("TUNEUP_SPOOL", str(tmp_path / "spool"))
    callback = TuneupCallback(dirpath="memory://compare-bucket/run")
    L.Trainer(
        max_steps=8, callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path),
    ).fit(BoringModel(), BoringDataModule())  # fmt: skip
    run_side = load_side("memory://compare-bucket/run")
    assert (run_side.kind, run_side.label, len(run_side.runs)) == ("run", "memory://compare-bucket/run", 1)
    document = baseline_document(run_side.runs)
    fsspec.filesystem("memory").pipe_file("/compare-bucket/baseline.json", json.dumps(document).encode())
    baseline = load_side("memory://compare-bucket/baseline.json")
    assert baseline.kind == "baseline file" and baseline.label == "memory://compare-bucket/baseline.json"
    assert [r.run_id for r in baseline.runs] == [run_side.runs[0].run_id]
