"""The environment capture for the run manifest: what it records, what it must never record, and that it
degrades field by field instead of raising."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import random
import shutil
import socket
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuneup._log import reset_said
from tuneup.collect import environment
from tuneup.collect.environment import (
    REDACTED,
    capture_environment,
    captured_environment,
    git_state,
    host_fingerprint,
    looks_secret,
    redact_value,
    seed_state,
    software_versions,
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(autouse=True)
def _fresh_warnings(caplog: pytest.LogCaptureFixture) -> None:
    # warn_once remembers keys for the life of the process; each test must see its own warnings.
    reset_said()
    caplog.set_level(logging.WARNING, logger="tuneup")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tuneup" and r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------------------------------
# Versions and host


def test_versions_name_python_torch_and_the_installed_packages() -> None:
    versions = software_versions()

    assert set(versions) == {
        "tuneup",
        "python",
        "torch",
        "lightning",
        "pytorch_lightning",
        "cuda",
        "cudnn",
        "nccl",
        "nvidia_ml_py",
        "psutil",
        "platform",
    }
    assert versions["torch"] == torch.__version__
    assert versions["python"] == platform.python_version()
    assert versions["cuda"] == torch.version.cuda
    assert versions["pytorch_lightning"] == importlib.metadata.version("pytorch-lightning")
    assert versions["psutil"] == importlib.metadata.version("psutil")
    assert versions["platform"].startswith(platform.system())
    assert all(v is None or type(v) is str for v in versions.values())


def test_versions_record_a_missing_package_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    real_version = importlib.metadata.version

    def version_without_lightning(name: str) -> str:
        if name == "lightning":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version_without_lightning)

    versions = software_versions()

    assert versions["lightning"] is None
    assert versions["torch"] == torch.__version__


def test_nccl_version_is_read_without_asking_whether_cuda_is_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.cuda.is_available() initializes the driver, which breaks CUDA in workers forked later.
    def cuda_must_not_be_initialized() -> bool:
        raise AssertionError("torch.cuda.is_available() was called")

    monkeypatch.setattr(torch.cuda, "is_available", cuda_must_not_be_initialized)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch._C, "_nccl_version", lambda: 0, raising=False)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))

    assert software_versions()["nccl"] == "2.21.5"


def test_nccl_version_is_none_on_a_build_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))

    assert software_versions()["nccl"] is None


def test_versions_do_not_import_lightning() -> None:
    try:
        installed = importlib.metadata.version("lightning")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("lightning is not installed here")
    # torch is stubbed out: it takes seconds to import and is not what this test is about.
    code = (
        "import json, sys, types\n"
        "sys.modules['torch'] = types.ModuleType('torch')\n"
        "from tuneup.collect.environment import software_versions\n"
        "v = software_versions()\n"
        "print(json.dumps([v['lightning'], v['pytorch_lightning'], sorted(\n"
        "    m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning'))]))\n"
    )
    repo_root = str(Path(environment.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo_root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lightning_version, pl_version, imported = json.loads(result.stdout)

    assert lightning_version == installed
    assert pl_version == importlib.metadata.version("pytorch-lightning")
    assert imported == []


def test_host_fingerprint_describes_this_machine() -> None:
    host = host_fingerprint()

    assert host["hostname"] == socket.gethostname()
    assert isinstance(host["cpu_count_logical"], int) and host["cpu_count_logical"] >= 1
    physical = host["cpu_count_physical"]
    assert physical is None or 1 <= physical <= host["cpu_count_logical"]
    assert isinstance(host["ram_total_bytes"], int) and host["ram_total_bytes"] > 2**20
    assert isinstance(host["os"], str) and host["os"]


def test_host_field_that_fails_is_none_and_the_rest_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import psutil

    def broken_virtual_memory() -> None:
        raise OSError("no /proc/meminfo")

    monkeypatch.setattr(psutil, "virtual_memory", broken_virtual_memory)

    host = host_fingerprint()

    assert host["ram_total_bytes"] is None
    assert host["cpu_count_logical"] is not None
    assert host["hostname"] is not None
    assert any("total RAM" in m and "no /proc/meminfo" in m for m in _warnings(caplog))


# --------------------------------------------------------------------------------------------------
# Redaction


def _random_token(alphabet: str, length: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(length))


SECRET_VALUES = [
    pytest.param("sk-abc123DEF456ghi789JKL012mno345PQR678", id="openai"),
    pytest.param("sk-proj-Ab3dE_fG7hIjK-LmN0pQrStUv", id="openai-project"),
    pytest.param("sk-ant-api03-aB1cD2eF3gH4iJ5kL6mN7", id="anthropic"),
    pytest.param("ghp_" + _random_token(string.ascii_letters + string.digits, 36, 1), id="github"),
    pytest.param("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", id="github-pat"),
    pytest.param("xoxb-123456789012-1234567890123-AbCdEfGh", id="slack"),
    pytest.param("AKIAIOSFODNN7EXAMPLE", id="aws-key-id"),
    pytest.param("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", id="aws-secret"),
    pytest.param("hf_" + _random_token(string.ascii_letters, 34, 2), id="huggingface"),
    pytest.param("glpat-xY3zA9bC1dE5fG7hI2jK", id="gitlab"),
    pytest.param("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", id="jwt"),
    pytest.param(_random_token("0123456789abcdef", 64, 3), id="hex-64"),
    pytest.param(_random_token(string.ascii_lowercase + string.digits, 40, 4), id="lower-alnum-40"),
    pytest.param(_random_token(string.ascii_letters + string.digits + "+/", 44, 5), id="base64-44"),
    pytest.param("https://alice:hunter2@proxy.example.com:8080", id="url-password"),
    pytest.param("-----BEGIN OPENSSH PRIVATE KEY-----", id="private-key"),
    pytest.param("--user bob --password=hunter2x", id="password-assignment"),
    pytest.param("Authorization failed for sk-abc123DEF456ghi789JKL012mno345PQR678", id="embedded-in-text"),
]

ORDINARY_VALUES = [
    "0,1,2,3",
    "INFO",
    "WARN",
    "INIT,COLL",
    "eth0",
    "^docker0,lo",
    "nccl",
    "gloo",
    "mlx5_0:1,mlx5_1:1",
    "node-001.cluster.example.com",
    "10.0.0.12",
    "fe80::1ff:fe23:4567:890a",
    "29500",
    "/home/alice/data/run_2024_05_01/checkpoints/epoch=3-step=1000.ckpt",
    "/usr/local/cuda-12.4/lib64:/usr/lib/x86_64-linux-gnu:/opt/conda/lib/python3.11/site-packages",
    "checkpoints_epoch_10_step_2000_val_loss_0.1234",
    "expandable_segments:True,max_split_size_mb:128",
    "8.0;8.6;9.0+PTX",
    "compute,utility",
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=535,driver<536",
    "GPU-5a6d4f1e-3b2c-4d5e-8f90-123456789abc,GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",
    "MIG-GPU-5a6d4f1e-3b2c-4d5e-8f90-123456789abc/1/0",
    "torchelastic_7b9c2c1e_2a4f_4c8f_9f3e_8a1b2c3d4e5f",
    "sk-node01",
    "hf_home",
    "max_tokens=4096",
    "",
]


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_secret_looking_values_are_redacted_under_any_name(value: str) -> None:
    assert looks_secret(value)
    assert redact_value("NCCL_DEBUG_FILE", value) == REDACTED


@pytest.mark.parametrize("value", ORDINARY_VALUES)
def test_ordinary_values_pass_unchanged(value: str) -> None:
    assert not looks_secret(value)
    assert redact_value("NCCL_SOCKET_IFNAME", value) == value


@pytest.mark.parametrize(
    "name",
    [
        "TUNEUP_API_KEY",
        "HF_TOKEN",
        "PL_PASSWORD",
        "TUNEUP_PASSWD",
        "TORCH_hub_token",
        "NVIDIA_SECRET",
        "CUDA_CREDENTIALS_FILE",
        "NCCL_AUTH_MODE",
        "TUNEUP_ssh_key_path",
    ],
)
def test_values_under_credential_names_are_redacted(name: str) -> None:
    assert redact_value(name, "plain") == REDACTED


@pytest.mark.parametrize("name", ["NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR"])
def test_values_under_ordinary_names_pass(name: str) -> None:
    assert redact_value(name, "mlx5_0:1") == "mlx5_0:1"


def test_captured_environment_keeps_the_allow_list_and_redacts_it() -> None:
    gpu_uuid = "GPU-5a6d4f1e-3b2c-4d5e-8f90-123456789abc"
    environ = {
        # Captured as they are.
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid,
        "OMP_NUM_THREADS": "8",
        "MASTER_ADDR": "10.0.0.12",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "3",
        "TORCHELASTIC_RUN_ID": "none",
        "PL_GLOBAL_SEED": "42",
        "SLURM_JOB_ID": "123456",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "3",
        # Captured, redacted: by name, then by value.
        "TUNEUP_API_KEY": "abc",
        "PL_SECRET_THING": "x",
        "TORCH_SOMETHING": "sk-abc123DEF456ghi789JKL012mno345PQR678",
        # Outside the allow-list: never recorded, whatever they hold.
        "HF_TOKEN": "hf_" + "a" * 34,
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "HOME": "/home/alice",
        "PATH": "/usr/bin",
        "USER": "alice",
        "SLURM_JOB_USER": "alice",
        "SLURM_SUBMIT_DIR": "/home/alice/secret-project",
        "SLURM_JOB_NAME": "secret-project",
        "nccl_debug": "INFO",
        "MY_NCCL_DEBUG": "INFO",
    }

    assert captured_environment(environ) == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "LOCAL_RANK": "3",
        "MASTER_ADDR": "10.0.0.12",
        "MASTER_PORT": "29500",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid,
        "OMP_NUM_THREADS": "8",
        "PL_GLOBAL_SEED": "42",
        "PL_SECRET_THING": REDACTED,
        "SLURM_JOB_ID": "123456",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "3",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCH_SOMETHING": REDACTED,
        "TUNEUP_API_KEY": REDACTED,
        "WORLD_SIZE": "16",
    }


def test_captured_environment_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0:1")
    monkeypatch.setenv("TUNEUP_API_KEY", "abc")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "b" * 34)
    monkeypatch.setenv("TUNEUP_TEST_UNRELATED_BUT_ALLOWED", "yes")

    env = captured_environment()

    assert env["NCCL_IB_HCA"] == "mlx5_0:1"
    assert env["TUNEUP_API_KEY"] == REDACTED
    assert env["TUNEUP_TEST_UNRELATED_BUT_ALLOWED"] == "yes"
    assert "HF_TOKEN" not in env
    assert all(environment._is_captured_name(name) for name in env)


# --------------------------------------------------------------------------------------------------
# Git


def _run_git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    result = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


@pytest.fixture
def git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Keep git from finding a checkout above tmp_path, should the temp dir live inside one.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    _run_git(repo, "init", "-q", "-b", "trunk")
    (repo / "train.py").write_text("print('hi')\n")
    _run_git(repo, "add", "train.py")
    _run_git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "first")
    return repo


@needs_git
def test_git_state_names_the_commit_branch_and_cleanliness(git_repo: Path) -> None:
    state = git_state(str(git_repo))

    assert state is not None
    assert state["commit"] == _run_git(git_repo, "rev-parse", "HEAD")
    assert len(state["commit"]) == 40
    assert state["branch"] == "trunk"
    assert state["dirty"] is False
    assert state["remote"] is None


@needs_git
def test_git_state_is_dirty_after_a_tracked_file_changes_but_not_for_untracked_files(git_repo: Path) -> None:
    (git_repo / "notes.txt").write_text("untracked\n")
    assert git_state(str(git_repo))["dirty"] is False

    (git_repo / "train.py").write_text("print('changed')\n")
    assert git_state(str(git_repo))["dirty"] is True


@needs_git
def test_git_state_works_from_a_subdirectory_and_when_detached(git_repo: Path) -> None:
    sub = git_repo / "src"
    sub.mkdir()
    head = _run_git(git_repo, "rev-parse", "HEAD")
    _run_git(git_repo, "checkout", "-q", "--detach")

    state = git_state(str(sub))

    assert state is not None
    assert state["commit"] == head
    assert state["branch"] is None


@needs_git
@pytest.mark.parametrize(
    ("url", "recorded"),
    [
        ("https://user:ghp_token123@github.com/org/repo.git", "https://github.com/org/repo.git"),
        (
            "https://oauth2:glpat-abc@gitlab.example.com:8443/x/y.git",
            "https://gitlab.example.com:8443/x/y.git",
        ),
        ("https://ghp_tokenonly@github.com/org/repo", "https://github.com/org/repo"),
        ("https://github.com/org/repo.git?access_token=abc", "https://github.com/org/repo.git"),
        ("https://github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("ssh://git@github.com/org/repo.git", "ssh://github.com/org/repo.git"),
    ],
)
def test_git_remote_is_recorded_without_credentials(git_repo: Path, url: str, recorded: str) -> None:
    _run_git(git_repo, "remote", "add", "origin", url)

    assert git_state(str(git_repo))["remote"] == recorded


@needs_git
def test_git_remote_prefers_origin(git_repo: Path) -> None:
    _run_git(git_repo, "remote", "add", "aaa-fork", "https://example.com/fork.git")
    _run_git(git_repo, "remote", "add", "origin", "https://example.com/upstream.git")

    assert git_state(str(git_repo))["remote"] == "https://example.com/upstream.git"


@needs_git
def test_git_state_before_the_first_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    _run_git(tmp_path, "init", "-q", "-b", "trunk")

    assert git_state(str(tmp_path)) == {"commit": None, "branch": "trunk", "dirty": False, "remote": None}


@needs_git
def test_git_state_is_none_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))

    assert git_state(str(tmp_path)) is None
    assert _warnings(caplog) == []


def test_git_state_is_none_when_git_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)

    assert git_state(".") is None
    assert any("git is not installed" in m for m in _warnings(caplog))


def test_git_state_is_none_for_a_directory_that_does_not_exist(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    assert git_state(str(tmp_path / "gone")) is None
    assert len(_warnings(caplog)) == 1


def test_git_state_warns_when_git_refuses_the_checkout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/git")

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            cmd, 128, "", "fatal: detected dubious ownership in repository at '/work/x'\nTo add an exception"
        )

    monkeypatch.setattr(environment.subprocess, "run", fake_run)

    assert git_state(".") is None
    assert any("dubious ownership" in m for m in _warnings(caplog))


def test_git_gives_up_after_one_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/git")
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd[1:])
        assert kwargs["timeout"] == environment.GIT_TIMEOUT_S
        assert kwargs["stdin"] == subprocess.DEVNULL
        if cmd[1:] == ["rev-parse", "--is-inside-work-tree"]:
            return subprocess.CompletedProcess(cmd, 0, "true\n", "")
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(environment.subprocess, "run", fake_run)

    state = git_state(".")

    assert state == {"commit": None, "branch": None, "dirty": None, "remote": None}
    assert len(calls) == 2  # the check, then the one call that hung; nothing after it
    assert any("timed out" in m for m in _warnings(caplog))


# --------------------------------------------------------------------------------------------------
# Seeds


def test_seed_state_reads_lightnings_seed_and_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    saved_seed, saved_state = torch.initial_seed(), torch.get_rng_state()
    monkeypatch.setenv("PL_GLOBAL_SEED", "42")
    try:
        torch.manual_seed(1234)
        assert seed_state() == {"pl_global_seed": 42, "torch_initial_seed": 1234}
    finally:
        torch.manual_seed(saved_seed)
        torch.set_rng_state(saved_state)


def test_seed_state_without_lightnings_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)

    seeds = seed_state()

    assert seeds["pl_global_seed"] is None
    assert seeds["torch_initial_seed"] == torch.initial_seed()


def test_seed_state_with_a_malformed_seed_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "forty-two")

    seeds = seed_state()

    assert seeds["pl_global_seed"] is None
    assert seeds["torch_initial_seed"] == torch.initial_seed()
    assert any("PL_GLOBAL_SEED" in m for m in _warnings(caplog))


# --------------------------------------------------------------------------------------------------
# The whole capture


@needs_git
def test_capture_environment_is_plain_json(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")

    capture = capture_environment(cwd=str(git_repo))

    assert set(capture) == {"versions", "host", "env", "git", "seeds"}
    assert all(piece is not None for piece in capture.values())
    # A round trip that changes nothing: no tuples, no str subclasses, no non-string keys.
    assert json.loads(json.dumps(capture, allow_nan=False)) == capture
    assert capture["env"]["NCCL_DEBUG"] == "INFO"
    assert capture["seeds"]["pl_global_seed"] == 7
    assert capture["git"]["commit"] == _run_git(git_repo, "rev-parse", "HEAD")


def test_a_failing_piece_is_none_with_a_warning_and_the_rest_is_captured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> dict:
        raise RuntimeError("sensor exploded")

    monkeypatch.setattr(environment, "host_fingerprint", broken)

    capture = capture_environment()

    assert capture["host"] is None
    assert capture["versions"]["torch"] == torch.__version__
    assert capture["seeds"]["torch_initial_seed"] == torch.initial_seed()
    assert isinstance(capture["env"], dict)
    assert any("host fingerprint" in m and "sensor exploded" in m for m in _warnings(caplog))


def test_a_failing_piece_warns_only_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(environ: object = None) -> dict:
        raise RuntimeError("no environ")

    monkeypatch.setattr(environment, "captured_environment", broken)

    first, second = capture_environment(), capture_environment()

    assert first["env"] is None and second["env"] is None
    assert sum("no environ" in m for m in _warnings(caplog)) == 1


def test_warnings_do_not_repeat_a_secret(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    token = "ghp_" + _random_token(string.ascii_letters + string.digits, 36, 6)

    def broken() -> dict:
        raise RuntimeError(f"could not reach https://x:{token}@example.com")

    monkeypatch.setattr(environment, "seed_state", broken)

    assert capture_environment()["seeds"] is None
    messages = _warnings(caplog)
    assert messages and all(token not in m for m in messages)
