"""GPU discovery through NVML.

NVML reads the driver's view of the GPUs without creating a CUDA context, so the CLI
process, the scheduler and the HTTP service never take GPU memory by looking.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    pci_bus_id: str
    #: NVLink link count to each other GPU, by that GPU's index
    nvlinks: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPU, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    #: why no GPU was found, when none was
    reason: str | None = None

    def __len__(self):
        return len(self.gpus)

    def find(self, device: int | str) -> GPU | None:
        for gpu in self.gpus:
            if device == gpu.index or device == gpu.uuid:
                return gpu
        if isinstance(device, str):  # a unique UUID prefix, as nvidia-smi accepts
            matches = [g for g in self.gpus if g.uuid.startswith(device)]
            if len(matches) == 1:
                return matches[0]
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover() -> Inventory:
    """The GPUs visible to this process (honouring ``CUDA_VISIBLE_DEVICES``)."""
    try:
        import pynvml
    except ImportError:
        return Inventory(reason="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return Inventory(reason=f"NVML unavailable ({e})")
    try:
        return _read(pynvml)
    finally:
        pynvml.nvmlShutdown()


def _visible(pynvml) -> list[int]:
    """NVML indices in CUDA_VISIBLE_DEVICES order; NVML itself ignores the variable."""
    import os

    count = pynvml.nvmlDeviceGetCount()
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    uuids = [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item.isdigit():
            if int(item) >= count:
                break  # CUDA stops at the first invalid entry
            out.append(int(item))
        else:
            hits = [i for i, u in enumerate(uuids) if u.startswith(item)]
            if len(hits) != 1:
                break
            out.append(hits[0])
    return out


def _read(pynvml) -> Inventory:
    visible = _visible(pynvml)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in visible]
    bus_ids = [_text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    gpus = []
    for index, handle in enumerate(handles):
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(
            GPU(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total=int(mem.total),
                memory_free=int(mem.free),
                pci_bus_id=bus_ids[index],
                nvlinks=_nvlinks(pynvml, handle, bus_ids, handles),
            )
        )
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except pynvml.NVMLError:
        driver = cuda_text = None
    reason = None if gpus else "NVML found no GPU"
    return Inventory(tuple(gpus), driver, cuda_text, reason)


def _nvlinks(pynvml, handle, bus_ids: list[str], handles: list) -> dict[int, int]:
    """Active NVLink links from ``handle`` to each other GPU, by that GPU's index."""
    links: dict[int, int] = {}
    active = 0
    remote_info = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or getattr(
        pynvml, "nvmlDeviceGetNvLinkRemotePciInfo"
    )
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:
            continue
        active += 1
        try:
            remote = _text(remote_info(handle, link).busId).lower()
        except pynvml.NVMLError:
            continue
        # NVML pads the domain differently across calls: compare the bus:device.function tail
        for peer, bus in enumerate(bus_ids):
            if bus[-12:] == remote[-12:]:
                links[peer] = links.get(peer, 0) + 1
    unmatched = active - sum(links.values())
    if unmatched:
        # In virtual machines the remote PCI address is the host's, not the guest's; then
        # links go to the one peer that NVML reports as NVLink-reachable, when there is one.
        peers = [j for j, other in enumerate(handles) if other is not handle and _p2p_nvlink(pynvml, handle, other)]
        if len(peers) == 1:
            links[peers[0]] = links.get(peers[0], 0) + unmatched
    return links


def _p2p_nvlink(pynvml, a, b) -> bool:
    try:
        status = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    except (pynvml.NVMLError, AttributeError):
        return False
    return status == pynvml.NVML_P2P_STATUS_OK
