"""libperseus started without perseusrun: the same C rank program under Open MPI's mpirun.

perseus_init sees OMPI_COMM_WORLD_* and no PERSEUS_RENDEZVOUS_ADDR, loads Open MPI at run time,
and MPI carries the rendezvous (lib/comm/launcher_bootstrap.h). CTest sets PERSEUS_COLLECTIVES_TEST
and LIBPERSEUS (test_comm.py's defaults otherwise); MPIRUN and MPICC name mpirun and mpicc when
they are not on PATH. Without them the tests report "skipped" (scripts/setup.sh installs
openmpi-bin and libopenmpi-dev).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_comm import COLLECTIVES, LIBPERSEUS, TIMEOUT, clean_env, show

MPIRUN = os.environ.get("MPIRUN") or shutil.which("mpirun")
MPICC = os.environ.get("MPICC") or shutil.which("mpicc")
HERE = Path(__file__).resolve().parent
needs_mpirun = pytest.mark.skipif(not MPIRUN, reason="mpirun (Open MPI) is not installed")

# perseus_collectives_test checks perseus_rank() and perseus_size() against PERSEUS_RANK and
# PERSEUS_SIZE, which perseusrun sets; under mpirun the launcher's own variables say the same.
# Only those two are set: PERSEUS_RENDEZVOUS_ADDR stays unset, so the bootstrap is MPI's.
AS_RANK = 'PERSEUS_RANK=$OMPI_COMM_WORLD_RANK PERSEUS_SIZE=$OMPI_COMM_WORLD_SIZE exec "$0"'


def mpi_env(**extra):
    """The clean environment (no launcher's variables), with the built libperseus first."""
    env = clean_env(**extra)
    library_dir = os.path.dirname(os.path.abspath(LIBPERSEUS))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (library_dir, env.get("LD_LIBRARY_PATH")) if p)
    return env


def mpirun(n, program, env, exports=()):
    """Runs program on n ranks under mpirun; --allow-run-as-root for CI's containers, and
    --oversubscribe since n may exceed the cores."""
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
    for name in exports:
        args += ["-x", name]
    return subprocess.run(args + program, capture_output=True, text=True, errors="replace",
                          timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)


@needs_mpirun
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_under_mpirun(n):
    proc = mpirun(n, ["/bin/sh", "-c", AS_RANK, COLLECTIVES], mpi_env())
    assert proc.returncode == 0, show(proc)
    passed = {int(m.group(2)): int(m.group(1)) for m in re.finditer(
        r"^collectives: (\d+) checks passed \(rank (\d+) of (\d+),", proc.stdout, re.M)
        if int(m.group(3)) == n}
    assert sorted(passed) == list(range(n)), show(proc)
    assert len(set(passed.values())) == 1, show(proc)
    # MPI was finalised at the end of the bootstrap: mpirun has nothing to complain about.
    assert "exiting improperly" not in proc.stderr, show(proc)


@needs_mpirun
def test_mpirun_without_open_mpi_loadable_says_so():
    # PERSEUS_MPI_LIBRARY replaces libmpi.so.40 and libmpi.so: a missing file stands for a host
    # where Open MPI's library is not installed.
    missing = "/nonexistent/libmpi.so.40"
    proc = mpirun(2, [COLLECTIVES], mpi_env(PERSEUS_MPI_LIBRARY=missing),
                  exports=["PERSEUS_MPI_LIBRARY"])
    assert proc.returncode == 1, show(proc)
    assert "init returned -3" in proc.stderr, show(proc)
    assert re.search(r"started under Open MPI's mpirun \(OMPI_COMM_WORLD_SIZE=2\), but Open "
                     r"MPI's library could not be loaded \(" + re.escape(missing) +
                     r": cannot open shared object file", proc.stderr), show(proc)
    assert "PERSEUS_MPI_LIBRARY" in proc.stderr and "perseusrun" in proc.stderr, show(proc)


@needs_mpirun
def test_launcher_variables_without_the_launcher_say_so():
    # OMPI_COMM_WORLD_SIZE copied by hand: Open MPI starts alone (a job of one), and the
    # mismatch is named instead of a job of one that waits for nobody.
    proc = subprocess.run([COLLECTIVES], capture_output=True, text=True, errors="replace",
                          timeout=TIMEOUT, env=mpi_env(OMPI_COMM_WORLD_SIZE="2"),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, show(proc)
    assert "init returned -3" in proc.stderr, show(proc)
    assert ("the job joined has 1 rank(s), not the 2 that OMPI_COMM_WORLD_SIZE=2 announces"
            in proc.stderr), show(proc)


def sanitizer_flags():
    """The -fsanitize flags libperseus was built with (the ASan+UBSan run of scripts/test.sh):
    an executable loading a sanitized library must link the sanitizers' runtimes first."""
    needed = subprocess.run(["readelf", "-d", LIBPERSEUS], capture_output=True, text=True,
                            check=True).stdout
    kinds = [kind for lib, kind in (("libasan", "address"), ("libubsan", "undefined"))
             if "[%s." % lib in needed]
    return ["-fsanitize=" + ",".join(kinds)] if kinds else []


@needs_mpirun
@pytest.mark.skipif(not MPICC, reason="mpicc (Open MPI) is not installed")
def test_program_that_uses_mpi_itself(tmp_path):
    # The program initialises MPI before perseus_init and finalises it after perseus_finalize;
    # libperseus uses that MPI, leaves it alone, and meets again on a second perseus_init.
    program = tmp_path / "perseus_mpi_program_test"
    library_dir = os.path.dirname(os.path.abspath(LIBPERSEUS))
    subprocess.run([MPICC, "-std=c99", "-I", str(HERE.parents[1] / "include"),
                    str(HERE / "perseus_mpi_program_test.c"), "-o", str(program),
                    "-L" + library_dir, "-lperseus", "-Wl,-rpath," + library_dir]
                   + sanitizer_flags(), check=True, timeout=TIMEOUT)
    proc = mpirun(3, [str(program)], mpi_env())
    assert proc.returncode == 0, show(proc)
    assert sorted(re.findall(r"^mpi program: rank (\d) of 3 ok$", proc.stdout, re.M)) == [
        "0", "1", "2"], show(proc)
