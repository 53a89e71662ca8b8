"""Host telemetry from psutil: the training process tree, and the machine it runs on.

Counters that only grow (disk and network bytes) are recorded cumulative, not as rates, so a dropped or
late sample loses nothing; the analysis turns consecutive samples into rates.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from time import monotonic  # the PSS reads' cost and schedule: a clock that NTP does not step

import psutil

from tuneup._log import warn_once

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)

# CPU times advance in scheduler ticks (10 ms on most Linux systems): over a shorter window a rate is
# mostly noise (one tick in 1 ms reads as 1000 %), so CPU use is left out of a sample taken sooner than
# this after the previous one, and its baseline kept for the next.
MIN_CPU_WINDOW_S = 0.05

# Reading PSS (Linux: /proc/PID/smaps_rollup, through psutil's memory_full_info) makes the kernel walk the
# page tables of each process: about 50 ns per resident page, 12 ms per GiB of RSS summed over the tree
# (measured: 5 processes sharing 0.2, 2 and 8 GiB took 40, 160 and 490 ms a read, up to twice that on a
# busy host; their RSS takes 0.06 ms). Read every second, a rank of 10 GiB with 8 forked workers (90 GiB
# of RSS summed) would keep a core busy. So the next read waits until the last one is this share of the
# time since it: a 10 ms read (0.8 GiB) every 4 s, a 0.5 s read every 200 s. The read runs in the kernel
# with the GIL released, but on the core of another rank or the hyperthread beside this one, and it holds
# the process's memory map (the training thread's mmap and munmap wait for it): a quarter of a percent,
# not one percent as before, was what the overhead goal of a 10 ms step could afford (issue 13).
MEMORY_READ_MAX_SHARE = 0.0025


# The kernel's high-water mark of a process's RSS (Linux: VmHWM in /proc/PID/status, what `/usr/bin/time`
# and getrusage's ru_maxrss report): exact where PSS is sampled, so two identical runs read the same peak.
# One read of a small file, about 20 us, is cheap enough for every tick.
_HIGH_WATER = re.compile(rb"^VmHWM:\s+(\d+) kB", re.MULTILINE)


def rss_high_water_bytes(pid: int) -> int | None:
    """The largest RSS process `pid` has had since it started, in bytes; None where the platform does not
    say (no /proc: macOS, Windows) or the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            found = _HIGH_WATER.search(status.read())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


class ProcessTreeSensor:
    """CPU, memory and thread use of one process and all its descendants (dataloader workers included).

    `cpu_percent` is summed over the tree, 100 meaning one core fully busy (absent from a sample taken
    less than MIN_CPU_WINDOW_S after the previous one). `rss_bytes` is summed too, so pages shared with
    forked dataloader workers are counted once per process: an upper bound (8 GiB for a host whose memory
    peaked at 2 GiB). The tree's memory is therefore also read as `pss_bytes`, each shared page divided
    among the processes that map it, so the sum counts it once; where the platform has no PSS (macOS,
    Windows) as `uss_bytes`, private pages only, a lower bound. PSS costs a walk of every process's page
    tables, so it is read on the first tick and then as often as MEMORY_READ_MAX_SHARE allows: a sample
    without it is one in between. `memory_measure` ("pss", "uss" or "rss") names the measure of the tree's
    memory; "rss" where neither can be read (a permission, a /proc without smaps), warned once.
    `rss_peak_bytes` is the rank process's own high-water mark of RSS, kept by the kernel, not sampled:
    where the tree is that one process, its exact peak (the analysis decides, from `num_processes`).
    """

    def __init__(self, name: str = "process", pid: int | None = None, children_every_n: int = 5) -> None:
        self.name = name
        self._root = psutil.Process(pid)
        # Listing descendants reads every entry of /proc (milliseconds on a busy node, with the GIL held
        # in psutil's Python code, which the training thread then waits for): do it every Nth tick and
        # follow the known processes in between. A new dataloader worker shows up within N ticks.
        self._children_every_n = max(1, children_every_n)
        self._ticks = 0
        self._children: list[psutil.Process] = []
        self._rank_of: dict[tuple[int, float], bool] = {}  # (pid, create time) -> is another rank
        # pid -> (process, cpu seconds at the last tick, wall time of the last tick). Keeping the Process
        # objects lets psutil detect pid reuse (it compares creation times) across ticks.
        self._tracked: dict[int, tuple[psutil.Process, float, float]] = {}
        self._track(self._root, time.time())
        # "pss" or "uss" once a read has shown which the platform gives, "rss" once neither can be read.
        self._memory_measure: str | None = None
        self._next_memory_read_s = 0.0  # monotonic() of the next PSS read: the first tick reads

    def _own_descendants(self) -> list[psutil.Process]:
        """Descendants, less other training ranks and theirs.

        Lightning's DDP launcher starts ranks 1..n-1 as children of rank 0: counted here they would be
        counted twice, once in their own rank's sample. They are told apart from dataloader workers
        (which inherit this process's environment) by a RANK or LOCAL_RANK that is not this one's.
        """
        own = (os.environ.get("RANK"), os.environ.get("LOCAL_RANK"))
        keep: list[psutil.Process] = []
        dropped: set[int] = set()
        for child in self._root.children(recursive=True):  # parents come before their children
            try:
                other_rank = self._is_other_rank(child, own)
                parent_dropped = child.ppid() in dropped
            except _GONE:
                continue
            if other_rank or parent_dropped:
                dropped.add(child.pid)
            else:
                keep.append(child)
        alive = {p.pid for p in keep} | dropped
        self._rank_of = {k: v for k, v in self._rank_of.items() if k[0] in alive}
        return keep

    def _is_other_rank(self, child: psutil.Process, own: tuple[str | None, str | None]) -> bool:
        key = (child.pid, child.create_time())
        known = self._rank_of.get(key)
        if known is None:
            try:
                env = child.environ()
            except psutil.AccessDenied:
                env = {}
            theirs = (env.get("RANK"), env.get("LOCAL_RANK"))
            known = self._rank_of[key] = any(
                t is not None and t != o for t, o in zip(theirs, own, strict=True)
            )
        return known

    def _track(self, process: psutil.Process, now: float) -> None:
        try:
            cpu_s = _cpu_seconds(process)
        except _GONE:
            return
        self._tracked[process.pid] = (process, cpu_s, now)

    def sample(self) -> dict[str, object] | None:
        now = time.time()
        if self._ticks % self._children_every_n == 0:
            try:
                self._children = self._own_descendants()
            except _GONE:
                return None  # the process we watch has exited: nothing left to say
        self._ticks += 1
        children = self._children
        cpu_percent: float | None = None
        rss_bytes = 0
        num_threads = 0
        num_processes = 0
        read: list[psutil.Process] = []
        tracked: dict[int, tuple[psutil.Process, float, float]] = {}
        for found in (self._root, *children):
            known = self._tracked.get(found.pid)
            if known is not None and known[0] == found:
                process, last_cpu_s, last_wall = known
            else:
                # A new child: its CPU time so far was spent since it was created, so its first tick
                # already reports a meaningful rate instead of a priming zero.
                process = found
                last_cpu_s = 0.0
                try:
                    last_wall = process.create_time()
                except _GONE:
                    continue
            try:
                with process.oneshot():
                    cpu_s = _cpu_seconds(process)
                    rss = process.memory_info().rss
                    threads = process.num_threads()
            except _GONE:
                if found is self._root:
                    return None  # the process we watch has exited: nothing left to say
                continue  # exited between listing and reading; its last tick already counted it
            rss_bytes += rss
            num_threads += threads
            num_processes += 1
            read.append(process)
            elapsed = now - last_wall
            if elapsed < MIN_CPU_WINDOW_S:
                tracked[process.pid] = (process, last_cpu_s, last_wall)  # measure it next tick
                continue
            cpu_percent = (cpu_percent or 0.0) + max(0.0, cpu_s - last_cpu_s) / elapsed * 100.0
            tracked[process.pid] = (process, cpu_s, now)
        self._tracked = tracked
        result: dict[str, object] = {
            "rss_bytes": rss_bytes,
            "num_processes": num_processes,
            "num_threads": num_threads,
        }
        if cpu_percent is not None:
            result["cpu_percent"] = round(cpu_percent, 1)
        if (peak_bytes := rss_high_water_bytes(self._root.pid)) is not None:
            result["rss_peak_bytes"] = peak_bytes
        if self._memory_measure != "rss" and monotonic() >= self._next_memory_read_s:
            self._read_tree_memory(read, result)
        if self._memory_measure is not None:
            result["memory_measure"] = self._memory_measure
        return result

    def _read_tree_memory(self, processes: Sequence[psutil.Process], result: dict[str, object]) -> None:
        """Adds the tree's PSS (or USS) as `pss_bytes` (`uss_bytes`) to `result`, and schedules the next read."""
        started_s = monotonic()
        measure: str | None = None
        total_bytes = 0
        for process in processes:
            try:
                full = process.memory_full_info()
            except psutil.NoSuchProcess:  # exited since its RSS was read (a zombie too): nothing to count
                continue
            except Exception as error:  # AccessDenied, or a /proc that hides smaps
                self._fall_back_to_rss(f"{type(error).__name__}: {error}")
                return
            found = "pss" if hasattr(full, "pss") else "uss" if hasattr(full, "uss") else None
            if found is None:
                self._fall_back_to_rss("this platform gives neither PSS nor USS")
                return
            measure = found
            total_bytes += int(getattr(full, found))
        if measure is None:  # every process exited: try again next tick
            return
        self._memory_measure = measure
        result[f"{measure}_bytes"] = total_bytes
        now_s = monotonic()
        self._next_memory_read_s = now_s + (now_s - started_s) / MEMORY_READ_MAX_SHARE

    def _fall_back_to_rss(self, why: str) -> None:
        self._memory_measure = "rss"
        warn_once(
            f"{self.name}:memory",
            f"host telemetry cannot read the PSS or USS of the training processes ({why}); their memory is "
            "reported as RSS summed over processes, which counts pages shared with dataloader workers once "
            "per process (an upper bound)",
        )

    def close(self) -> None:
        self._tracked.clear()


def _cpu_seconds(process: psutil.Process) -> float:
    # children_user/children_system count only children that were waited for; the live children are
    # measured directly, so adding those would count dataloader workers twice.
    times = process.cpu_times()
    return times.user + times.system


class SystemSensor:
    """Machine-wide CPU and memory use, and cumulative disk and network byte counters.

    `cpu_percent` (100 = every core busy) is absent from a sample taken less than MIN_CPU_WINDOW_S after
    the previous one; a disk or network counter psutil cannot read is absent, with one warning.
    """

    def __init__(self, name: str = "system") -> None:
        self.name = name
        # Computed from cpu_times deltas of our own rather than psutil.cpu_percent(), whose "since last
        # call" state is per thread in recent psutil and global in older ones: either way another caller
        # or the thread change from construction to the sampler thread would distort the first reading.
        self._last_cpu = _cpu_busy_total()
        self._last_cpu_wall = time.time()

    def sample(self) -> dict[str, object]:
        result: dict[str, object] = {}
        self._read("cpu_percent", result, self._cpu_percent)
        self._read("memory", result, _memory)
        self._read("disk", result, _disk)
        self._read("net", result, _net)
        return result

    def _read(self, field: str, result: dict[str, object], reader: Callable[[], dict[str, object]]) -> None:
        try:
            result.update(reader())
        except Exception as error:
            warn_once(f"{self.name}:{field}", f"host telemetry cannot read {field} ({error}); omitted")

    def _cpu_percent(self) -> dict[str, object]:
        now = time.time()
        if now - self._last_cpu_wall < MIN_CPU_WINDOW_S:
            return {}
        busy, total = _cpu_busy_total()
        last_busy, last_total = self._last_cpu
        if total <= last_total:
            return {}
        self._last_cpu = (busy, total)
        self._last_cpu_wall = now
        return {"cpu_percent": round(max(0.0, busy - last_busy) / (total - last_total) * 100.0, 1)}

    def close(self) -> None:
        pass


def _cpu_busy_total() -> tuple[float, float]:
    times = psutil.cpu_times()
    # On Linux guest time is already included in user/nice; iowait is idle time, not work.
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    busy = total - times.idle - getattr(times, "iowait", 0.0)
    return busy, total


def _memory() -> dict[str, object]:
    memory = psutil.virtual_memory()
    return {"mem_used_bytes": int(memory.used), "mem_total_bytes": int(memory.total)}


def _disk() -> dict[str, object]:
    counters = psutil.disk_io_counters()
    if counters is None:  # no disks psutil can see (some containers)
        return {}
    return {"disk_read_bytes": int(counters.read_bytes), "disk_write_bytes": int(counters.write_bytes)}


def _net() -> dict[str, object]:
    net = {
        interface: {"sent_bytes": int(counters.bytes_sent), "recv_bytes": int(counters.bytes_recv)}
        for interface, counters in psutil.net_io_counters(pernic=True).items()
        if counters.bytes_sent or counters.bytes_recv
    }
    return {"net": net}
