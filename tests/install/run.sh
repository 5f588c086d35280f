#!/usr/bin/env bash
# Perseus as installed software: `cmake --install` into a temporary prefix, `pip install .` into
# a fresh virtual environment, and the .deb installed with dpkg and removed again. Every check
# runs from a directory outside the checkout, with PYTHONPATH and PERSEUS_LIBRARY unset, so that
# only what was installed is used. Nothing stays installed: prefixes and venvs live in a mktemp
# folder, and the .deb is removed at exit even on failure.
#   tests/install/run.sh [cmake] [pip] [deb]      (all three when none is named)
# BUILD_DIR (build) is the configured release build to install from; the pip build keeps its
# CMake tree in $BUILD_DIR/wheel so that a second run is incremental. The pip build needs
# scikit-build-core: from $BUILD_DIR/wheelhouse when scripts/setup.sh put it there, else PyPI.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$root/${BUILD_DIR:-build}" && pwd)
python=/usr/bin/python3 # Debian's, which has torch (python3-torch)
parts=("$@")
((${#parts[@]})) || parts=(cmake pip deb)
tmp=$(mktemp -d)
passed=0 failed=0 deb_installed=0

cleanup() {
  ((deb_installed)) && dpkg -P perseus >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

check() { # check NAME COMMAND...: runs COMMAND, counts and reports it
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name"
    printf '%s\n' "$out" | tail -n 30 | sed 's/^/    /'
    return 1
  fi
}
# A command's output must match an extended regular expression N times (matches, not lines:
# mpirun may join two ranks' lines).
expect() { # expect REGEX N COMMAND...
  local regex=$1 n=$2 out
  shift 2
  out=$("$@" 2>&1) || { printf '%s\n' "$out"; return 1; }
  local got
  got=$(printf '%s\n' "$out" | grep -oE "$regex" | wc -l)
  [ "$got" = "$n" ] || { printf 'wanted %s lines matching %s, got %s:\n%s\n' "$n" "$regex" \
    "$got" "$out"; return 1; }
}
clean() { env -u PYTHONPATH -u PERSEUS_LIBRARY -u LD_LIBRARY_PATH "$@"; }
outside="$tmp/elsewhere"
mkdir -p "$outside"
version=$(sed -nE 's/^project\(perseus VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
code=$(echo "$version" | awk -F. '{print $1 * 10000 + $2 * 100 + $3}')

# The package's import, version and library, under a perseusrun: RUN_PY PERSEUSRUN PYTHON WHERE
# checks that both ranks load the libperseus inside the package found at WHERE.
ranks_use_installed() {
  local perseusrun=$1 py=$2 where=$3
  cd "$outside" && expect "^\[1,[01]\]<stdout>:$where/perseus/lib/libperseus.so $version 2$" 2 \
    clean "$perseusrun" -np 2 -H localhost:2 "$py" -c \
    "import perseus, perseus._native as n, perseus.torch as hvd; hvd.init();
print(n.library_path(), perseus.__version__, int(hvd.allreduce(__import__('torch').ones(1), op=hvd.Sum)))"
}

test_cmake() {
  local p="$tmp/prefix" site
  site="$p/lib/python3/dist-packages"
  check "cmake --install into $p" cmake --install "$build" --prefix "$p"
  for f in bin/perseusrun lib/libperseus.so.$version include/perseus/perseus.h \
    lib/cmake/Perseus/PerseusConfig.cmake lib/pkgconfig/perseus.pc \
    lib/python3/dist-packages/perseus/__init__.py lib/python3/dist-packages/perseus/lib/libperseus.so \
    lib/python3/dist-packages/perseus/examples/pytorch_mnist.py; do
    check "installed $f" test -f "$p/$f"
  done
  check "libperseus.so -> libperseus.so.0 -> libperseus.so.$version" bash -c \
    "[ \$(readlink '$p/lib/libperseus.so') = libperseus.so.0 ] &&
     [ \$(readlink '$p/lib/libperseus.so.0') = libperseus.so.$version ]"
  check "soname libperseus.so.0" expect 'Library soname: \[libperseus\.so\.0\]' 1 \
    readelf -d "$p/lib/libperseus.so.$version"
  check "perseusrun --version says $version" expect "^perseusrun $version$" 1 \
    clean "$p/bin/perseusrun" --version
  check "ranks load the installed package and library" ranks_use_installed "$p/bin/perseusrun" \
    "$python" "$site"
  # A C program against the installed header and library only, by pkg-config and by CMake.
  local src="$root/tests/install/c_program"
  check "C program built with pkg-config" bash -c \
    "cc -o '$tmp/sum_pc' '$src/sum_ranks.c' \$(PKG_CONFIG_PATH='$p/lib/pkgconfig' pkg-config \
       --cflags --libs perseus) -Wl,-rpath,'$p/lib'"
  check "C program built with find_package(Perseus)" bash -c \
    "cmake -S '$src' -B '$tmp/c_build' -DCMAKE_PREFIX_PATH='$p' >/dev/null &&
     cmake --build '$tmp/c_build' >/dev/null"
  for prog in "$tmp/sum_pc" "$tmp/c_build/sum_ranks"; do
    check "$(basename "$prog") under the installed perseusrun" bash -c "cd '$outside' &&
      $(declare -f expect clean); expect 'rank [01] of 2: sum 1, libperseus $code\$' 2 \
      clean '$p/bin/perseusrun' -np 2 -H localhost:2 '$prog'"
  done
  # A package meeting a libperseus of another C ABI refuses it with a PerseusError.
  cc -shared -fPIC -DFAKE_VERSION_CODE=$(((${version%%.*} + 1) * 10000)) \
    -o "$tmp/libfake.so" "$root/tests/install/fake_libperseus.c"
  check "another C ABI is a clear PerseusError" bash -c "cd '$outside' &&
    PYTHONPATH='$site' PERSEUS_LIBRARY='$tmp/libfake.so' $python -c '
import perseus, perseus._native as n
try:
    n.lib()
except perseus.PerseusError as e:
    print(e)
' | grep -q 'is libperseus $((${version%%.*} + 1)).0.0 (C ABI $((${version%%.*} + 1))), but this perseus package is $version (C ABI ${version%%.*}'"
}

# A DDP script whose first line is `import perseus`: its buckets went through libperseus.
write_ddp_script() {
  cat >"$1" <<'EOF'
import perseus
import os
import torch
import torch.distributed as dist
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
dist.init_process_group("gloo", rank=rank, world_size=size)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.full((3, 4), float(rank))).sum().backward()
stats = perseus.ddp_stats()
assert stats["models"] == 1 and stats["buckets"] > 0, stats
print("ddp rank %d: %d buckets through %s" % (rank, stats["buckets"], perseus.__file__))
EOF
}

free_port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

test_pip() {
  local venv="$tmp/venv" site
  $python -m venv --system-site-packages "$venv"
  local args=(-q --config-settings "build-dir=$build/wheel")
  [ -d "$build/wheelhouse" ] && args+=(--no-index --find-links "$build/wheelhouse")
  command -v ccache >/dev/null && args+=(--config-settings cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
    --config-settings cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  local start=$SECONDS
  check "pip install ." clean "$venv/bin/pip" install "${args[@]}" "$root"
  echo "   (pip install took $((SECONDS - start)) s)"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  check "import perseus from outside the checkout" bash -c "cd '$outside' && $(declare -f clean)
    clean '$venv/bin/python' -c 'import perseus; assert perseus.__file__.startswith(\"$site/\"), perseus.__file__; assert perseus.__version__ == \"$version\"'"
  check "package metadata says $version" expect "^Version: $version$" 1 \
    clean "$venv/bin/pip" show perseus
  check "perseusrun on the venv's PATH" test -x "$venv/bin/perseusrun"
  check "pip's ranks load the package's library" ranks_use_installed "$venv/bin/perseusrun" \
    "$venv/bin/python" "$site"
  # The seeds' line, verbatim, then their MNIST command inside the package's examples.
  local seeds_cd
  read -r seeds_cd <<'SEEDS'
cd `echo $(python -c "import perseus; print(perseus)") | cut -d\' -f 4 | sed "s/\_\_init\_\_\.py//"`examples/
SEEDS
  check "the seeds' cd line, then pytorch_mnist.py under perseusrun" bash -c "cd '$outside' &&
    export PATH='$venv/bin':\$PATH && unset PYTHONPATH PERSEUS_LIBRARY && $seeds_cd &&
    { [ \"\$PWD\" = '$site/perseus/examples' ] || { echo \"cd went to \$PWD\"; exit 1; }; } &&
    $(declare -f expect); expect 'epoch 0: .*accuracy .*\(2 ranks\)' 1 \
      perseusrun -np 2 -H localhost:2 python pytorch_mnist.py --epochs 1 --samples 512"
  check "the seeds' benchmark line: torch.distributed.launch without --use_env" bash -c \
    "cd '$site/perseus/examples' && $(declare -f expect clean); OMP_NUM_THREADS=1 \
    expect 'Total img/sec on 2 rank' 1 clean '$venv/bin/python' -m torch.distributed.launch \
      --nproc_per_node=2 --nnodes=1 --node_rank=0 --master_addr=127.0.0.1 \
      --master_port=$(free_port) --redirects 1 --tee 1 pytorch_ddp_benchmark.py --model tiny \
      --num-iters 1 --num-batches-per-iter 1 --num-warmup-batches 1"
  write_ddp_script "$outside/ddp.py"
  local mpirun
  if mpirun=$(command -v mpirun); then
    check "DDP with import perseus under mpirun, no -x" bash -c "cd '$outside' &&
      $(declare -f expect clean); MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) OMP_NUM_THREADS=1 \
      expect 'ddp rank [01]: [0-9]+ buckets through $site/perseus/__init__.py' 2 \
      clean '$mpirun' --allow-run-as-root --oversubscribe -np 2 '$venv/bin/python' ddp.py"
  fi
  check "DDP with import perseus under torch.distributed.launch --use_env" bash -c \
    "cd '$outside' && $(declare -f expect clean); OMP_NUM_THREADS=1 \
    expect '^(\[default[01]\]:)?ddp rank [01]: [0-9]+ buckets through $site/perseus/__init__.py$' 2 \
    clean '$venv/bin/python' -m torch.distributed.launch --use_env --nproc_per_node 2 --redirects 1 --tee 1 \
      --master_addr 127.0.0.1 --master_port $(free_port) ddp.py"
  test_wheel "${args[@]}"
}

# pip wheel . (the same CMake tree, so incremental), installed into a second venv that never saw
# the checkout: the wheel carries everything, and nothing in it points back at this machine's
# build (RUNPATHs), so it installs on another machine of the same kind.
test_wheel() {
  local wheels="$tmp/wheels" venv="$tmp/venv_wheel" site whl
  $python -m venv --system-site-packages "$venv"
  check "pip wheel ." clean "$venv/bin/pip" wheel --no-deps -w "$wheels" "$@" "$root" || return
  whl=$(ls "$wheels"/perseus-*.whl 2>/dev/null | head -n 1)
  check "one platform wheel (not pure Python: it holds libperseus)" bash -c     "[[ '$whl' == *-linux_*.whl || '$whl' == *-manylinux*.whl ]] || { echo '$whl'; exit 1; }"
  mkdir -p "$tmp/unpacked" && (cd "$tmp/unpacked" && $python -m zipfile -e "$whl" .)
  check "no RUNPATH in the wheel names the build tree" bash -c "cd '$tmp/unpacked' &&
    for f in \$(find . -type f \( -name '*.so*' -o -name perseusrun \)); do
      readelf -d \"\$f\" | grep -E 'RPATH|RUNPATH' | grep -F '$root' && { echo \"\$f\"; exit 1; }
    done; true"
  check "pip install the wheel into another venv" clean "$venv/bin/pip" install -q --no-index \
    --no-deps "$whl"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  check "the wheel's ranks load the wheel's library" ranks_use_installed "$venv/bin/perseusrun" \
    "$venv/bin/python" "$site"
}

test_deb() {
  if dpkg-query -W -f='${Status}' perseus 2>/dev/null | grep -q "install ok installed"; then
    echo "FAILED: a perseus package is installed already; remove it (dpkg -r perseus) first"
    failed=$((failed + 1))
    return
  fi
  rm -f "$build"/perseus_*.deb
  check "cpack -G DEB" bash -c "cd '$build' && cpack -G DEB >/dev/null"
  local deb
  deb=$(ls "$build"/perseus_*.deb 2>/dev/null | head -n 1)
  [ -n "$deb" ] || return
  check "Depends name Debian's runtime packages" bash -c "dpkg-deb -f '$deb' Depends |
    grep -E 'libssh2-1' | grep -E 'libgloo0' | grep -qE 'python3'"
  check "Depends name no CUDA or NCCL" bash -c "! dpkg-deb -f '$deb' Depends | grep -iE 'cuda|nccl'"
  deb_installed=1 # from here on, the exit trap purges it whatever happens
  check "dpkg -i" dpkg -i "$deb" || return
  dpkg -L perseus >"$tmp/deb_files"
  check "/usr/bin/perseusrun --version says $version" expect "^perseusrun $version$" 1 \
    clean /usr/bin/perseusrun --version
  check "a 2-rank job from /usr/bin/perseusrun" ranks_use_installed /usr/bin/perseusrun \
    "$python" /usr/lib/python3/dist-packages
  check "import perseus with Debian's python3" bash -c \
    "cd '$outside' && $(declare -f clean); clean $python -c 'import perseus; print(perseus.__file__)' |
      grep -qx /usr/lib/python3/dist-packages/perseus/__init__.py"
  check "dpkg -r" dpkg -r perseus
  # dpkg -r keeps the package's record (its postrm runs ldconfig); purging drops that too.
  check "dpkg -P leaves no record of it" bash -c "dpkg -P perseus >/dev/null &&
    ! dpkg-query -W perseus >/dev/null 2>&1" && deb_installed=0
  check "no file of the package left" bash -c "while read -r f; do
      [ -d \"\$f\" ] && continue; [ -e \"\$f\" ] && { echo \"left: \$f\"; exit 1; }; done \
      <'$tmp/deb_files'; for d in /usr/lib/python3/dist-packages/perseus /usr/include/perseus \
      /usr/lib/cmake/Perseus; do [ -e \"\$d\" ] && { echo \"left: \$d\"; exit 1; }; done; true"
}

for part in "${parts[@]}"; do
  echo "== install: $part"
  "test_$part"
done
echo "install: $passed passed, $failed failed"
((failed == 0))
