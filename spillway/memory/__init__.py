"""Out-of-core memory on GPU workers: a device -> pinned host -> disk store, spill on
demand when an allocation fails, and admission of workflows by projected footprint.
The tiers below the device are written against one protocol (:mod:`.tier`: put, get,
delete, usage, limit, rate), so the store holds any stack of them, fastest first.
Beside the store: :mod:`.capacity`, the scheduler plugin that holds every graph any
client sends to the workers' tiers, and :mod:`.zarr_buffer`, the host buffer that lets
zarr take device chunks on GPU workers."""
