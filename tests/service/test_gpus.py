"""GPU discovery logic against a stand-in NVML module (the real one needs a driver)."""

from __future__ import annotations

from types import SimpleNamespace

from service import gpus


class FakeNVML:
    """Two GPUs with 18 links between them; remote PCI addresses as a VM reports them."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    class NVMLError(Exception):
        pass

    def __init__(self, remote_bus):
        self.remote_bus = remote_bus

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h[1]:04d}"

    def nvmlDeviceGetName(self, h):
        return b"Test GPU"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:00:0{6 + h[1]}.0".encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=141 * 10**9, free=140 * 10**9)

    def nvmlDeviceGetNvLinkState(self, h, link):
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.remote_bus(h[1]).encode())

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return 0

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000


def test_links_matched_by_remote_bus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = gpus._read(FakeNVML(lambda i: f"0000:00:0{7 - i}.0"))
    assert [g.nvlinks for g in inv.gpus] == [{1: 18}, {0: 18}]
    assert inv.cuda_driver_version == "13.0" and inv.gpus[1].name == "Test GPU"


def test_links_attributed_to_the_one_nvlink_peer_in_a_vm(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = gpus._read(FakeNVML(lambda i: "0000:c5:00.0"))  # host addresses unknown to the guest
    assert [g.nvlinks for g in inv.gpus] == [{1: 18}, {0: 18}]


def test_cuda_visible_devices_order(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    inv = gpus._read(FakeNVML(lambda i: f"0000:00:0{7 - i}.0"))
    assert [g.uuid for g in inv.gpus] == ["GPU-0001", "GPU-0000"]
    assert inv.find("GPU-0001").index == 0 and inv.find(1).uuid == "GPU-0000"


def test_no_nvml_means_no_gpu_with_reason():
    inv = gpus.discover()
    if not len(inv):
        assert inv.reason
