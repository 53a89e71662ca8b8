"""Telemetry: the NVML sensor (through a fake NVML), the host sensors, and the sampler thread."""

from __future__ import annotations

import itertools
import json
import logging
import math
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pynvml
import pytest

from tuneup.collect import host
from tuneup.collect.host import MIN_CPU_WINDOW_S, ProcessTreeSensor, SystemSensor
from tuneup.collect.nvml import NvmlSensor, gpu_inventory, load_nvml, throttle_names
from tuneup.collect.sampler import TelemetrySampler, default_sensors

from fake_nvml import GIB, FakeNvml

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def tuneup_records(caplog, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tuneup" and r.levelno == level]


def wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def spin_until_cpu_seconds_pass(cpu_s: float) -> None:
    me = psutil.Process()
    start = sum(me.cpu_times()[:2])
    while sum(me.cpu_times()[:2]) - start < cpu_s:
        sum(range(10_000))


def nvml_sensor(fake: FakeNvml, **kwargs) -> NvmlSensor:
    lib = load_nvml(fake)
    assert lib is fake
    return NvmlSensor(lib, **kwargs)


# ---- NVML sensor --------------------------------------------------------------------------------------


def test_nvml_sensor_reports_every_field_in_stated_units():
    gpus = nvml_sensor(FakeNvml(gpu_count=2)).sample()

    assert [gpu["index"] for gpu in gpus] == [0, 1]
    gpu0, gpu1 = gpus
    assert gpu0 == {
        "index": 0,
        "bus_id": "00000000:19:00.0",
        "util_percent": 50,
        "mem_util_percent": 20,
        "mem_used_bytes": 10 * GIB,
        "mem_total_bytes": 141 * GIB,
        "power_w": 250.0,  # 250000 mW
        "energy_j": 123456.789,  # 123456789 mJ
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "temp_c": 40,
        "throttle_reasons": 0x5,
        "throttle": ["gpu_idle", "sw_power_cap"],
        "pcie_tx_bytes_per_s": 1000 * 1024,  # KB/s
        "pcie_rx_bytes_per_s": 2000 * 1024,
        "nvlink_tx_bytes": 10_000 * 1024,  # KiB
        "nvlink_rx_bytes": 20_000 * 1024,
    }
    assert gpu1["bus_id"] == "00000000:1A:00.0"
    assert gpu1["power_w"] == 251.0
    assert gpu1["throttle"] == []
    json.dumps(gpus)


def test_throttle_names_name_the_set_bits():
    assert throttle_names(0) == []
    assert throttle_names(0x8 | 0x40 | 0x80) == ["hw_slowdown", "hw_thermal", "hw_power_brake"]
    assert throttle_names(0x4 | 0x20 | 0x10 | 0x2) == [
        "applications_clocks",
        "sw_power_cap",
        "sync_boost",
        "sw_thermal",
    ]
    assert throttle_names(1 << 40) == []  # unknown bits stay only in the raw mask


def test_pcie_throughput_is_read_only_every_nth_tick():
    fake = FakeNvml(gpu_count=1)
    sensor = nvml_sensor(fake, pcie_every_n=3)

    samples = [sensor.sample()[0] for _ in range(6)]

    with_pcie = [i for i, gpu in enumerate(samples) if "pcie_tx_bytes_per_s" in gpu]
    assert with_pcie == [0, 3]
    assert all(("pcie_rx_bytes_per_s" in gpu) == (i in with_pcie) for i, gpu in enumerate(samples))
    assert fake.calls[("nvmlDeviceGetPcieThroughput", 0)] == 4  # TX and RX on two ticks
    assert all("util_percent" in gpu for gpu in samples)


def test_unsupported_field_is_asked_once_and_omitted(caplog):
    fake = FakeNvml(gpu_count=2, unsupported={("nvmlDeviceGetTotalEnergyConsumption", 0)})
    sensor = nvml_sensor(fake)

    samples = [sensor.sample() for _ in range(5)]

    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == 1
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 1)] == 5
    assert all("energy_j" not in gpus[0] for gpus in samples)
    assert all(gpus[1]["energy_j"] == 123457.789 for gpus in samples)
    assert all(gpus[0]["power_w"] == 250.0 for gpus in samples)
    assert tuneup_records(caplog) == []


def test_nvlink_unsupported_per_entry_is_asked_once_and_omitted(caplog):
    fake = FakeNvml(gpu_count=1, nvlink_supported=False)
    sensor = nvml_sensor(fake)

    samples = [sensor.sample()[0] for _ in range(3)]

    assert fake.calls[("nvmlDeviceGetFieldValues", 0)] == 1
    assert all("nvlink_tx_bytes" not in gpu and "nvlink_rx_bytes" not in gpu for gpu in samples)
    assert tuneup_records(caplog) == []


def test_gpu_lost_mid_run_drops_that_gpu_only_and_warns_once(caplog):
    fake = FakeNvml(gpu_count=2)
    sensor = nvml_sensor(fake)
    assert "util_percent" in sensor.sample()[1]

    fake.lose(1)
    samples = [sensor.sample() for _ in range(3)]
    calls_after_loss = sum(n for key, n in fake.calls.items() if isinstance(key, tuple) and key[1] == 1)
    sensor.sample()

    for gpus in samples:
        gpu0, gpu1 = gpus
        assert gpu0["util_percent"] == 50 and gpu0["power_w"] == 250.0
        assert gpu1 == {"index": 1, "bus_id": "00000000:1A:00.0", "lost": True}
    warnings = tuneup_records(caplog)
    assert len(warnings) == 1
    assert "GPU 1" in warnings[0].getMessage() and "lost" in warnings[0].getMessage()
    # a lost GPU is not asked again
    assert (
        sum(n for key, n in fake.calls.items() if isinstance(key, tuple) and key[1] == 1) == calls_after_loss
    )


def test_other_nvml_error_warns_once_per_field_and_recovers(caplog):
    key = ("nvmlDeviceGetPowerUsage", 0)
    fake = FakeNvml(gpu_count=2, errors={key: pynvml.NVML_ERROR_UNKNOWN})
    sensor = nvml_sensor(fake)

    samples = [sensor.sample() for _ in range(3)]

    assert all("power_w" not in gpus[0] and "util_percent" in gpus[0] for gpus in samples)
    assert all(gpus[1]["power_w"] == 251.0 for gpus in samples)
    assert fake.calls[key] == 3  # not remembered as unsupported: a transient error may clear
    assert len(tuneup_records(caplog)) == 1

    del fake.errors[key]
    assert sensor.sample()[0]["power_w"] == 250.0


def test_device_whose_handle_fails_is_skipped(caplog):
    fake = FakeNvml(gpu_count=2, handle_errors={0: pynvml.NVML_ERROR_NO_PERMISSION})
    sensor = nvml_sensor(fake)

    gpus = sensor.sample()
    sensor.sample()

    assert [gpu["index"] for gpu in gpus] == [1]
    assert gpus[0]["util_percent"] == 51
    assert len(tuneup_records(caplog)) == 1


def test_throttle_reasons_fall_back_when_the_driver_lacks_the_new_symbol(caplog):
    fake = FakeNvml(gpu_count=2, function_not_found={"nvmlDeviceGetCurrentClocksEventReasons"})
    sensor = nvml_sensor(fake)

    first, second = sensor.sample(), sensor.sample()

    assert first[0]["throttle"] == ["gpu_idle", "sw_power_cap"]
    assert second[0]["throttle_reasons"] == 0x5
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # forgotten after the first miss
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 4
    assert tuneup_records(caplog) == []


def test_nvml_sensor_close_shuts_nvml_down_once():
    fake = FakeNvml(gpu_count=1)
    sensor = nvml_sensor(fake)
    assert fake.init_count == 1

    sensor.close()
    sensor.close()

    assert fake.init_count == 0
    assert sensor.sample() is None


# ---- load_nvml and gpu_inventory ----------------------------------------------------------------------


def test_load_nvml_returns_none_when_init_fails():
    fake = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert load_nvml(fake) is None
    assert fake.calls["nvmlInit"] == 1


def test_load_nvml_returns_none_without_gpus_and_shuts_down():
    fake = FakeNvml(gpu_count=0)
    assert load_nvml(fake) is None
    assert fake.init_count == 0


def test_real_load_nvml_matches_whether_this_machine_has_nvml():
    try:
        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        has_gpu = False

    lib = load_nvml()

    if has_gpu:
        assert lib is pynvml
        lib.nvmlShutdown()
    else:
        assert lib is None


def test_gpu_inventory_through_fake():
    fake = FakeNvml(gpu_count=2)

    inventory = gpu_inventory(fake)

    assert inventory["driver_version"] == "550.54.15"
    assert inventory["cuda_driver_version"] == "12.4"
    assert [gpu["index"] for gpu in inventory["gpus"]] == [0, 1]
    gpu0 = inventory["gpus"][0]
    assert gpu0 == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "pci_bus_id": "00000000:19:00.0",
        "pci_device_id": "0x233510de",
        "pci_device": "0x2335",
        "memory_total_bytes": 141 * GIB,
        "pcie_max_gen": 5,
        "pcie_max_width": 16,
        "nvlink_links_active": 18,
        "nvml_nvlink_version": 6,
    }
    assert fake.init_count == 0  # balanced init/shutdown
    json.dumps(inventory)


def test_gpu_inventory_decodes_bytes_and_tolerates_missing_values():
    fake = FakeNvml(
        gpu_count=1,
        bytes_strings=True,
        cuda_driver_version=11080,
        unsupported={"nvmlDeviceGetUUID"},
    )

    inventory = gpu_inventory(fake)

    assert inventory["driver_version"] == "550.54.15"
    assert inventory["cuda_driver_version"] == "11.8"
    assert inventory["gpus"][0]["name"] == "NVIDIA H200"
    assert inventory["gpus"][0]["uuid"] is None
    assert inventory["gpus"][0]["pci_device"] == "0x2335"


def test_gpu_inventory_is_none_without_nvml():
    assert gpu_inventory(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) is None


# ---- default_sensors -----------------------------------------------------------------------------------


def test_default_sensors_without_nvml_give_host_telemetry_and_one_info_line(caplog):
    failing = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    first = default_sensors(local_rank=0, nvml_lib=failing)
    default_sensors(local_rank=0, nvml_lib=failing)

    assert [sensor.name for sensor in first] == ["process", "system"]
    infos = [r for r in tuneup_records(caplog, logging.INFO) if "host telemetry only" in r.getMessage()]
    assert len(infos) == 1
    assert tuneup_records(caplog) == []


def test_default_sensors_on_this_machine_always_include_host_sensors():
    sensors = default_sensors(local_rank=0)
    names = [sensor.name for sensor in sensors]
    for sensor in sensors:
        sensor.close()
    assert names[:2] == ["process", "system"]
    if load_nvml() is None:
        assert names == ["process", "system"]


def test_default_sensors_with_nvml_add_one_gpu_sensor_on_local_rank_zero_only():
    fake = FakeNvml(gpu_count=2)

    rank0 = default_sensors(local_rank=0, nvml_lib=fake)
    rank1 = default_sensors(local_rank=1, nvml_lib=fake)
    no_gpus = default_sensors(local_rank=0, include_gpus=False, nvml_lib=fake)

    assert [sensor.name for sensor in rank0] == ["process", "system", "gpus"]
    assert [sensor.name for sensor in rank1] == ["process"]
    assert [sensor.name for sensor in no_gpus] == ["process", "system"]
    assert fake.calls["nvmlInit"] == 1


# ---- host sensors --------------------------------------------------------------------------------------


def test_process_tree_sensor_counts_a_child_process():
    sensor = ProcessTreeSensor()
    before = sensor.sample()
    child = subprocess.Popen(SLEEPER)
    try:
        assert wait_until(lambda: sensor.sample()["num_processes"] == before["num_processes"] + 1)
        # let the child finish starting so its memory no longer grows
        time.sleep(0.2)
        with_child = sensor.sample()
        own_rss = psutil.Process().memory_info().rss
        child_rss = psutil.Process(child.pid).memory_info().rss
        assert with_child["num_threads"] >= before["num_threads"] + 1
        assert with_child["rss_bytes"] > own_rss + child_rss // 2
    finally:
        child.kill()
        child.wait()
    assert sensor.sample()["num_processes"] == before["num_processes"]


def test_process_tree_sensor_sums_a_tree_rooted_elsewhere():
    spawn_grandchild = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", spawn_grandchild])
    try:
        sensor = ProcessTreeSensor(pid=parent.pid)
        assert wait_until(lambda: sensor.sample()["num_processes"] == 2)
        time.sleep(0.2)
        sample = sensor.sample()
        tree = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children(recursive=True)]
        assert sample["num_processes"] == 2
        assert sample["rss_bytes"] == pytest.approx(sum(p.memory_info().rss for p in tree), rel=0.05)
        assert sample["num_threads"] == sum(p.num_threads() for p in tree)
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()
    assert sensor.sample() is None  # the watched process is gone


def test_process_tree_sensor_sees_cpu_use():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sensor = ProcessTreeSensor(pid=busy.pid)
        assert wait_until(lambda: sensor.sample().get("cpu_percent", 0) > 0)
    finally:
        busy.kill()
        busy.wait()


def test_system_sensor_reports_memory_cpu_and_counters():
    sensor = SystemSensor()
    time.sleep(MIN_CPU_WINDOW_S * 2)
    sample = sensor.sample()

    assert sample["mem_total_bytes"] > 0
    assert 0 < sample["mem_used_bytes"] <= sample["mem_total_bytes"]
    assert 0.0 <= sample["cpu_percent"] <= 100.0
    for counters in sample["net"].values():
        assert set(counters) == {"sent_bytes", "recv_bytes"}
        assert counters["sent_bytes"] > 0 or counters["recv_bytes"] > 0
    if psutil.disk_io_counters() is not None:
        assert sample["disk_read_bytes"] >= 0 and sample["disk_write_bytes"] >= 0
    json.dumps(sample)


def test_cpu_percent_waits_for_a_long_enough_window(monkeypatch):
    now = [1_000_000.0]
    monkeypatch.setattr(host, "time", SimpleNamespace(time=lambda: now[0]))
    system, process = SystemSensor(), ProcessTreeSensor()

    assert "cpu_percent" not in system.sample()
    assert "cpu_percent" not in process.sample()
    now[0] += MIN_CPU_WINDOW_S / 2
    assert "cpu_percent" not in system.sample()
    assert "cpu_percent" not in process.sample()
    now[0] += MIN_CPU_WINDOW_S  # the baseline was kept, so the window now spans both steps
    spin_until_cpu_seconds_pass(0.03)  # some CPU time for this process to report

    assert system.sample()["cpu_percent"] >= 0.0
    assert process.sample()["cpu_percent"] > 0.0


def test_system_sensor_degrades_field_by_field(monkeypatch, caplog):
    sensor = SystemSensor()
    monkeypatch.setattr(psutil, "disk_io_counters", lambda *a, **k: None)

    def broken(*args, **kwargs):
        raise OSError("no /proc/net/dev")

    monkeypatch.setattr(psutil, "net_io_counters", broken)

    samples = [sensor.sample(), sensor.sample()]

    for sample in samples:
        assert "disk_read_bytes" not in sample and "net" not in sample
        assert sample["mem_total_bytes"] > 0
    warnings = tuneup_records(caplog)
    assert len(warnings) == 1 and "net" in warnings[0].getMessage()


# ---- the sampler ---------------------------------------------------------------------------------------


class StaticSensor:
    def __init__(self, name: str = "static", value: object = None) -> None:
        self.name = name
        self.value = {"x": 1} if value is None else value
        self.calls = 0
        self.closed = 0

    def sample(self) -> object:
        self.calls += 1
        return self.value

    def close(self) -> None:
        self.closed += 1


class ScriptedSensor(StaticSensor):
    """Fails on the ticks whose entry in `script` is False."""

    def __init__(self, script: list[bool], name: str = "flaky") -> None:
        super().__init__(name)
        self.script = script

    def sample(self) -> object:
        ok = self.script[self.calls % len(self.script)]
        self.calls += 1
        if not ok:
            raise RuntimeError("sensor broke")
        return self.value


class NothingSensor(StaticSensor):
    def sample(self) -> object:
        self.calls += 1
        return None


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1", None, True])
def test_sampler_rejects_a_bad_interval(bad):
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler([], lambda sample: None, interval_s=bad)


def test_sample_once_has_time_and_each_sensor_by_name_and_omits_none():
    sampler = TelemetrySampler([StaticSensor("a", {"v": 1}), NothingSensor("b")], lambda s: None)

    before = time.time()
    sample = sampler.sample_once()

    assert set(sample) == {"t", "a"}
    assert sample["a"] == {"v": 1}
    assert sample["t"] == round(sample["t"], 3)
    assert before - 0.001 <= sample["t"] <= time.time() + 0.001


def test_failing_sensor_is_skipped_retried_then_dropped_after_three_in_a_row(caplog):
    failing = ScriptedSensor([False])
    good = StaticSensor()
    sampler = TelemetrySampler([failing, good], lambda s: None)

    samples = [sampler.sample_once() for _ in range(5)]

    assert all(sample["static"] == {"x": 1} and "flaky" not in sample for sample in samples)
    assert failing.calls == 3  # retried twice, then dropped
    assert failing.closed == 1
    assert sampler.sensor_names == ["static"]
    messages = [r.getMessage() for r in tuneup_records(caplog)]
    assert len(messages) == 2
    assert "skipped this tick" in messages[0] and "no longer sampled" in messages[1]


def test_intermittent_failures_do_not_drop_a_sensor(caplog):
    flaky = ScriptedSensor([False, False, True])
    sampler = TelemetrySampler([flaky], lambda s: None)

    samples = [sampler.sample_once() for _ in range(9)]

    assert [("flaky" in sample) for sample in samples] == [False, False, True] * 3
    assert sampler.sensor_names == ["flaky"]
    assert len(tuneup_records(caplog)) == 1


def test_sampler_thread_feeds_the_sink_with_json_serializable_samples_despite_a_broken_sensor():
    received: list[dict] = []
    fake = FakeNvml(gpu_count=2)
    sensors = [*default_sensors(local_rank=0, nvml_lib=fake), ScriptedSensor([False])]
    sampler = TelemetrySampler(sensors, received.append, interval_s=0.01)

    sampler.start()
    assert wait_until(lambda: len(received) >= 5)
    sampler.stop()

    for sample in received:
        json.loads(json.dumps(sample))
        assert {"t", "process", "system", "gpus"} <= set(sample)
        assert "flaky" not in sample
    assert [gpu["index"] for gpu in received[-1]["gpus"]] == [0, 1]
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(received))
    assert fake.init_count == 0  # stop() closed the NVML sensor


def test_a_failing_sink_warns_once_and_sampling_continues(caplog):
    calls: list[dict] = []

    def sink(sample: dict) -> None:
        calls.append(sample)
        raise OSError("disk full")

    sampler = TelemetrySampler([StaticSensor()], sink, interval_s=0.01)
    sampler.start()
    assert wait_until(lambda: len(calls) >= 3)
    sampler.stop()

    warnings = tuneup_records(caplog)
    assert len(warnings) == 1 and "sink" in warnings[0].getMessage()


def test_stop_is_prompt_takes_a_final_sample_and_closes_sensors():
    received: list[dict] = []
    sensor = StaticSensor()
    sampler = TelemetrySampler([sensor], received.append, interval_s=30)

    sampler.start()
    assert wait_until(lambda: len(received) == 1)  # the first sample is immediate
    started = time.monotonic()
    sampler.stop()
    elapsed = time.monotonic() - started

    assert elapsed < 5.0
    assert len(received) == 2 and received[1]["static"] == {"x": 1}
    assert sensor.closed == 1
    sampler.stop()  # a second stop does nothing
    assert len(received) == 2 and sensor.closed == 1
    sampler.start()  # nor does a restart
    assert len(received) == 2


def test_stop_without_start_still_takes_the_final_sample():
    received: list[dict] = []
    sensor = StaticSensor()

    TelemetrySampler([sensor], received.append).stop()

    assert len(received) == 1 and "static" in received[0]
    assert sensor.closed == 1


def test_stop_gives_up_on_a_stuck_sensor_without_raising(caplog):
    import threading

    release = threading.Event()
    entered = threading.Event()

    class StuckSensor(StaticSensor):
        def sample(self) -> object:
            entered.set()
            release.wait(10)
            return self.value

    sensor = StuckSensor("stuck")
    sampler = TelemetrySampler([sensor], lambda s: None, interval_s=30)
    sampler.start()
    assert entered.wait(5)

    sampler.stop(timeout_s=0.05)

    release.set()
    assert sensor.closed == 0  # not closed under the thread that is using it
    assert any("did not stop" in r.getMessage() for r in tuneup_records(caplog))


def test_process_tree_leaves_out_other_training_ranks_launched_as_children(monkeypatch):
    # Lightning's DDP launcher starts rank 1 as a child of rank 0, with LOCAL_RANK=1 in its environment;
    # a dataloader worker inherits rank 0's environment. Only the worker belongs to rank 0's tree.
    import os

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    worker = subprocess.Popen(SLEEPER)
    other_rank = subprocess.Popen(SLEEPER, env={**os.environ, "LOCAL_RANK": "1"})
    try:
        sensor = ProcessTreeSensor()
        pids = {p.pid for p in sensor._own_descendants()}
        assert worker.pid in pids and other_rank.pid not in pids
        assert sensor.sample()["num_processes"] == 2  # this process and the worker
    finally:
        for proc in (worker, other_rank):
            proc.kill()
            proc.wait()
