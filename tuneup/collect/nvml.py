"""GPU telemetry and inventory from NVML (nvidia-ml-py, imported as `pynvml`).

Every NVML call goes through a `lib` object with pynvml's names (functions, constants, `NVMLError`), so
tests can pass a fake library and exercise the real error handling. By default `lib` is `pynvml` itself.

NVML sees every GPU of the node whatever CUDA_VISIBLE_DEVICES says, so one sensor per node (local rank 0)
is enough; indices here are NVML indices, and `bus_id` is what ties a GPU to a rank's CUDA device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tuneup._log import warn_once

logger = logging.getLogger("tuneup")

# A scopeId of UINT_MAX asks NVML for the NVLink counter summed over all links of the device (nvml.h).
_ALL_NVLINKS = 0xFFFFFFFF

# Clock event ("throttle") reason bits from nvml.h. Hard-coded because older pynvml releases lack some
# names and the bit values are ABI; bits not named here still appear in the raw `throttle_reasons` mask.
_THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)

# pynvml defines these; the defaults only matter for a partial fake or a very old pynvml.
_NOT_SUPPORTED_DEFAULT = 3
_FUNCTION_NOT_FOUND_DEFAULT = 13
_GPU_IS_LOST_DEFAULT = 15


def throttle_names(reasons: int) -> list[str]:
    """Short names of the clock event reason bits set in `reasons` (unknown bits are left out)."""
    return [name for bit, name in _THROTTLE_BITS if reasons & bit]


def _text(value: object) -> str:
    # pynvml returns str for names on Python 3, but ctypes char arrays inside structs (PCI bus id) and
    # older pynvml releases give bytes.
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def _error_code(error: BaseException) -> int | None:
    return getattr(error, "value", None)


def _first_available(lib: Any, names: tuple[str, ...]) -> list[Callable[..., Any]]:
    return [fn for name in names if (fn := getattr(lib, name, None)) is not None]


def load_nvml(lib: Any = None) -> Any | None:
    """Initialize NVML and return the library object, or None when NVML, the driver or a GPU is missing.

    The caller owns one `nvmlShutdown()` for each successful load (NVML counts initializations).
    """
    return _load_nvml_with_reason(lib)[0]


def _load_nvml_with_reason(lib: Any = None) -> tuple[Any | None, str]:
    if lib is None:
        try:
            import pynvml as lib
        except ImportError as error:
            return None, f"nvidia-ml-py is not installed ({error})"
    try:
        lib.nvmlInit()
    except Exception as error:  # NVMLError, or OSError from a broken libnvidia-ml
        return None, f"NVML could not be initialized ({error})"
    try:
        count = int(lib.nvmlDeviceGetCount())
    except Exception as error:
        _shutdown(lib)
        return None, f"NVML could not count GPUs ({error})"
    if count <= 0:
        _shutdown(lib)
        return None, "NVML sees no GPU"
    return lib, ""


def _shutdown(lib: Any) -> None:
    try:
        lib.nvmlShutdown()
    except Exception as error:
        logger.debug("tuneup: nvmlShutdown failed: %s", error)


def _cuda_version_text(version: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlSensor:
    """Samples every NVML device; one dict per GPU with units in the field names.

    Takes ownership of an initialized `lib` (from `load_nvml`): `close()` shuts NVML down once.
    A field that is not supported on a device is asked once and never again; other NVML errors warn once
    per (device, field) and omit the field while they last; a lost GPU warns once and stays marked lost.
    """

    def __init__(self, lib: Any, name: str = "gpus", *, pcie_every_n: int = 5) -> None:
        if pcie_every_n < 1:
            raise ValueError(f"pcie_every_n must be an integer >= 1, got {pcie_every_n!r}")
        self.name = name
        self._lib = lib
        self._error_type: type[BaseException] = getattr(lib, "NVMLError", Exception)
        self._not_supported = getattr(lib, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED_DEFAULT)
        self._function_not_found = getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND_DEFAULT)
        self._gpu_is_lost = getattr(lib, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST_DEFAULT)
        # nvmlDeviceGetPcieThroughput measures over a ~20 ms window inside the call: asked every tick,
        # TX and RX on 8 GPUs would block the sampler ~320 ms per tick and skew when every other reading
        # is taken. Every Nth tick keeps PCIe traffic visible at a fraction of that cost.
        self._pcie_every_n = int(pcie_every_n)
        self._tick = 0
        self._closed = False
        self._handles: dict[int, Any] = {}
        self._bus_ids: dict[int, str] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._lost: set[int] = set()
        # Newer drivers renamed "throttle reasons" to "clocks event reasons"; an old driver lacks the new
        # symbol even when pynvml has the Python function (FUNCTION_NOT_FOUND), hence a fallback chain.
        self._throttle_fns = _first_available(
            lib, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        )
        self._pci_fns = _first_available(lib, ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"))
        self._fields = self._field_readers()
        try:
            self._device_count = int(lib.nvmlDeviceGetCount())
        except Exception as error:
            warn_once(f"nvml:{name}:count", f"NVML could not count GPUs ({error}); no GPU telemetry")
            self._device_count = 0

    def _field_readers(self) -> list[tuple[str, int, Callable[[Any], dict[str, object]]]]:
        """(field key, every n ticks, reader) for each group of fields; a missing function drops its group."""
        lib = self._lib
        readers: list[tuple[str, int, Callable[[Any], dict[str, object]]]] = []

        def add(key: str, needs: tuple[str, ...], reader: Callable[[Any], dict[str, object]], every: int = 1):
            if all(getattr(lib, attr, None) is not None for attr in needs):
                readers.append((key, every, reader))
            else:
                logger.debug("tuneup: NVML library lacks %s; %s not sampled", needs, key)

        def utilization(handle: Any) -> dict[str, object]:
            rates = lib.nvmlDeviceGetUtilizationRates(handle)
            return {"util_percent": int(rates.gpu), "mem_util_percent": int(rates.memory)}

        def memory(handle: Any) -> dict[str, object]:
            info = lib.nvmlDeviceGetMemoryInfo(handle)
            return {"mem_used_bytes": int(info.used), "mem_total_bytes": int(info.total)}

        def power(handle: Any) -> dict[str, object]:
            return {"power_w": int(lib.nvmlDeviceGetPowerUsage(handle)) / 1000.0}

        def energy(handle: Any) -> dict[str, object]:
            return {"energy_j": int(lib.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0}

        def sm_clock(handle: Any) -> dict[str, object]:
            return {"sm_clock_mhz": int(lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM))}

        def mem_clock(handle: Any) -> dict[str, object]:
            return {"mem_clock_mhz": int(lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_MEM))}

        def temperature(handle: Any) -> dict[str, object]:
            return {"temp_c": int(lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU))}

        def throttle(handle: Any) -> dict[str, object]:
            reasons = int(self._call_with_fallback(self._throttle_fns, handle))
            return {"throttle_reasons": reasons, "throttle": throttle_names(reasons)}

        def pcie_tx(handle: Any) -> dict[str, object]:
            kb_per_s = int(lib.nvmlDeviceGetPcieThroughput(handle, lib.NVML_PCIE_UTIL_TX_BYTES))
            return {"pcie_tx_bytes_per_s": kb_per_s * 1024}

        def pcie_rx(handle: Any) -> dict[str, object]:
            kb_per_s = int(lib.nvmlDeviceGetPcieThroughput(handle, lib.NVML_PCIE_UTIL_RX_BYTES))
            return {"pcie_rx_bytes_per_s": kb_per_s * 1024}

        def nvlink(handle: Any) -> dict[str, object]:
            return self._read_nvlink(handle)

        add("utilization", ("nvmlDeviceGetUtilizationRates",), utilization)
        add("memory", ("nvmlDeviceGetMemoryInfo",), memory)
        add("power", ("nvmlDeviceGetPowerUsage",), power)
        add("energy", ("nvmlDeviceGetTotalEnergyConsumption",), energy)
        add("sm_clock", ("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"), sm_clock)
        add("mem_clock", ("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"), mem_clock)
        add("temperature", ("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"), temperature)
        if self._throttle_fns:
            readers.append(("throttle", 1, throttle))
        pcie_needs = ("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES")
        add("pcie_tx", pcie_needs, pcie_tx, self._pcie_every_n)
        add("pcie_rx", pcie_needs, pcie_rx, self._pcie_every_n)
        nvlink_needs = (
            "nvmlDeviceGetFieldValues",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
        )
        add("nvlink", nvlink_needs, nvlink)
        return readers

    def _call_with_fallback(self, fns: list[Callable[..., Any]], *args: Any) -> Any:
        while True:
            if not fns:
                raise self._error_type(self._not_supported)
            try:
                return fns[0](*args)
            except self._error_type as error:
                if _error_code(error) != self._function_not_found or len(fns) == 1:
                    raise
                # The driver predates this symbol; every device shares the driver, so forget it for all.
                fns.pop(0)

    def _read_nvlink(self, handle: Any) -> dict[str, object]:
        lib = self._lib
        wanted = (
            ("nvlink_tx_bytes", lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
            ("nvlink_rx_bytes", lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
        )
        values = lib.nvmlDeviceGetFieldValues(handle, [(field_id, _ALL_NVLINKS) for _, field_id in wanted])
        success = getattr(lib, "NVML_SUCCESS", 0)
        result: dict[str, object] = {}
        failure = None
        for (key, _), value in zip(wanted, values, strict=True):
            status = int(value.nvmlReturn)
            if status != success:
                failure = status
                continue
            result[key] = int(_field_value(lib, value)) * 1024  # KiB counters
        if not result and failure is not None:
            # Per-entry failures come back inside a successful call; raise them so the usual handling
            # (unsupported: never ask again; anything else: warn once) applies.
            raise self._error_type(failure)
        return result

    def _handle(self, index: int) -> Any | None:
        handle = self._handles.get(index)
        if handle is not None:
            return handle
        try:
            handle = self._lib.nvmlDeviceGetHandleByIndex(index)
        except Exception as error:
            if _error_code(error) == self._gpu_is_lost:
                self._mark_lost(index, error)
            else:
                warn_once(
                    f"nvml:{self.name}:gpu{index}:handle",
                    f"NVML cannot open GPU {index} ({error}); it is left out of telemetry while this lasts",
                )
            return None
        self._handles[index] = handle
        bus_id = self._read_bus_id(index, handle)
        if bus_id is not None:
            self._bus_ids[index] = bus_id
        return handle

    def _read_bus_id(self, index: int, handle: Any) -> str | None:
        try:
            return _text(self._call_with_fallback(self._pci_fns, handle).busId)
        except Exception as error:
            if _error_code(error) not in (self._not_supported, self._function_not_found):
                warn_once(
                    f"nvml:{self.name}:gpu{index}:bus_id",
                    f"NVML cannot read GPU {index}'s PCI bus id ({error})",
                )
            return None

    def _mark_lost(self, index: int, error: BaseException) -> None:
        self._lost.add(index)
        self._handles.pop(index, None)
        warn_once(
            f"nvml:{self.name}:gpu{index}:lost",
            f"GPU {index} ({self._bus_ids.get(index, 'unknown bus id')}) is lost ({error}); "
            "its telemetry stops, the other GPUs continue",
        )

    def _identity(self, index: int) -> dict[str, object]:
        gpu: dict[str, object] = {"index": index}
        if index in self._bus_ids:
            gpu["bus_id"] = self._bus_ids[index]
        return gpu

    def sample(self) -> list[dict[str, object]] | None:
        if self._closed:
            return None
        tick = self._tick
        self._tick += 1
        gpus: list[dict[str, object]] = []
        for index in range(self._device_count):
            # A lost GPU needs a reset that this process will not see; asking it again only costs time.
            handle = None if index in self._lost else self._handle(index)
            if handle is not None:
                gpus.append(self._sample_device(index, handle, tick))
            elif index in self._lost:
                gpus.append({**self._identity(index), "lost": True})
        return gpus or None

    def _sample_device(self, index: int, handle: Any, tick: int) -> dict[str, object]:
        gpu = self._identity(index)
        for key, every_n, reader in self._fields:
            if tick % every_n or (index, key) in self._unsupported:
                continue
            try:
                gpu.update(reader(handle))
            except Exception as error:
                code = _error_code(error) if isinstance(error, self._error_type) else None
                if code in (self._not_supported, self._function_not_found):
                    self._unsupported.add((index, key))
                    logger.debug("tuneup: GPU %d does not support %s; not asked again", index, key)
                elif code == self._gpu_is_lost:
                    self._mark_lost(index, error)
                    return {**self._identity(index), "lost": True}
                else:
                    warn_once(
                        f"nvml:{self.name}:gpu{index}:{key}",
                        f"NVML cannot read {key} of GPU {index} ({error}); omitted while this lasts",
                    )
        return gpu

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
        _shutdown(self._lib)


def _field_value(lib: Any, value: Any) -> float | int:
    # The union member to read depends on valueType; NVLink counters are unsigned long long in practice.
    members = {
        getattr(lib, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(lib, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(lib, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }
    return getattr(value.value, members.get(int(value.valueType), "ullVal"))


def gpu_inventory(lib: Any = None) -> dict[str, object] | None:
    """What the run manifest records about the node's GPUs; None when NVML is unavailable.

    Initializes and shuts down NVML itself (balanced, so a `lib` already in use by a sensor stays usable).
    Values NVML cannot give are None.
    """
    loaded = load_nvml(lib)
    if loaded is None:
        return None
    try:
        return _inventory(loaded)
    except Exception as error:  # the manifest must not fail the run
        warn_once("nvml:inventory", f"GPU inventory failed ({error}); the run manifest will lack it")
        return None
    finally:
        _shutdown(loaded)


def _links(lib: Any, handle: Any, ask: Callable[[str, Callable[[], Any]], Any]) -> dict[str, int | None]:
    """What the GPU's links can carry, for comparing measured collective bandwidth with the link's.

    The maximum PCIe generation and width, not the current ones: an idle GPU drops its link to Gen1.
    `nvml_nvlink_version` is NVML's raw nvmlNvlinkVersion_t (6 is NVLink 4, on an H100 or H200), kept
    raw so that the analysis maps it once (tuneup.catalog.interconnects).
    """
    gen = ask("PCIe generation", lambda: lib.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    width = ask("PCIe width", lambda: lib.nvmlDeviceGetMaxPcieLinkWidth(handle))
    active: list[int] = []
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
        state = ask("NVLink state", lambda n=link: lib.nvmlDeviceGetNvLinkState(handle, n))
        if state is None:
            break  # NVLink absent (PCIe GPU) or the query unsupported: stop asking
        if int(state) == int(getattr(lib, "NVML_FEATURE_ENABLED", 1)):
            active.append(link)
    version = (
        ask("NVLink version", lambda: lib.nvmlDeviceGetNvLinkVersion(handle, active[0])) if active else None
    )
    return {
        "pcie_max_gen": int(gen) if gen is not None else None,
        "pcie_max_width": int(width) if width is not None else None,
        "nvlink_links_active": len(active) if active else None,
        "nvml_nvlink_version": int(version) if version is not None else None,
    }


def _inventory(lib: Any) -> dict[str, object]:
    def ask(what: str, call: Callable[[], Any]) -> Any | None:
        try:
            return call()
        except Exception as error:
            logger.debug("tuneup: NVML inventory: %s unavailable (%s)", what, error)
            return None

    driver = ask("driver version", lib.nvmlSystemGetDriverVersion)
    cuda = ask("CUDA driver version", lib.nvmlSystemGetCudaDriverVersion)
    pci_fns = _first_available(lib, ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"))
    gpus: list[dict[str, object]] = []
    for index in range(int(lib.nvmlDeviceGetCount())):
        handle = ask(f"GPU {index} handle", lambda i=index: lib.nvmlDeviceGetHandleByIndex(i))
        if handle is None:
            continue
        name = ask(f"GPU {index} name", lambda h=handle: lib.nvmlDeviceGetName(h))
        uuid = ask(f"GPU {index} uuid", lambda h=handle: lib.nvmlDeviceGetUUID(h))
        pci = None
        for fn in pci_fns:
            pci = ask(f"GPU {index} PCI info", lambda h=handle, f=fn: f(h))
            if pci is not None:
                break
        memory = ask(f"GPU {index} memory", lambda h=handle: lib.nvmlDeviceGetMemoryInfo(h))
        device_id = int(pci.pciDeviceId) if pci is not None else None
        links = _links(lib, handle, ask)
        gpus.append(
            {
                "index": index,
                "name": _text(name) if name is not None else None,
                "uuid": _text(uuid) if uuid is not None else None,
                "pci_bus_id": _text(pci.busId) if pci is not None else None,
                # pciDeviceId packs the device id in the high 16 bits and the vendor (0x10de) in the low.
                "pci_device_id": f"0x{device_id:08x}" if device_id is not None else None,
                "pci_device": f"0x{device_id >> 16:04x}" if device_id is not None else None,
                "memory_total_bytes": int(memory.total) if memory is not None else None,
                **links,
            }
        )
    return {
        "driver_version": _text(driver) if driver is not None else None,
        "cuda_driver_version": _cuda_version_text(int(cuda)) if cuda is not None else None,
        "gpus": gpus,
    }
