"""GPU discovery logic against a stand-in NVML module (the real one needs a driver)."""

from __future__ import annotations

from types import SimpleNamespace

from spillway.options import gpus


class FakeNVML:
    """Two GPUs with 18 links between them; remote PCI addresses as a VM reports them."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    class NVMLError(Exception):
        pass

    def __init__(self, remote_bus, count=2):
        self.remote_bus = remote_bus
        self.count = count

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h[1]:04d}"

    def nvmlDeviceGetName(self, h):
        return b"Test GPU"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:00:{6 + h[1]:02x}.0".encode())

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


#: where every link of an HGX board's GPUs ends: an NVSwitch, not another GPU
SWITCH_BUS = "00000000:c4:00.0"


class FakeSwitchNVML(FakeNVML):
    """An NVSwitch host: each GPU's 18 links end at the switch; NVML names the far end a
    switch and reports NVLink peer access between every pair (``p2p``, by index pair,
    overrides that, as for GPUs in separate fabric partitions)."""

    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_P2P_STATUS_NOT_SUPPORTED = 5

    def __init__(self, count=4, p2p=None):
        super().__init__(lambda i: SWITCH_BUS, count=count)
        self.p2p = p2p or {}

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        ok = self.p2p.get((a[1], b[1]), True)
        return self.NVML_P2P_STATUS_OK if ok else self.NVML_P2P_STATUS_NOT_SUPPORTED


class FakeSwitchNoTypeNVML(FakeSwitchNVML):
    """The same host through bindings or a driver that cannot name the far end's type."""

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        raise self.NVMLError("Not Supported")


def _pairs(n, links):
    return [{j: links for j in range(n) if j != i} for i in range(n)]


def test_nvswitch_links_count_for_every_pair_as_nvidia_smi_topo(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = gpus._read(FakeSwitchNVML(count=4))
    assert [g.nvlinks for g in inv.gpus] == _pairs(4, 18)
    assert [g.nvswitch_links for g in inv.gpus] == [18] * 4
    assert inv.gpus[2].links_json() == {"nvlinks": {"0": 18, "1": 18, "3": 18}, "nvswitch_links": 18}


def test_nvswitch_without_the_remote_type_falls_back_to_peer_access(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = gpus._read(FakeSwitchNoTypeNVML(count=4))
    assert [g.nvlinks for g in inv.gpus] == _pairs(4, 18)


def test_nvswitch_pairs_without_peer_access_get_no_links(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # two fabric partitions: {0, 1} and {2, 3}
    apart = {(a, b): False for a in range(4) for b in range(4) if (a < 2) != (b < 2)}
    inv = gpus._read(FakeSwitchNVML(count=4, p2p=apart))
    assert [g.nvlinks for g in inv.gpus] == [{1: 18}, {0: 18}, {3: 18}, {2: 18}]


def test_nvswitch_on_a_subset_of_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    inv = gpus._read(FakeSwitchNVML(count=8))
    assert [g.nvlinks for g in inv.gpus] == [{1: 18}, {0: 18}]


def test_direct_links_record_no_switch(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = gpus._read(FakeNVML(lambda i: f"0000:00:0{7 - i}.0"))
    assert [g.nvswitch_links for g in inv.gpus] == [0, 0]
