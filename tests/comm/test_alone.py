"""perseus_init in a process that no launcher started: a job of one rank, as in Horovod
(perseus_alone_test, a C program of this folder, run directly). A launcher's variables that
are there but incomplete still fail perseus_init, naming what is missing and what is set.

CTest sets PERSEUS_ALONE_TEST; run by hand it defaults to the path in <repo>/build.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_comm import BUILD, TIMEOUT, show  # noqa: E402

ALONE = os.environ.get("PERSEUS_ALONE_TEST") or str(BUILD / "tests/comm/perseus_alone_test")

# Every launcher's variables that place a rank (perseusrun, MPI, Slurm, torchrun, horovodrun).
_LAUNCHERS = re.compile(r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|SLURM_|TORCHELASTIC_)")
_TORCH = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}


def alone_env(**extra):
    env = {k: v for k, v in os.environ.items() if not _LAUNCHERS.match(k) and k not in _TORCH}
    env.update(extra)
    return env


def run_alone(env, args=()):
    start = time.monotonic()
    proc = subprocess.run([ALONE, *args], capture_output=True, text=True, errors="replace",
                          timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def test_every_op_and_dtype_as_a_job_of_one_twice():
    proc, elapsed = run_alone(alone_env())
    assert proc.returncode == 0, show(proc)
    checks = int(re.fullmatch(r"ok \((\d+) checks\)\n", proc.stdout).group(1))
    # 2 rounds x 9 dtypes x 4 counts x (5 ops x 3 + 6 movers) and the rest: a check that ran.
    assert checks > 2 * 9 * 4 * 21, show(proc)
    assert proc.stderr == "", show(proc)
    print("alone: %d checks in %.1f s" % (checks, elapsed))


def test_tuning_variables_alone_are_no_launcher():
    # Exported for every shell, they say nothing of a job: still alone, and still read.
    env = alone_env(PERSEUS_FUSION_THRESHOLD="0", PERSEUS_CYCLE_TIME="0", PERSEUS_SHM="0",
                    PERSEUS_INIT_TIMEOUT="5", OMPI_MCA_btl="^openib")
    proc, _ = run_alone(env)
    assert proc.returncode == 0, show(proc)
    proc, _ = run_alone(alone_env(PERSEUS_COLLECTIVE_TIMEOUT="soon"))
    assert proc.returncode == 1, show(proc)
    assert "PERSEUS_COLLECTIVE_TIMEOUT='soon' is not a whole number" in proc.stderr, show(proc)


@pytest.mark.parametrize("variables,missing", [
    ({"PERSEUS_RANK": "1", "PERSEUS_SIZE": "2"}, "PERSEUS_RENDEZVOUS_ADDR"),
    ({"PERSEUS_RENDEZVOUS_ADDR": "127.0.0.1"}, "PERSEUS_RENDEZVOUS_PORT"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "PERSEUS_RENDEZVOUS_ADDR"),
    ({"LOCAL_RANK": "0"}, "PERSEUS_RENDEZVOUS_ADDR"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "PERSEUS_RENDEZVOUS_ADDR"),
    ({"SLURM_NTASKS": "4"}, "PERSEUS_RENDEZVOUS_ADDR"),
])
def test_a_launchers_incomplete_variables_still_fail_naming_them(variables, missing):
    proc, elapsed = run_alone(alone_env(**variables))
    assert proc.returncode == 1, show(proc)
    assert "perseus_init failed (-3): perseus_init: %s is not set" % missing in proc.stderr, \
        show(proc)
    for name, value in variables.items():
        assert "%s=%s" % (name, value) in proc.stderr, show(proc)
    assert "perseusrun -np N" in proc.stderr and "run it alone" in proc.stderr, show(proc)
    assert elapsed < 30, show(proc)
