"""Out-of-core memory on GPU workers: a device -> pinned host -> disk store, spill on
demand when an allocation fails, and admission of workflows by projected footprint."""
