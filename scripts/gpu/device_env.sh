# Sourced by the scripts of scripts/gpu/ on the GPU machine: the repository root as the current
# folder, $OUT made, the packed libraries (.device/lib, ../shared/device/pack) on the library
# path, NVLink multicast off (as the lent machines require), and the packed perseusrun and
# libperseus where the scripts look for them (build/...). Sets `run` to perseusrun's path.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
if [ -d .device/bin ]; then
  mkdir -p build/apps/perseusrun build/lib/comm
  [ -x build/apps/perseusrun/perseusrun ] || cp .device/bin/perseusrun build/apps/perseusrun/
  [ -e build/lib/comm/libperseus.so ] || cp .device/lib/libperseus.so build/lib/comm/
fi
run=build/apps/perseusrun/perseusrun
