"""A fake NVML library for tests: pynvml's names, deterministic values for N fake GPUs, injectable errors.

Errors are the real `pynvml.NVMLError` subclasses and structs are pynvml's own ctypes structures, so the
production code's handling of NVML is what runs. Every call is counted in `calls`, by function name and
by (function name, device index), so a test can check what was asked and how often.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import pynvml

MIB = 1024 * 1024
GIB = 1024 * MIB
H200_PCI_DEVICE_ID = 0x233510DE  # device 0x2335, vendor 0x10de (NVIDIA)


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """Behaves like the `pynvml` module for the functions tuneup uses.

    Default values, for GPU i: utilization 50+i % (memory 20+i %), memory used (10+i) GiB of 141 GiB,
    power 250000+1000*i mW, energy 123456789+1000*i mJ, SM clock 1980 MHz, memory clock 2619 MHz,
    temperature 40+i C, throttle reasons 0x5 (gpu_idle | sw_power_cap) on GPU 0 and 0 elsewhere,
    PCIe TX 1000*(i+1) KB/s and RX 2000*(i+1) KB/s, NVLink TX 10000*(i+1) KiB and RX 20000*(i+1) KiB.
    Change the lists (`power_mw[1] = ...`) to test other values.

    Knobs:
      init_error: an NVML error code that nvmlInit raises.
      unsupported: function names, or (function name, device index) pairs, that raise NOT_SUPPORTED.
      errors: {function name or (function name, device index): NVML error code} for any other error.
      function_not_found: function names whose driver symbol is "missing" (FUNCTION_NOT_FOUND), as when
        pynvml is newer than the driver.
      handle_errors: {device index: NVML error code} raised by nvmlDeviceGetHandleByIndex.
      nvlink_supported: False makes the NVLink field values come back NOT_SUPPORTED per entry.
      bytes_strings: True returns names and versions as bytes, as old pynvml releases did.
      lose(index): from then on every call for that device raises GPU_IS_LOST.
    """

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpu_count: int = 2,
        *,
        init_error: int | None = None,
        unsupported: Iterable[str | tuple[str, int]] = (),
        errors: dict[str | tuple[str, int], int] | None = None,
        function_not_found: Iterable[str] = (),
        handle_errors: dict[int, int] | None = None,
        nvlink_supported: bool = True,
        bytes_strings: bool = False,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
    ) -> None:
        self.gpu_count = gpu_count
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.errors = dict(errors or {})
        self.function_not_found = set(function_not_found)
        self.handle_errors = dict(handle_errors or {})
        self.nvlink_supported = nvlink_supported
        self.bytes_strings = bytes_strings
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.lost: set[int] = set()
        self.init_count = 0
        self.calls: Counter[str | tuple[str, int]] = Counter()

        n = range(gpu_count)
        self.util_gpu = [50 + i for i in n]
        self.util_memory = [20 + i for i in n]
        self.mem_total = [141 * GIB for _ in n]
        self.mem_used = [(10 + i) * GIB for i in n]
        self.power_mw = [250_000 + 1000 * i for i in n]
        self.energy_mj = [123_456_789 + 1000 * i for i in n]
        self.sm_clock_mhz = [1980 for _ in n]
        self.mem_clock_mhz = [2619 for _ in n]
        self.temp_c = [40 + i for i in n]
        self.throttle_reasons = [0x5 if i == 0 else 0 for i in n]
        self.pcie_tx_kb_s = [1000 * (i + 1) for i in n]
        self.pcie_rx_kb_s = [2000 * (i + 1) for i in n]
        self.nvlink_tx_kib = [10_000 * (i + 1) for i in n]
        self.nvlink_rx_kib = [20_000 * (i + 1) for i in n]

    def __getattr__(self, name: str) -> object:
        # The NVML_* constants (error codes, clock types, field ids) are pynvml's own.
        if name.startswith("NVML_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # ---- knobs used mid-run --------------------------------------------------------------------------

    def lose(self, index: int) -> None:
        self.lost.add(index)

    @property
    def initialized(self) -> bool:
        return self.init_count > 0

    # ---- plumbing --------------------------------------------------------------------------------------

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value

    def _system(self, function: str) -> None:
        self.calls[function] += 1
        if function in self.function_not_found:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if function in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if function in self.errors:
            raise pynvml.NVMLError(self.errors[function])

    def _device(self, function: str, handle: FakeHandle) -> int:
        index = handle.index
        self.calls[(function, index)] += 1
        self._system(function)
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if (function, index) in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if (function, index) in self.errors:
            raise pynvml.NVMLError(self.errors[(function, index)])
        return index

    # ---- system ----------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._system("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._system("nvmlSystemGetDriverVersion")
        return self._text(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return self.gpu_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self.calls[("nvmlDeviceGetHandleByIndex", index)] += 1
        self._system("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.gpu_count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if index in self.handle_errors:
            raise pynvml.NVMLError(self.handle_errors[index])
        return FakeHandle(index)

    # ---- device ----------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        self._device("nvmlDeviceGetName", handle)
        return self._text("NVIDIA H200")

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str | bytes:
        index = self._device("nvmlDeviceGetUUID", handle)
        return self._text(f"GPU-00000000-0000-0000-0000-{index:012d}")

    def _pci_info(self, function: str, handle: FakeHandle) -> pynvml.nvmlPciInfo_t:
        index = self._device(function, handle)
        info = pynvml.nvmlPciInfo_t()
        info.domain = 0
        info.bus = 0x19 + index
        info.device = 0
        info.pciDeviceId = H200_PCI_DEVICE_ID
        info.pciSubSystemId = 0x16F110DE
        info.busId = f"00000000:{0x19 + index:02X}:00.0".encode()  # a ctypes char array: bytes, always
        return info

    def nvmlDeviceGetPciInfo_v3(self, handle: FakeHandle) -> pynvml.nvmlPciInfo_t:
        return self._pci_info("nvmlDeviceGetPciInfo_v3", handle)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> pynvml.nvmlPciInfo_t:
        return self._pci_info("nvmlDeviceGetPciInfo", handle)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> pynvml.c_nvmlUtilization_t:
        index = self._device("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=self.util_gpu[index], memory=self.util_memory[index])

    # Links of an H200 SXM: PCIe Gen5 x16, 18 NVLink 4 links (NVML reports NVLink 4 as version 6).
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        self._device("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return 16

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        self._device("nvmlDeviceGetNvLinkState", handle)
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkVersion(self, handle: FakeHandle, link: int) -> int:
        self._device("nvmlDeviceGetNvLinkVersion", handle)
        return 6

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> pynvml.c_nvmlMemory_t:
        index = self._device("nvmlDeviceGetMemoryInfo", handle)
        total, used = self.mem_total[index], self.mem_used[index]
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self.power_mw[self._device("nvmlDeviceGetPowerUsage", handle)]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self.energy_mj[self._device("nvmlDeviceGetTotalEnergyConsumption", handle)]

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        index = self._device("nvmlDeviceGetClockInfo", handle)
        if clock_type == pynvml.NVML_CLOCK_SM:
            return self.sm_clock_mhz[index]
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return self.mem_clock_mhz[index]
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        index = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.temp_c[index]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self.throttle_reasons[self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self.throttle_reasons[self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)]

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        index = self._device("nvmlDeviceGetPcieThroughput", handle)
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return self.pcie_tx_kb_s[index]
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return self.pcie_rx_kb_s[index]
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list) -> object:
        index = self._device("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        known = {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: self.nvlink_tx_kib[index],
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: self.nvlink_rx_kib[index],
        }
        for slot, field in zip(values, field_ids, strict=True):
            field_id, scope_id = field if isinstance(field, tuple) else (field, 0)
            slot.fieldId = field_id
            slot.scopeId = scope_id
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            if field_id in known and self.nvlink_supported:
                slot.nvmlReturn = pynvml.NVML_SUCCESS
                slot.value.ullVal = known[field_id]
            else:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values
