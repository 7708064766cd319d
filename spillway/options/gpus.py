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
    #: NVLink links to each other GPU, by that GPU's index, counted as ``nvidia-smi topo -m``
    #: counts them: direct links, plus the links through an NVSwitch to every GPU the
    #: switch reaches (on an NVSwitch host every pair shows the GPU's own link count)
    nvlinks: dict[int, int] = field(default_factory=dict)
    #: this GPU's active links that end at an NVSwitch (0 where the GPUs link directly)
    nvswitch_links: int = 0

    def links_json(self) -> dict:
        """The topology as ``spillway info`` and the bench's machine description record it."""
        return {"nvlinks": {str(k): v for k, v in self.nvlinks.items()}, "nvswitch_links": self.nvswitch_links}


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
    links = _topology(pynvml, handles, bus_ids)
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
                nvlinks=links[index][0],
                nvswitch_links=links[index][1],
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


def _topology(pynvml, handles: list, bus_ids: list[str]) -> list[tuple[dict[int, int], int]]:
    """Per GPU: NVLink links to each other GPU, and its links that end at an NVSwitch.

    A pair that both reach through NVSwitches (and that NVML reports NVLink peer access
    between) is credited the smaller of their switch link counts: what ``nvidia-smi topo
    -m`` prints (NV18 between every pair of an HGX H100/H200 board), since a transfer
    between them is bounded by the GPU with fewer links to the switch."""
    direct, switch = [], []
    for handle in handles:
        links, through_switch = _nvlinks(pynvml, handle, bus_ids, handles)
        direct.append(links)
        switch.append(through_switch)
    out = []
    for i, a in enumerate(handles):
        links = dict(direct[i])
        for j, b in enumerate(handles):
            if j == i or not switch[i] or not switch[j] or _p2p_nvlink(pynvml, a, b) is False:
                continue
            links[j] = links.get(j, 0) + min(switch[i], switch[j])
        out.append((links, switch[i]))
    return out


def _nvlinks(pynvml, handle, bus_ids: list[str], handles: list) -> tuple[dict[int, int], int]:
    """Active NVLink links from ``handle`` straight to each other GPU, by that GPU's index,
    and the number of its active links that end at an NVSwitch."""
    links: dict[int, int] = {}
    switch = unmatched = untyped = 0
    remote_info = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or getattr(
        pynvml, "nvmlDeviceGetNvLinkRemotePciInfo"
    )
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:
            continue
        kind = _remote_type(pynvml, handle, link)
        if kind is not None and kind == getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
            switch += 1
            continue
        try:
            remote = _text(remote_info(handle, link).busId).lower()
        except pynvml.NVMLError:
            remote = ""
        # NVML pads the domain differently across calls: compare the bus:device.function tail
        peer = next((j for j, bus in enumerate(bus_ids) if remote and bus[-12:] == remote[-12:]), None)
        if peer is not None:
            links[peer] = links.get(peer, 0) + 1
        else:
            unmatched += 1
            untyped += kind is None
    if unmatched:
        # In virtual machines the remote PCI address is the host's, not the guest's; then
        # links go to the one peer that NVML reports as NVLink-reachable, when there is one.
        # Where several are and NVML could not name the far end's type, the links end at a
        # switch (a GPU's links cannot each reach several GPUs directly).
        peers = [j for j, other in enumerate(handles) if other is not handle and _p2p_nvlink(pynvml, handle, other)]
        if len(peers) == 1:
            links[peers[0]] = links.get(peers[0], 0) + unmatched
        elif len(peers) > 1:
            switch += untyped
    return links, switch


def _remote_type(pynvml, handle, link: int) -> int | None:
    """The NVML device type at the far end of ``link`` (GPU, switch...); None where NVML
    cannot say (older drivers and bindings)."""
    get = getattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    if get is None:
        return None
    try:
        kind = get(handle, link)
    except pynvml.NVMLError:
        return None
    return None if kind == getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_UNKNOWN", 0xFF) else kind


def _p2p_nvlink(pynvml, a, b) -> bool | None:
    """Whether NVML reports NVLink peer access from ``a`` to ``b``; None where it cannot say."""
    try:
        status = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    except (pynvml.NVMLError, AttributeError):
        return None
    return status == pynvml.NVML_P2P_STATUS_OK


def topology_lines(gpus: list[dict]) -> list[str]:
    """The NVLink matrix of ``spillway info`` and the bench's machine description, from
    :meth:`~spillway.options.gpus.GPU.links_json` records: NV<links> per pair as ``nvidia-smi topo
    -m`` prints it (through an NVSwitch, every pair shows the GPU's links to the switch)."""
    if len(gpus) < 2:
        return []
    switched = [g.get("nvswitch_links", 0) for g in gpus]
    head = "NVLink links (rows to columns"
    if all(switched):
        head += f", through NVSwitch: {_counts(switched)} links per GPU to the switch"
    elif any(switched):
        head += ", some through NVSwitch"
    lines = [head + "):", "       " + "".join(f"GPU{g['index']:<4}" for g in gpus)]
    for g in gpus:
        cells = ["  -    " if h["index"] == g["index"] else f"NV{g['nvlinks'].get(str(h['index']), 0):<5}"
                 for h in gpus]
        lines.append(f"GPU{g['index']:<4}" + "".join(cells))
    return lines


def _counts(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else "/".join(map(str, values))
