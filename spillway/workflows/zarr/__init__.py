"""How Zarr v3 arrays are read into chunks and written from them: the one place that
chooses between the GPU path and the CPU path.

Used by workflow inputs (``--param input=PATH``, :mod:`..inputs`), array outputs
(``--output PATH``, :mod:`..outputs`) and ``cluster.open(...)`` / ``JobResult.array``
(:func:`spillway.workflows.outputs.open_output`).

**What spillway writes.** Chunks uncompressed: no compressor and no filter, only Zarr's
``bytes`` codec (little-endian), one file per chunk (default chunk key encoding
``c/i/j``), Zarr v3, zarr's default fill value (0), and, as zarr does by default, no
file for a chunk that holds only the fill value. CPU workers and GPU workers write the
same bytes, so a store does not say which kind of worker wrote it. Uncompressed chunks
are the fastest case for GPUs: a chunk file holds the chunk's bytes as they lie in
device memory, so it moves between the file and the GPU with no decode at all. Numerical
results of simulations (floats) hardly compress with zstd anyway.

**The CPU path** (NumPy chunks) is plain zarr and dask: ``da.from_zarr`` to read,
``da.to_zarr`` to write.

**The GPU path** (CuPy chunks) works per stored chunk, inside the task on the GPU worker
that holds or wants it, so nothing passes through the client:

* *read*, a chunk whose codecs are the ``bytes`` codec alone (what spillway writes): the
  whole chunk file is read with KvikIO straight into a device buffer (GPUDirect Storage
  where the system has it, else KvikIO's POSIX compat mode, reading through pinned
  bounce buffers with its thread pool), and viewed as the chunk: no host copy of the data
  in Python, no decode;
* *read*, a shard (zarr's ``sharding_indexed`` codec, index at either end with zarr's
  default index codecs) of inner chunks that are ``bytes`` or ``bytes`` + ``zstd``: the
  shard file is read with KvikIO into device memory, its index (a few KB) on the host,
  and all its zstd frames are decoded in **one** nvCOMP batch (``nvidia.nvcomp``) straight
  into the chunk. nvCOMP decodes each zstd frame on a small part of the GPU, so its rate
  comes from decoding many frames at once: a shard of hundreds of small inner chunks
  keeps the whole GPU busy;
* *read*, ``bytes`` + ``zstd`` without sharding (zarr's and xarray's default compressor,
  without checksum): one zstd frame per chunk. One frame decodes on nvCOMP at about
  0.1 GB/s (measured on an H100: 32 frames of 8 MiB, one at a time), slower than one host
  core, and no decoder splits one frame over threads, so such chunks are read and decoded
  on the host, **many at once**, in a pool of threads per worker (:mod:`.host_decode`:
  the read task secedes while it waits, so the worker starts its next chunk reads). Each
  chunk is decoded while its file is read, in pieces (:mod:`.stream_decode`,
  python-zstandard), every piece copied to the device as soon as it is decoded from one
  of two small reused staging buffers (slices of the tiered store's pinned arena while it
  has room), so the read, the decode and the copy of a chunk overlap (without
  python-zstandard: read whole, decoded whole by numcodecs, then copied); stores written sharded
  (``shards=`` in zarr, ``"shards"`` in an xarray encoding) with small inner chunks
  decode on the GPU instead;
* *read*, any other codec chain (blosc, gzip, big-endian, transpose, a checksum, ...):
  zarr decodes it with its CPU codecs into host memory and the chunk is copied to the
  device once;
* *write*: with KvikIO, the chunk's device bytes go straight to its file (edge chunks
  padded with the fill value, as zarr pads them; fill-only chunks skipped, as zarr skips
  them); without KvikIO, the chunk is copied to the host and zarr writes it. Whether a
  block is on the device is decided by the block itself, not by the dask array's
  ``meta`` (which says NumPy for many graphs that make CuPy chunks).

A user's own ``da.to_zarr`` / ``xarray.to_zarr`` of CuPy chunks goes through zarr; on GPU
workers zarr copies device chunks to the host as it takes them in (:mod:`spillway.memory.zarr_buffer`).

Whichever way a chunk goes, its values are the same bit for bit: uncompressed bytes are
the array's bytes, and zstd is lossless. Where KvikIO or nvCOMP is missing, or a chunk
file is not what the metadata says, the task falls back to zarr on the host and logs it
once per worker.

KvikIO and CuPy are imported only inside tasks that run on GPU workers; a CPU install
never imports them.

**The modules**, one concern each:

* :mod:`.chunk_files`: where an array's chunk files lie and how they are encoded
  (:class:`ChunkFiles`, from the array's metadata);
* :mod:`.read`: a lazy dask array over a stored array, and the task that reads a chunk;
* :mod:`.write`: a lazy dask collection that writes an array, and the task that writes a chunk;
* :mod:`.shards`: a shard's index and its inner chunks;
* :mod:`.zstd`: the checks of zstd frame headers made before nvCOMP sees the frames;
* :mod:`.host_io` and :mod:`.device_io`: whole chunk files between a file and host memory,
  or device memory (KvikIO; zstd decoded by nvCOMP); :mod:`.device_io` also says what a
  worker reads with, and closes nvCOMP's codecs before their streams;
* :mod:`.host_decode`: the pool that reads and decodes default-store chunks on the host,
  many at once, and its decode buffers; :mod:`.stream_decode`: one chunk's frame decoded
  while read, piece by piece;
* :mod:`.fallback` and :mod:`.counters`: the fallbacks to zarr (logged once per worker),
  and the zstd bytes each process decoded, on the GPU and on the host;
* :mod:`spillway.memory.zarr_buffer`: the host buffer that lets zarr take device chunks.

(The package is imported as ``spillway.workflows.zarr``; inside it, ``import zarr`` is
the zarr library, imports being absolute.)
"""

from .chunk_files import ChunkFiles, chunk_files_of
from .decoded import decode_counters
from .device_io import describe
from .read import open_array
from .write import store

__all__ = ["ChunkFiles", "chunk_files_of", "decode_counters", "describe", "open_array", "store"]
