"""What the run ran on: software versions, host, allow-listed environment variables, git state, seeds.

Captured once per run, at start, into the run's manifest. Two rules shape this module:

- It never breaks the training it describes. Each piece, and each field inside a piece, that cannot be
  read is recorded as None and warned about once; everything else is still captured.
- Nothing secret leaves the machine by accident. Environment variables are allow-listed, then redacted
  by name and by value; credentials are stripped from git remote URLs. `redact_value` and
  `looks_secret` are public so that other text bound for a run record (exception messages, for one)
  can go through the same filter.

Everything returned is plain JSON: str, int, bool, None, and dicts of them.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from typing import TypedDict, TypeVar
from urllib.parse import urlsplit, urlunsplit

from tuneup._log import warn_once

__all__ = [
    "REDACTED",
    "EnvironmentCapture",
    "GitState",
    "HostFingerprint",
    "SeedState",
    "capture_environment",
    "captured_environment",
    "git_state",
    "host_fingerprint",
    "looks_secret",
    "redact_value",
    "seed_state",
    "software_versions",
]

REDACTED = "<redacted>"

# A `git status` on a huge checkout, or a git waiting on a lock, must not hold up the start of training.
GIT_TIMEOUT_S = 2.0

_T = TypeVar("_T")


class HostFingerprint(TypedDict):
    hostname: str | None
    cpu_model: str | None
    cpu_count_logical: int | None
    cpu_count_physical: int | None
    ram_total_bytes: int | None
    os: str | None
    cpu_bf16: bool | None  # bf16 arithmetic (AVX512-BF16 or AMX) in the CPU's flags; None: not read


class GitState(TypedDict):
    commit: str | None
    branch: str | None
    dirty: bool | None
    remote: str | None


class SeedState(TypedDict):
    pl_global_seed: int | None
    torch_initial_seed: int | None


class EnvironmentCapture(TypedDict):
    versions: dict[str, str | None] | None
    host: HostFingerprint | None
    env: dict[str, str] | None
    git: GitState | None
    seeds: SeedState | None


def _attempt(key: str, what: str, read: Callable[[], _T]) -> _T | None:
    """Return `read()`, or None after warning once (keyed by `key`) when it raises."""
    try:
        return read()
    except Exception as exc:
        # The exception text can carry a URL or a command line; keep secrets out of the log as well.
        detail = redact_value("", f"{type(exc).__name__}: {exc}")
        warn_once(f"environment.{key}", f"could not read {what} ({detail}); recorded as null")
        return None


# --------------------------------------------------------------------------------------------------
# Software versions


def _distribution_version(name: str) -> str | None:
    # importlib.metadata reads the installed metadata without importing the package: importing
    # `lightning` just for its version would cost a second and pull in a second Lightning namespace.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nccl_version() -> str | None:
    import torch

    # Gate on the build, not on torch.cuda.is_available(): that call initializes the CUDA driver in this
    # process, which breaks CUDA in workers forked later (Lightning's ddp_fork, notebooks). Asking NCCL
    # its version touches no device, and the NCCL that torch links is what a report needs to name.
    if torch.version.cuda is None or not hasattr(torch._C, "_nccl_version"):
        return None
    parts = tuple(torch.cuda.nccl.version())
    text = ".".join(str(p) for p in parts[:3])
    return f"{text}+{parts[3]}" if len(parts) > 3 and parts[3] else text


def _cudnn_version() -> str | None:
    import torch

    version = torch.backends.cudnn.version()
    return None if version is None else str(version)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _torch_cuda_version() -> str | None:
    import torch

    return torch.version.cuda


def _platform_name() -> str:
    # platform.platform() appends libc details ("-with-glibc2.36") that say nothing about performance.
    return f"{platform.system()}-{platform.release()}-{platform.machine()}"


def software_versions() -> dict[str, str | None]:
    """Versions of the software that shapes a run's performance.

    Keys: `tuneup`, `python`, `torch`, `lightning` (the `lightning` package; None when not installed),
    `pytorch_lightning`, `cuda` (the CUDA torch was built with), `cudnn`, `nccl` (e.g. "2.21.5"; None on
    a build without NCCL), `nvidia_ml_py`, `psutil`, `platform` (e.g. "Linux-6.1.0-x86_64"). A version
    that cannot be read is None, and a warning is logged once.
    """

    def read_tuneup_version() -> str:
        from tuneup._version import __version__

        return __version__

    readers: dict[str, Callable[[], str | None]] = {
        "tuneup": read_tuneup_version,
        "python": platform.python_version,
        "torch": _torch_version,
        "lightning": lambda: _distribution_version("lightning"),
        "pytorch_lightning": lambda: _distribution_version("pytorch-lightning"),
        "cuda": _torch_cuda_version,
        "cudnn": _cudnn_version,
        "nccl": _nccl_version,
        "nvidia_ml_py": lambda: _distribution_version("nvidia-ml-py"),
        "psutil": lambda: _distribution_version("psutil"),
        "platform": _platform_name,
    }
    return {key: _attempt(f"versions.{key}", f"the {key} version", read) for key, read in readers.items()}


# --------------------------------------------------------------------------------------------------
# Host


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            # Stop at the first core: on a large host the file runs to hundreds of kilobytes.
            for line in cpuinfo:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass  # not Linux, or /proc is hidden (some containers): fall back below
    return platform.processor() or None


def _cpu_bf16() -> bool | None:
    """Whether the CPU has bf16 arithmetic (the advice's precision rule: bf16 autocast without it is over 2x
    slower, pytorch #86270). Linux's first core's flags; None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "flags":
                    flags = set(value.split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return None


def _os_name() -> str:
    # The distribution ("Ubuntu 22.04.4 LTS") says more about drivers and libraries than the kernel does;
    # the kernel is already in the `platform` version.
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as release:
            for line in release:
                name, sep, value = line.strip().partition("=")
                if sep and name == "PRETTY_NAME" and value.strip("\"'"):
                    return value.strip("\"'")
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}".strip()


def _cpu_count_logical() -> int | None:
    import psutil

    return psutil.cpu_count(logical=True)


def _cpu_count_physical() -> int | None:
    import psutil

    return psutil.cpu_count(logical=False)


def _ram_total_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def host_fingerprint() -> HostFingerprint:
    """The machine this process runs on: `hostname`, `cpu_model`, `cpu_count_logical`,
    `cpu_count_physical`, `ram_total_bytes`, `os`. A field that cannot be read is None."""
    return HostFingerprint(
        hostname=_attempt("host.hostname", "the hostname", socket.gethostname),
        cpu_model=_attempt("host.cpu_model", "the CPU model", _cpu_model),
        cpu_count_logical=_attempt("host.cpu_count_logical", "the logical CPU count", _cpu_count_logical),
        cpu_count_physical=_attempt("host.cpu_count_physical", "the physical CPU count", _cpu_count_physical),
        ram_total_bytes=_attempt("host.ram_total_bytes", "the total RAM", _ram_total_bytes),
        os=_attempt("host.os", "the operating system", _os_name),
        cpu_bf16=_attempt("host.cpu_bf16", "the CPU's bf16 flags", _cpu_bf16),
    )


# --------------------------------------------------------------------------------------------------
# Environment variables: allow-list, then redaction

_CAPTURED_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "GLOO_", "NVIDIA_", "PL_", "TUNEUP_")

_CAPTURED_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "CUDA_VISIBLE_DEVICES",
    }
)

# SLURM exports about a hundred variables, among them the user (SLURM_JOB_USER), the account, the job
# name, the submit directory and host, and the node list: personal or organizational detail that a
# report does not need and that would travel with every shared run directory. Only the ids (to find the
# job in `sacct`) and the task/node/CPU/GPU counts (the topology Lightning saw) are kept.
_CAPTURED_SLURM_NAMES = frozenset(
    {
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_STEP_ID",
        "SLURM_STEPID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_STEP_NUM_NODES",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_CPUS_PER_TASK",
        "SLURM_CPUS_ON_NODE",
        "SLURM_JOB_CPUS_PER_NODE",
        "SLURM_GPUS",
        "SLURM_GPUS_ON_NODE",
        "SLURM_GPUS_PER_NODE",
        "SLURM_GPUS_PER_TASK",
        "SLURM_RESTART_COUNT",
    }
)

# PASS covers PASSWORD, PASSWD, PASSPHRASE and DB_PASS; a webhook URL or a cookie is a credential too.
_SECRET_NAME_PARTS = ("TOKEN", "SECRET", "KEY", "PASS", "CREDENTIAL", "AUTH", "COOKIE", "WEBHOOK")

# Issued credentials with a recognizable shape. Each pattern asks for the length of the real thing, so
# that an ordinary word that happens to start the same way ("hf_home", "sk-node01") is left alone.
_KNOWN_SECRET = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_\-]{20,}"  # OpenAI, Anthropic
    r"|sk_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|xox[abposre]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"  # AWS access key id
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|AIza[A-Za-z0-9_\-]{35}"  # Google API key
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-[A-Za-z0-9_\-]{50,}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]*"  # JWT: base64 of '{"' opens the header
    r")"
)

# The user may be empty: redis://:password@host is how Redis (and AMQP) URLs carry a password.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:[^/\s@]+@")
_PRIVATE_KEY_BLOCK = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
# "password=...", and in URLs "&pass=..." or an Azure SAS "&sig=..."; the short names only as words of
# their own, so that "bypass=true" or "design:v2" stay readable.
_ASSIGNED_SECRET = re.compile(
    r"(?i)(?:password|passwd|secret|token|api[_\-]?key|(?<![a-z])(?:pass|pwd|sig|signature))"
    r"\s*[=:]\s*[^\s,;&]{4,}",
)
# A command line's "--password hunter2", and an HTTP Authorization value ("Basic <base64>", "Bearer ...").
_PASSWORD_FLAG = re.compile(r"(?i)(?<![A-Za-z0-9\-])--?(?:password|passwd|pass|pwd)\s+[^\s\-]\S{3,}")
_AUTH_SCHEME = re.compile(r"(?i)\b(?:basic|bearer)\s+(?=\S*[0-9])[A-Za-z0-9+/=._~\-]{8,}")

# GPU and MIG UUIDs (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES) and run ids (sometimes a UUID written
# with underscores) are random hex by design and not secret. They are taken out before the generic
# check below, which would otherwise match them.
_UUID = re.compile(r"[0-9a-fA-F]{8}([-_])[0-9a-fA-F]{4}\1[0-9a-fA-F]{4}\1[0-9a-fA-F]{4}\1[0-9a-fA-F]{12}")
_LONG_HEX = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{32,}(?![0-9a-fA-F])")
_LONG_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_MIN_CLASS_SWITCH_RATE = 0.3
_MIN_LETTER_DIGIT_CONTACTS = 6


def _char_class(ch: str) -> int:
    if ch.isdigit():
        return 0
    return 1 if ch.islower() else 2


def _looks_random(run: str) -> bool:
    """Whether a long run of token characters reads as random rather than as a name or a path.

    Two signs, either enough. Random base64 switches between lowercase, uppercase and digits at about
    65% of adjacent pairs (hex and lowercase alphanumerics at 40-47%); and random alphanumerics put a
    digit right against a letter a dozen times in 32 characters. Paths and identifiers
    ("run_2024_05_01/epoch=3-step=1000") put separators between their words and numbers, so both counts
    stay low.
    """
    if not (any(c.isalpha() for c in run) and any(c.isdigit() for c in run)):
        return False
    pairs = class_switches = letter_digit_contacts = 0
    for a, b in itertools.pairwise(run):
        if a.isalnum() and b.isalnum():
            pairs += 1
            class_switches += _char_class(a) != _char_class(b)
            letter_digit_contacts += a.isdigit() != b.isdigit()
    return pairs > 0 and (
        class_switches / pairs >= _MIN_CLASS_SWITCH_RATE
        or letter_digit_contacts >= _MIN_LETTER_DIGIT_CONTACTS
    )


def looks_secret(value: str) -> bool:
    """Whether `value` contains something that looks like a credential.

    Matches known token shapes (OpenAI/Anthropic "sk-", GitHub "ghp_"/"github_pat_", Slack "xox?-", AWS
    "AKIA", Hugging Face "hf_", GitLab "glpat-", Google "AIza", JWTs "eyJ..."), a password inside a URL
    (with or without a user), a private key block, "password=..."-style assignments (and "pass=",
    "sig=" in URLs), "--password ..." flags, HTTP "Basic"/"Bearer" credentials, and any run of 32 or
    more base64/hex characters that mixes letters and digits the way random strings do. Paths, device
    lists ("0,1,2,3"), log levels, interface names, host names, IP addresses and GPU UUIDs do not match.
    It errs on the side of matching: a redacted value costs a report little, a leaked one cannot be taken
    back.
    """
    if not value:
        return False
    if (
        _KNOWN_SECRET.search(value)
        or _URL_WITH_PASSWORD.search(value)
        or _PRIVATE_KEY_BLOCK.search(value)
        or _ASSIGNED_SECRET.search(value)
        or _PASSWORD_FLAG.search(value)
        or _AUTH_SCHEME.search(value)
    ):
        return True
    without_uuids = _UUID.sub(" ", value)
    for match in _LONG_HEX.finditer(without_uuids):
        run = match.group()
        if any(c.isalpha() for c in run) and any(c.isdigit() for c in run):
            return True
    return any(_looks_random(m.group()) for m in _LONG_TOKEN_RUN.finditer(without_uuids))


def _name_is_secret(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in _SECRET_NAME_PARTS)


def redact_value(name: str, value: str) -> str:
    """`value`, or "<redacted>" when `name` names a credential (contains TOKEN, SECRET, KEY, PASS (as in
    PASSWORD, PASSWD, PASSPHRASE), CREDENTIAL, AUTH, COOKIE or WEBHOOK, in any case) or when `value` looks
    like one (see `looks_secret`).

    Pass an empty `name` to judge the value alone.
    """
    if _name_is_secret(name) or looks_secret(value):
        return REDACTED
    return value


def _is_captured_name(name: str) -> bool:
    return name in _CAPTURED_NAMES or name in _CAPTURED_SLURM_NAMES or name.startswith(_CAPTURED_PREFIXES)


def captured_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment variables of `environ` (default: `os.environ`), redacted, by name.

    Captured: names starting with NCCL_, CUDA_, TORCH_, PYTORCH_, GLOO_, NVIDIA_, PL_ or TUNEUP_; the
    launcher's rank and rendezvous variables (WORLD_SIZE, RANK, LOCAL_RANK, NODE_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), OMP_NUM_THREADS, MKL_NUM_THREADS, CUDA_VISIBLE_DEVICES;
    and SLURM's job, step, task and node ids and counts (not the rest of SLURM_*, which names the user,
    account, job and directories). Everything else is left out. A captured value is replaced by
    "<redacted>" when `redact_value` says so.
    """
    source = os.environ if environ is None else environ
    captured: dict[str, str] = {}
    for name in sorted(source):
        if not isinstance(name, str) or not _is_captured_name(name):
            continue
        captured[name] = redact_value(name, str(source[name]))
    return captured


# --------------------------------------------------------------------------------------------------
# Git


class _Git:
    """Runs git in one directory, and gives up on the rest once one call has timed out.

    Each call may take 2 s; without the give-up a hung git (a stale NFS mount, a lock) would cost the
    start of training 2 s per field instead of 2 s in all.
    """

    def __init__(self, executable: str, cwd: str | None) -> None:
        self.executable = executable
        self.cwd = cwd
        self.timed_out = False
        env = dict(os.environ)
        # GIT_OPTIONAL_LOCKS=0: `git status` would otherwise refresh the index and take index.lock,
        # racing with whatever the user does in the same checkout. No prompts: nobody is there to answer.
        env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
        self.env = env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        if self.timed_out:
            raise TimeoutError("skipped: an earlier git call timed out")
        try:
            return subprocess.run(
                [self.executable, *args],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.timed_out = True
            raise

    def output(self, *args: str) -> str | None:
        """Stripped stdout, or None when git exits non-zero (e.g. HEAD before the first commit)."""
        result = self.run(*args)
        if result.returncode != 0:
            return None
        return result.stdout.strip() or None


def _strip_url_credentials(url: str) -> str:
    """`url` without user, password, query or fragment; scp-style remotes ("git@host:org/repo") kept.

    A user name alone is dropped too: GitHub and GitLab accept a token as the user name.
    """
    if "://" not in url:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _remote_url(git: _Git) -> str | None:
    names = (git.output("remote") or "").split()
    if not names:
        return None
    # origin is what people mean by "the" remote; a checkout without one gets its first remote.
    name = "origin" if "origin" in names else names[0]
    url = git.output("remote", "get-url", name)
    return None if url is None else _strip_url_credentials(url)


def _dirty(git: _Git) -> bool:
    result = git.run("status", "--porcelain", "--untracked-files=no")
    if result.returncode != 0:
        raise RuntimeError(f"git status exited with {result.returncode}")
    return bool(result.stdout.strip())


def git_state(cwd: str | None = None) -> GitState | None:
    """The git checkout `cwd` (default: the current directory) is in: `commit` (full sha; None before
    the first commit), `branch` (None when detached), `dirty` (tracked files modified; untracked ones do
    not count), `remote` (origin's URL, else the first remote's, with credentials stripped).

    None when `cwd` is not inside a checkout or git is not installed. A git call that takes over 2 s is
    abandoned, with the calls after it; a field whose call fails is None, with a warning logged once.
    """
    executable = shutil.which("git")
    if executable is None:
        warn_once("environment.git.missing", "git is not installed; the run records no git state")
        return None
    git = _Git(executable, cwd)
    try:
        probe = git.run("rev-parse", "--is-inside-work-tree")
    except Exception as exc:
        # A timeout, or a cwd that does not exist.
        detail = redact_value("", f"{type(exc).__name__}: {exc}")
        warn_once("environment.git.run", f"could not run git ({detail}); recorded as null")
        return None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[0]
        # Outside a checkout is the ordinary case. Anything else is a checkout git refused to read, most
        # often one owned by another user in a container ("dubious ownership"), which the user can fix.
        if "not a git repository" not in reason:
            warn_once(
                "environment.git.refused",
                f"git could not read the checkout ({redact_value('', reason)}); recorded as null",
            )
        return None
    if probe.stdout.strip() != "true":
        return None
    return GitState(
        commit=_attempt(
            "git.commit", "the git commit", lambda: git.output("rev-parse", "--verify", "-q", "HEAD")
        ),
        branch=_attempt(
            "git.branch", "the git branch", lambda: git.output("symbolic-ref", "--short", "-q", "HEAD")
        ),
        dirty=_attempt("git.dirty", "whether the checkout is dirty", lambda: _dirty(git)),
        remote=_attempt("git.remote", "the git remote", lambda: _remote_url(git)),
    )


# --------------------------------------------------------------------------------------------------
# Seeds


def _pl_global_seed() -> int | None:
    # Lightning's seed_everything records the seed here, and its DDP launchers pass it to the workers.
    raw = os.environ.get("PL_GLOBAL_SEED")
    return None if raw is None or not raw.strip() else int(raw)


def _torch_initial_seed() -> int:
    import torch

    return int(torch.initial_seed())


def seed_state() -> SeedState:
    """`pl_global_seed` (the PL_GLOBAL_SEED variable Lightning's `seed_everything` sets, as an int; None
    when unset) and `torch_initial_seed` (`torch.initial_seed()` of the default CPU generator)."""
    return SeedState(
        pl_global_seed=_attempt("seeds.pl_global_seed", "PL_GLOBAL_SEED as an integer", _pl_global_seed),
        torch_initial_seed=_attempt("seeds.torch_initial_seed", "torch.initial_seed()", _torch_initial_seed),
    )


# --------------------------------------------------------------------------------------------------


def capture_environment(cwd: str | None = None) -> EnvironmentCapture:
    """Everything above, for the run manifest: `versions`, `host`, `env`, `git`, `seeds`.

    `cwd` is where to look for the git checkout (default: the current directory). Never raises: a piece
    that fails as a whole is None, with a warning logged once. `git` is also None outside a checkout.
    """
    return EnvironmentCapture(
        versions=_attempt("versions", "software versions", software_versions),
        host=_attempt("host", "the host fingerprint", host_fingerprint),
        env=_attempt("env", "environment variables", captured_environment),
        git=_attempt("git", "the git state", lambda: git_state(cwd)),
        seeds=_attempt("seeds", "the seeds", seed_state),
    )
