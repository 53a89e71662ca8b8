"""The telemetry sampler: a background thread that reads a few sensors at a fixed interval.

Each tick makes one dict, `{"t": <unix seconds>, "<sensor name>": <what the sensor returned>, ...}`, and
hands it to a sink (normally the run record's writer). Telemetry must never fail the training it watches:
after construction nothing here raises; a failing sensor or sink warns once and the rest goes on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tuneup._log import info_once, warn_once
from tuneup.collect.gil import GilPacer
from tuneup.collect.host import ProcessTreeSensor, SystemSensor
from tuneup.collect.nvml import NvmlSensor, _load_nvml_with_reason, _shutdown

logger = logging.getLogger("tuneup")

# A sensor failing this many ticks in a row is taken to be broken for good rather than unlucky.
MAX_CONSECUTIVE_FAILURES = 3


class Sensor(Protocol):
    """One source of telemetry. `sample` returns a JSON-serializable dict or list, or None for nothing."""

    name: str

    def sample(self) -> object | None: ...

    def close(self) -> None: ...


class TelemetrySampler:
    """Samples `sensors` every `interval_s` seconds on a daemon thread and passes each sample to `sink`.

    `start()` begins sampling (the first sample is taken at once, so counters have a baseline);
    `stop()` ends it promptly, takes one final sample and closes the sensors.
    """

    def __init__(
        self, sensors: Sequence[Sensor], sink: Callable[[dict], None], interval_s: float = 1.0
    ) -> None:
        if (
            isinstance(interval_s, bool)
            or not isinstance(interval_s, (int, float))
            or not math.isfinite(interval_s)
            or interval_s <= 0
        ):
            raise ValueError(
                f"telemetry interval_s must be a positive number of seconds (e.g. 1.0), got {interval_s!r}"
            )
        self._sensors: list[Sensor] = list(sensors)
        self._failures: dict[int, int] = {}  # id(sensor) -> consecutive failures
        self._sink = sink
        self._interval_s = float(interval_s)
        self._stop_event = threading.Event()
        # Serializes sampling between the thread and callers of sample_once() (tests, the final sample).
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @property
    def sensor_names(self) -> list[str]:
        """Names of the sensors still being sampled (a sensor that kept failing is dropped)."""
        return [sensor.name for sensor in self._sensors]

    def start(self) -> None:
        if self._stopped:
            warn_once("telemetry:restart", "a stopped TelemetrySampler cannot be restarted; make a new one")
            return
        if self._thread is not None:
            return
        thread = threading.Thread(target=self._run, name="tuneup-telemetry", daemon=True)
        try:
            thread.start()
        except RuntimeError as error:  # "can't start new thread" under a thread limit
            warn_once("telemetry:thread", f"telemetry thread could not start ({error}); no telemetry")
            return
        self._thread = thread

    def _run(self) -> None:
        next_tick = time.monotonic()
        while True:
            # Between sensors the thread gives the GIL back: each is a few hundred us of Python (psutil
            # parsing /proc), which the training thread would otherwise wait for (tuneup.collect.gil).
            # Between sensors the thread gives the GIL back: each is a few hundred us of Python (psutil
            # parsing /proc), which the training thread would otherwise wait for (tuneup.collect.gil).
            self._emit(self.sample_once(pause=GilPacer()))
            next_tick += self._interval_s
            now = time.monotonic()
            if next_tick < now:
                # A tick overran the interval: rest a full interval instead of catching up, so a slow
                # sensor cannot turn the sampler into a busy loop beside the training.
                next_tick = now + self._interval_s
            if self._stop_event.wait(next_tick - now):
                return

    def sample_once(self, pause: Callable[[], None] | None = None) -> dict[str, Any]:
        """Read every sensor now and return the sample (does not call the sink); `pause()` runs between
        sensors (the sampler's thread gives the GIL back there)."""
        with self._lock:
            return self._sample_locked(pause)

    def _sample_locked(self, pause: Callable[[], None] | None = None) -> dict[str, Any]:
        sample: dict[str, Any] = {"t": round(time.time(), 3)}
        broken: list[Sensor] = []
        for sensor in self._sensors:
            if pause is not None and sample:
                pause()
            try:
                value = sensor.sample()
            except Exception as error:
                failures = self._failures.get(id(sensor), 0) + 1
                self._failures[id(sensor)] = failures
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    broken.append(sensor)
                else:
                    warn_once(
                        f"telemetry:{sensor.name}:sample",
                        f"telemetry sensor {sensor.name!r} failed ({type(error).__name__}: {error}); "
                        "skipped this tick",
                    )
                continue
            self._failures[id(sensor)] = 0
            if value is not None:
                sample[sensor.name] = value
        for sensor in broken:
            warn_once(
                f"telemetry:{sensor.name}:dropped",
                f"telemetry sensor {sensor.name!r} failed {MAX_CONSECUTIVE_FAILURES} times in a row; "
                "it is no longer sampled",
            )
            self._sensors.remove(sensor)
            self._failures.pop(id(sensor), None)
            _close_quietly(sensor)
        return sample

    def _emit(self, sample: dict[str, Any]) -> None:
        try:
            self._sink(sample)
        except Exception as error:
            warn_once(
                "telemetry:sink", f"telemetry sink failed ({type(error).__name__}: {error}); samples lost"
            )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, take one final sample, close the sensors. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        deadline = time.monotonic() + max(0.0, timeout_s)
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        # If the thread is stuck inside a sensor (e.g. a hung driver call), closing the sensors under it
        # could crash it; leave everything to the daemon thread and the process exit instead.
        if (thread is not None and thread.is_alive()) or not self._lock.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            warn_once(
                "telemetry:stop",
                f"telemetry did not stop within {timeout_s} s (a sensor is stuck); final sample skipped",
            )
            return
        try:
            final = self._sample_locked()
            sensors, self._sensors = self._sensors, []
        finally:
            self._lock.release()
        self._emit(final)
        for sensor in sensors:
            _close_quietly(sensor)

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _close_quietly(sensor: Sensor) -> None:
    try:
        sensor.close()
    except Exception as error:
        logger.debug("tuneup: closing telemetry sensor %r failed: %s", getattr(sensor, "name", sensor), error)


def default_sensors(*, local_rank: int, include_gpus: bool = True, nvml_lib: Any = None) -> list[Sensor]:
    """The sensors one rank should run: its own process tree always; the machine and its GPUs only on
    local rank 0, since those are shared by every rank of the node (NVML sees all of the node's GPUs
    regardless of CUDA_VISIBLE_DEVICES).

    `nvml_lib` replaces pynvml (tests pass a fake); it is initialized here.
    """
    sensors: list[Sensor] = []
    try:
        sensors.append(ProcessTreeSensor())
    except Exception as error:
        warn_once("telemetry:process:init", f"process telemetry unavailable ({error})")
    if local_rank != 0:
        return sensors
    try:
        sensors.append(SystemSensor())
    except Exception as error:
        warn_once("telemetry:system:init", f"system telemetry unavailable ({error})")
    if include_gpus:
        lib, reason = _load_nvml_with_reason(nvml_lib)
        if lib is None:
            info_once("nvml", f"no GPU telemetry: {reason}; host telemetry only")
        else:
            try:
                sensors.append(NvmlSensor(lib))
            except Exception as error:
                _shutdown(lib)
                warn_once("telemetry:gpus:init", f"GPU telemetry unavailable ({error}); host telemetry only")
    return sensors
