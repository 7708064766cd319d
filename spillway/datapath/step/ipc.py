"""The CUDA IPC kind: a step writes its pieces straight into its peers' output chunks.

Between the workers of one host, a peer's device memory can be mapped into this process
(CUDA IPC: the two workers of one GPU, and GPUs joined by NVLink), so a step needs neither
a send buffer nor a message: one kernel cuts every piece of its inputs into the output
chunk where it lands, this worker's or a peer's. Each byte is read once and written once,
where the buffered kinds (:mod:`.ucx`, :mod:`.tcp`) read and write the bytes that cross
three times (cut into a buffer, moved, received). No intermediate buffer is allocated
either: a step holds its inputs and its outputs, nothing else.

A round (:func:`spillway.datapath.step.task`) allocates its outputs, publishes each one's
:class:`Exported` place (the IPC handle of the allocation it lies in, and its offset there)
through the scheduler, maps its peers' (:meth:`IpcTransport.open`), runs its one kernel,
waits for it, and says so through the scheduler; its outputs are whole once every step of
the round has said so. An allocation of a peer is mapped at its first use and kept mapped
for the worker's life (a pool's, one mapping a peer: CUDA maps the whole allocation, which
for a large pool takes seconds the first time, rapidsmpf#206).

Offered where this worker's device memory can be exported (RMM's pool or CUDA's own
allocations; not ``cudaMallocAsync`` pools nor managed memory), and chosen where every step
of an exchange is on one GPU (:func:`~.transport.chosen` compares the offers, each this
host and this GPU): the workers a GPU shares. Between GPUs the steps take UCXX, whose CUDA
IPC copies over NVLink ran on two-GPU hosts; this kind's kernels writing into a peer GPU
have not.
"""

from __future__ import annotations

import ctypes
import socket
import threading
from dataclasses import dataclass

from .transport import Transport, TransportError

#: cudaIpcMemLazyEnablePeerAccess: a peer GPU's memory is reached over NVLink or PCIe
LAZY_PEER_ACCESS = 1


@dataclass(frozen=True)
class Exported:
    """Where an output chunk lies, for a peer to map: the IPC handle of the device
    allocation it lies in (bytes), and its byte offset there."""

    handle: bytes
    offset: int


def gpu_identity(device: int) -> str:
    """This host and GPU ``device``, as peers compare them."""
    import cupy

    return f"{host_identity()}/{cupy.cuda.runtime.deviceGetPCIBusId(device)}"


def host_identity() -> str:
    """This host, as peers compare it: its name and this boot's id (two containers of one
    name on two machines are not one host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class IpcTransport(Transport):
    kind = "ipc"

    def __init__(self, gpu: bool):
        if not gpu:
            raise TransportError("CUDA IPC moves device buffers only")
        import cupy

        self._cupy = cupy
        self._device = cupy.cuda.runtime.getDevice()
        self._lock = threading.Lock()
        #: handle -> the base address of a peer's allocation, mapped here
        self._mapped: dict[bytes, int] = {}
        #: this worker's allocations: base address -> handle
        self._handles: dict[int, bytes] = {}
        self._identity = gpu_identity(self._device)
        probe = cupy.empty(1, dtype=cupy.uint8)
        self.export(probe)  # raises where this memory cannot be exported

    def address(self) -> str:
        return self._identity

    def export(self, array) -> Exported:
        """Where ``array`` (C-contiguous, on this worker's device) lies, for a peer."""
        pointer = array.data.ptr
        base, _ = _address_range(pointer)
        with self._lock:
            handle = self._handles.get(base)
        if handle is None:
            try:
                handle = bytes(self._cupy.cuda.runtime.ipcGetMemHandle(base))
            except Exception as e:  # noqa: BLE001 (one line: what the memory is not)
                raise TransportError(f"this worker's device memory cannot be exported over CUDA IPC "
                                     f"({type(e).__name__}: {e}); an async pool or managed memory cannot") from None
            with self._lock:
                self._handles[base] = handle
        return Exported(handle, pointer - base)

    def open(self, place: Exported, shape: tuple, dtype):
        """The peer's output chunk at ``place``, as a CuPy array of ``shape`` and ``dtype``
        over this process's mapping of its allocation."""
        cupy = self._cupy
        with self._lock:
            base = self._mapped.get(place.handle)
            if base is None:
                # two slots of one exchange on this worker (one rebound after a worker
                # left): its own allocation, which CUDA maps in no other process's way
                base = next((b for b, h in self._handles.items() if h == place.handle), None)
            if base is None:
                try:
                    base = cupy.cuda.runtime.ipcOpenMemHandle(place.handle, LAZY_PEER_ACCESS)
                except Exception as e:  # noqa: BLE001
                    raise TransportError(f"a peer's device memory cannot be mapped over CUDA IPC "
                                         f"({type(e).__name__}: {e})") from None
                self._mapped[place.handle] = base
        dtype = cupy.dtype(dtype)
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        memory = cupy.cuda.UnownedMemory(base + place.offset, nbytes, self, self._device)
        return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))

    def close(self) -> None:
        with self._lock:
            mapped = list(self._mapped.values())
            self._mapped.clear()
            self._handles.clear()
        for base in mapped:
            try:
                self._cupy.cuda.runtime.ipcCloseMemHandle(base)
            except Exception:  # noqa: BLE001 (a context already gone took the mapping with it)
                pass


_DRIVER = None


def _address_range(pointer: int) -> tuple[int, int]:
    """The base and size of the device allocation ``pointer`` lies in (the driver's
    ``cuMemGetAddressRange``: an IPC handle names a whole allocation, and a pool's blocks
    lie inside one)."""
    global _DRIVER
    if _DRIVER is None:
        driver = ctypes.CDLL("libcuda.so.1")
        function = driver.cuMemGetAddressRange_v2
        function.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        function.restype = ctypes.c_int
        _DRIVER = function
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = _DRIVER(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
    if status != 0:
        raise TransportError(f"cuMemGetAddressRange failed for a device pointer (CUresult {status})")
    return base.value, size.value
