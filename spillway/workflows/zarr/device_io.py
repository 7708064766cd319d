"""Whole chunk files between a file and device memory: KvikIO reads and writes them
(GPUDirect Storage where the system has it, else POSIX through pinned bounce buffers with
KvikIO's thread pool), and nvCOMP decodes their zstd frames on the GPU in one batch.
Also what a worker reads with (:func:`describe`), for ``spillway info`` and the bench.

KvikIO, CuPy and nvCOMP are imported only inside functions that run on GPU workers."""

from __future__ import annotations

import atexit
import gc
import importlib.util
import os
import threading
import time
import weakref

import numpy as np

from .counters import count
from .fallback import Fallback, note
from .zstd import HEAD_BYTES, check_zstd_headers

#: KvikIO threads per worker process where ``KVIKIO_NTHREADS`` does not say: KvikIO's
#: default is one thread, which leaves a page-cached read at the speed of one memcpy
IO_THREADS = 16
#: bytes per KvikIO task (``KVIKIO_TASK_SIZE`` overrides): large enough that a chunk of
#: hundreds of MB is a few dozen tasks, small enough to spread over the threads
IO_TASK_BYTES = 16 * 2**20


class KvikIO:
    """The direct path over device memory: KvikIO reads and writes whole chunk files
    between the file and CuPy buffers (GDS, or POSIX through pinned bounce buffers with
    KvikIO's thread pool); nvCOMP decodes zstd on the device.

    **Lifetimes** (nvCOMP crashed the process when they were left to the garbage
    collector: benchmarks/NOTES.md, "The house refactor on one H100"). The nvCOMP codec
    and the arrays it decodes from and into are given a CUDA stream by pointer, which
    nvCOMP borrows and does not keep alive, and they may touch it when they are
    destroyed (stream-ordered frees of their scratch). So this object owns the stream,
    and the order of destruction is explicit: the batch's nvCOMP arrays are released
    inside :meth:`decode_zstd`, after the stream has finished; :meth:`close` releases
    the codec, then the stream, while the CUDA context is alive. :func:`close_all` closes
    every reader of the process: the worker plugin's teardown calls it, and so does an
    exit handler (run before CUDA's own teardown at exit). No exception of a refused
    nvCOMP call is kept (a kept exception holds its frame, and with it the arrays and the
    codec, until a later garbage-collection pass)."""

    def __init__(self):
        import cupy
        import kvikio

        self.xp = cupy
        self.kvikio = kvikio
        self._zstd = None
        self._stream = None
        _opened.append(weakref.ref(self))
        _exit_handler()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Release the nvCOMP codec, then its stream (once the stream has finished)."""
        codec, stream = self._zstd, self._stream
        self._zstd = self._stream = None
        if stream is not None:
            stream.synchronize()
        if codec is not None:
            del codec
            gc.collect()  # anything of nvCOMP's still in a reference cycle goes before its stream
        del stream

    def empty(self, nbytes: int, pinned: bool = True):
        return self.xp.empty(nbytes, dtype=self.xp.uint8)

    def read(self, path: str, size: int):
        out = self.empty(size)
        with self.kvikio.CuFile(path, "r") as f:
            got = f.read(out)
        if got != size:
            raise Fallback(f"KvikIO read {got} of {size} bytes")
        return out

    def write(self, path: str, chunk) -> int:
        with self.kvikio.CuFile(path, "w") as f:
            return int(f.write(chunk.reshape(-1).view(self.xp.uint8)))

    def decode_zstd(self, frames, outs) -> None:
        """All ``frames`` (device views of zstd frames) decoded by nvCOMP in one batch into
        ``outs`` (device buffers of the decoded sizes): many frames at once is what keeps
        the GPU busy (package docstring). The frame headers are checked first: nvCOMP
        trusts its input, and a malformed frame can fail the CUDA context."""
        if not frames:
            return
        try:
            from nvidia import nvcomp
        except ImportError:
            raise Fallback("nvCOMP (nvidia-nvcomp) is not installed: zstd is decoded on the host") from None
        cupy = self.xp
        start = time.perf_counter()
        check_zstd_headers(self._heads(frames), [int(o.size) for o in outs])
        if self._zstd is None:
            # one codec per thread (nvCOMP's codecs are not thread-safe) on a stream of its own:
            # a stream pointer of 0 lets nvCOMP create an internal stream that synchronizing
            # the default stream would not wait for; a blocking stream orders after the
            # default stream's work (the fill of missing inner chunks) without a sync
            self._stream = cupy.cuda.Stream(non_blocking=False)
            self._zstd = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                      device_id=cupy.cuda.Device().id, cuda_stream=self._stream.ptr)
        ptr = self._stream.ptr
        failure = None
        src = got = None
        try:
            src = nvcomp.as_arrays(list(frames), cuda_stream=ptr)
            got = self._decode_into(nvcomp, src, outs, ptr)
        except Fallback as e:
            failure = str(e)
        except Exception as e:  # nvCOMP raises its own types for streams it cannot decode
            failure = f"nvCOMP could not decode it ({type(e).__name__}: {e})"
        finally:
            # the batch's arrays die here, after the stream has finished with them, not in
            # a later garbage-collection pass
            self._stream.synchronize()
            del src, got
        if failure is not None:
            raise Fallback(failure)
        count("gpu", sum(int(o.size) for o in outs), len(outs), time.perf_counter() - start)

    #: how this nvCOMP takes preallocated outputs, once found: "list" (CuPy arrays),
    #: "arrays" (its own BatchArray) or "copy" (it allocates; the results are copied)
    _out_form: str | None = None

    def _decode_into(self, nvcomp, src, outs, ptr):
        """Decode the batch ``src`` into ``outs``; returns nvCOMP's arrays of the batch (what
        it returned, and the outputs wrapped for it) for the caller to release once the
        stream has finished with them (nvCOMP queues the decode; its arrays must outlive it). nvCOMP's Python API documents ``out`` for the batch overload
        loosely; the forms are tried in order, once per process. A refused form leaves
        only its message (see the class docstring)."""
        forms = [KvikIO._out_form] if KvikIO._out_form else ["list", "arrays", "copy"]
        refused = None
        for form in forms:
            got = out_arrays = None
            try:
                if form == "list":
                    got = self._zstd.decode(src, out=list(outs))
                elif form == "arrays":
                    out_arrays = nvcomp.as_arrays(list(outs), cuda_stream=ptr)
                    got = self._zstd.decode(src, out=out_arrays)
                else:
                    got = self._zstd.decode(src)
                    for decoded, out in zip(got, outs):
                        flat = self.xp.asarray(decoded).view(self.xp.uint8).reshape(-1)
                        if flat.size != out.size:
                            raise Fallback(f"a zstd frame decoded to {flat.size} bytes, expected {out.size}")
                        out[...] = flat
            except Fallback:
                raise
            except Exception as e:  # this form refused (nvCOMP's own exception types): try the next
                refused = f"{type(e).__name__}: {e}"
                self._stream.synchronize()
                del got, out_arrays
                continue
            KvikIO._out_form = form
            kept = (got, out_arrays)  # released by the caller once the stream has finished
            for decoded, out in zip(got if form != "copy" and got is not None else (), outs):
                size = getattr(decoded, "buffer_size", None)
                if size is not None and int(size) != int(out.size):
                    raise Fallback(f"a zstd frame decoded to {size} bytes, expected {out.size}")
                where = getattr(decoded, "__cuda_array_interface__", {}).get("data", (out.data.ptr,))[0]
                if where != out.data.ptr:  # decoded elsewhere than asked: copied into place
                    out[...] = self.xp.asarray(decoded).view(self.xp.uint8).reshape(-1)
            return kept
        raise Fallback(f"nvCOMP refused every output form (last: {refused})")

    def _heads(self, frames) -> list[bytes]:
        """The first bytes of each frame (its header), in one copy to the host."""
        cupy = self.xp
        take = [min(HEAD_BYTES, int(f.size)) for f in frames]
        heads = cupy.asnumpy(cupy.concatenate([f[:k] for f, k in zip(frames, take)]))
        bounds = np.cumsum([0, *take])
        return [heads[bounds[i]:bounds[i + 1]].tobytes() for i in range(len(frames))]


#: every reader made in this process (weakly), for :func:`close_all`
_opened: list = []
_exit_registered = False


def _exit_handler() -> None:
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        # registered after CuPy's import, so it runs before CuPy's own exit handlers
        atexit.register(close_all)
        _close_on_teardown()


def _close_on_teardown() -> None:
    """Have the worker plugin's teardown run :func:`close_all` while the CUDA context is
    alive (the cluster knows no workflow: the module that makes the resources says so)."""
    from spillway.launch.plugins import on_teardown

    on_teardown(close_all)


def close_all() -> None:
    """Close every KvikIO reader of this process (their nvCOMP codecs and streams) and the
    host-decode pool: the worker's teardown and the exit handler."""
    from . import host_decode

    opened, _opened[:] = list(_opened), []
    for ref in opened:
        io = ref()
        if io is not None:
            try:
                io.close()
            except Exception:  # a context already gone: nothing more can be released
                pass
    host_decode.close()  # a closed reader makes its codec again if it is used after this


_local = threading.local()
_configured = threading.Lock()
_done: dict[str, bool] = {}


def kvikio_available() -> bool:
    """Whether KvikIO is installed here (no import)."""
    return importlib.util.find_spec("kvikio") is not None


def gpu_io() -> KvikIO:
    """This thread's KvikIO reader; KvikIO's thread pool is set up once per process."""
    io = getattr(_local, "io", None)
    if io is None:
        with _configured:
            if not _done.get("kvikio"):
                configure_kvikio()
                _done["kvikio"] = True
        io = _local.io = KvikIO()
    return io


def configure_kvikio() -> None:
    """KvikIO's thread pool and task size for whole-chunk reads, unless the ``KVIKIO_*``
    environment variables say otherwise."""
    import kvikio.defaults

    wanted = {}
    if "KVIKIO_NTHREADS" not in os.environ:
        wanted["num_threads"] = max(1, min(IO_THREADS, os.cpu_count() or 1))
    if "KVIKIO_TASK_SIZE" not in os.environ:
        wanted["task_size"] = IO_TASK_BYTES
    if not wanted:
        return
    if hasattr(kvikio.defaults, "set"):
        kvikio.defaults.set(wanted)
    else:  # KvikIO before 25.02
        if "num_threads" in wanted:
            kvikio.defaults.num_threads_reset(wanted["num_threads"])
        if "task_size" in wanted:
            kvikio.defaults.task_size_reset(wanted["task_size"])


def describe() -> dict:
    """What this process reads and writes Zarr chunks with on GPUs (run on a worker):
    KvikIO's version, whether it runs GDS or POSIX compat mode and with how many
    threads, whether nvCOMP decodes zstd, and in what pieces the host pool decodes
    default-store chunks while reading them (None: whole chunks, no python-zstandard)."""
    from .stream_decode import piece_bytes

    out = {"kvikio": None, "mode": "host codecs + copy to device", "threads": None, "nvcomp": _nvcomp_loads(),
           "zstd_stream_piece_bytes": piece_bytes() if importlib.util.find_spec("zstandard") else None}
    if not kvikio_available():
        return out
    try:
        import kvikio
        import kvikio.defaults

        gpu_io()
        out["kvikio"] = getattr(kvikio, "__version__", "installed")
        compat = kvikio.defaults.get("compat_mode") if hasattr(kvikio.defaults, "get") else \
            kvikio.defaults.compat_mode()
        compat = str(getattr(compat, "name", compat)).upper()
        threads = kvikio.defaults.get("num_threads") if hasattr(kvikio.defaults, "get") else \
            kvikio.defaults.get_num_threads()
        out["mode"] = {"ON": "KvikIO POSIX (compat mode)", "TRUE": "KvikIO POSIX (compat mode)",
                       "OFF": "KvikIO GDS", "FALSE": "KvikIO GDS"}.get(compat, "KvikIO (GDS where the file allows)")
        out["threads"] = int(threads)
    except Exception as e:  # a broken CUDA setup: say so rather than fail the caller
        out["mode"] = f"KvikIO unusable ({type(e).__name__}: {e})"
    return out


def _has_nvidia() -> bool:
    return importlib.util.find_spec("nvidia") is not None


def _nvcomp_loads() -> bool:
    """Whether nvCOMP imports here: its module is found and its library loads (without
    the ``nvidia-libnvcomp`` wheel the import fails on ``libnvcomp.so``)."""
    if not _has_nvidia() or importlib.util.find_spec("nvidia.nvcomp") is None:
        return False
    try:
        from nvidia import nvcomp  # noqa: F401
    except ImportError as e:
        note("no nvcomp", f"nvCOMP does not load ({e}): install spillway[cuda13] or [cuda12]")
        return False
    return True
