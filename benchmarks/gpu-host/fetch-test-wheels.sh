#!/usr/bin/env bash
# Wheels for running spillway's service, notebook and bench tests on the offline GPU host
# (Python 3.12, CUDA 13): the cluster stack of ../shared/gpu-host/fetch-wheels.sh without
# UCX (the working tree sent there must stay under 64 MiB and libucx alone is 42 MB), plus
# what the HTTP service and the notebooks import, and KvikIO, nvCOMP (GPU zstd decode; the
# libnvcomp wheel holds libnvcomp.so.6, without which `from nvidia import nvcomp` fails) and
# xarray for the Zarr GPU path and the climatology notebook. Versions are the ones CI installs.
#
#   usage: benchmarks/gpu-host/fetch-test-wheels.sh [DEST]   (DEST defaults to .whl-svc)
#
# On the host: `FORCE=1 bash DEST/install-wheels.sh DEST && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks`
# (FORCE: a warm machine that already installed the UCX set skips the install otherwise).
# Over TCP, or over UCX when the UCX set was installed first on the same warm machine.
# The UCX set (40 MiB) and the tree (21 MiB) leave no room for this set in the same call:
# BESIDE=.whl keeps only what .whl lacks and what the host image does not hold (12 MiB), to
# carry in the next call on the warm machine (the order of 2026-12-06: part 1 with `.whl`,
# then the notebooks, parts 2-4 with this set).
set -euo pipefail
dest=${1:-.whl-svc}
here=$(cd "$(dirname "$0")" && pwd)
shared=${SPILLWAY_GPU_HOST_DIR:-$here/../../../shared/gpu-host}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
EXTRA="zarr==3.4.2 numcodecs==0.17.1 donfig==0.8.1.post1 google-crc32c==1.9.0 msgspec" \
  bash "$shared/fetch-wheels.sh" "$tmp" >/dev/null
mkdir -p "$dest"
find "$tmp" -name '*.whl' ! -name 'libucx*' ! -name 'ucxx*' ! -name 'distributed_ucxx*' -exec cp {} "$dest/" \;
cp "$tmp/install-wheels.sh" "$dest/"
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_26_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
# cryptography: the service's TLS (distributed's Security.temporary); the image lacks it.
# dask-mpi: the MPI launcher's GPU test (it passed on 2026-12-06 with the host's /usr/bin/mpirun and
# mpi4py 4.1.2 with Open MPI 5.0.11 carried; with the image's own mpi4py it has not run)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$dest" \
  jsonschema jsonschema-specifications referencing rpds-py \
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.3 pydantic_core==2.50.4 anyio==4.16.0 \
  uvicorn==0.54.0 h11==0.16.0 SQLAlchemy==2.1.9 greenlet httpx==0.28.1 httpcore==1.0.9 certifi idna \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 prometheus_client==0.26.0 \
  opentelemetry-api importlib_metadata zipp \
  nbclient==0.11.0 nbformat==5.11.1 jupyter_client==8.10.0 jupyter_core==5.9.1 ipykernel==7.4.0 \
  traitlets==5.16.1 pyzmq==27.3.0 comm==0.2.3 debugpy==1.8.22 ipython==9.18.1 ipython_pygments_lexers==1.1.1 \
  matplotlib-inline==0.2.2 fastjsonschema==2.22.3 prompt_toolkit==3.0.53 Pygments==2.21.0 jedi==0.20.1 \
  parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 \
  pure_eval==0.2.4 wcwidth==0.9.4 ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17 \
  pytest-timeout decorator nest_asyncio platformdirs python-dateutil \
  cryptography cffi pycparser dask-mpi==2026.3.0 dask-jobqueue==0.9.0 \
  kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 nvidia-cufile==1.20.0.107 xarray==2026.9.0 \
  nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12
# nvCOMP's two wheels are 33 MiB of the 80: NVCOMP=0 leaves them out (47 MiB), for the calls
# that need no GPU zstd decode (the matrix, B4, B5, the service) and must stay under 64 MiB
if [ "${NVCOMP:-1}" = 0 ]; then
  rm -f "$dest"/nvidia_nvcomp_* "$dest"/nvidia_libnvcomp_*
fi
if [ -n "${BESIDE:-}" ]; then
  for w in "$BESIDE"/*.whl; do rm -f "$dest/$(basename "$w")"; done
  # held by the host image (device KINDS.md), or not imported by the tests run there
  for n in debugpy widgetsnbextension jupyterlab_widgets jedi parso pygments nvidia_cufile xarray httpx \
           httpcore h11 certifi idna prometheus_client python_dateutil zipp; do
    rm -f "$dest/$n"-*.whl
  done
fi
du -sh "$dest"
