"""A rank of a Python job that fails (an uncaught exception, sys.exit(n)) while the others wait in
a collective ends the whole job within seconds, under perseusrun, Open MPI's mpirun and torchrun,
with the failing rank's exit code and the failing rank named (issue 15, item 1). The rank
programs are ranks/fails.py; the MXNet cases are in test_mxnet.py.

Before, the failing rank's exit-time perseus_finalize waited forever for a shutdown every rank
had to agree to, and the others waited forever for it: the job hung.
"""
import os
import re
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from test_torch import PERSEUSRUN, PYTHON, RANKS, clean_env, show

MPIRUN = shutil.which("mpirun")
# The bound: the job is over within 10 s of the failure.
WITHIN = 10.0
HOW_CODE = {"raise": 1, "exit3": 3}


def left_behind(marker, within=3.0):
    """Pids of processes whose environment holds marker, still there after `within` s."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass  # gone, or not ours
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def run(cmd, tmp_path, env):
    """Runs a launcher in its own session (a hang is killed whole); returns the process and the
    seconds from the failing rank's failure to the launcher's end. Every process the job
    started must be gone within 3 s of the launcher's end."""
    marker = "perseus-rank-errors-%s" % uuid.uuid4().hex
    env = dict(env, RANK_ERRORS_MARKER=marker)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError("the job hung (killed after 120 s)\n%s\n%s" % (out[-4000:],
                                                                           err[-4000:]))
    ended = time.time()
    proc = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    left = left_behind(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "processes of the job left behind: %s\n%s" % (left, show(proc))
    failed_at = tmp_path / "failed_at"
    assert failed_at.exists(), "the failing rank never failed\n" + show(proc)
    return proc, ended - float(failed_at.read_text())


def perseusrun(n, api, how, tmp_path, extra=()):
    # --gpu-bind none: the ranks compute on the CPU, also on a host with fewer GPUs than ranks.
    cmd = [PERSEUSRUN, "-np", str(n), "-H", "localhost:%d" % n, "--gpu-bind", "none", *extra,
           PYTHON,
           str(RANKS / "fails.py"), api, how, str(tmp_path)]
    return run(cmd, tmp_path, clean_env())


def summary(proc):
    return [l for l in proc.stderr.splitlines() if l.endswith("; ending the job")]


@pytest.mark.parametrize("api", ["hvd", "grouped", "ddp"])
@pytest.mark.parametrize("how", ["raise", "exit3"])
def test_failing_rank_ends_the_job_under_perseusrun(api, how, tmp_path):
    proc, took = perseusrun(3, api, how, tmp_path)
    assert proc.returncode == HOW_CODE[how], show(proc)
    assert took < WITHIN, "%.1f s from the failure to the end\n%s" % (took, show(proc))
    assert re.fullmatch(r"perseusrun: rank 2 \(host localhost, pid \d+\) exited with code %d; "
                        r"ending the job" % HOW_CODE[how], "\n".join(summary(proc))), show(proc)
    if how == "raise":
        # The traceback, tagged as it went by and again in perseusrun's closing summary (torch
        # 2.x's distributed error handler starts each of its lines with "[rank2]: ").
        prefix = r"(?:\[rank2\]: )?"
        assert re.search(r"^\[1,2\]<stderr>:%sRuntimeError: a bad batch at step 3$" % prefix,
                         proc.stderr, re.M), show(proc)
        tail = proc.stderr[proc.stderr.index("the last "):]
        assert re.search(r"^perseusrun: \| %sTraceback \(most recent call last\):$" % prefix,
                         tail, re.M), show(proc)
        assert re.search(r"^perseusrun: \| %sRuntimeError: a bad batch at step 3$" % prefix,
                         tail, re.M), show(proc)


def test_without_shared_memory(tmp_path):
    # PERSEUS_SHM=0: host tensors over Gloo's TCP pairs even on one host.
    proc, took = perseusrun(2, "hvd", "raise", tmp_path, extra=["-x", "PERSEUS_SHM=0"])
    assert proc.returncode == 1, show(proc)
    assert took < WITHIN, "%.1f s\n%s" % (took, show(proc))


@pytest.mark.parametrize("api", ["hvd", "ddp"])
def test_rank_that_leaves_without_error_fails_the_others(api, tmp_path):
    # sys.exit(0) in the middle of training: that rank leaves the job cleanly (its exit-time
    # perseus_finalize), so the others' next collective can never complete. They fail at once,
    # naming it, and the job ends with their exit code 1 rather than hanging.
    proc, took = perseusrun(3, api, "exit0", tmp_path)
    assert proc.returncode == 1, show(proc)
    assert took < WITHIN, "%.1f s\n%s" % (took, show(proc))
    for r in (0, 1):
        error = (tmp_path / ("error.%d" % r)).read_text()
        assert "rank 2 has left the job" in error, error + "\n" + show(proc)
    assert re.search(r"perseusrun: rank [01] \(host localhost, pid \d+\) exited with code 1",
                     proc.stderr), show(proc)


@pytest.mark.skipif(not MPIRUN, reason="mpirun (Open MPI) is not installed")
@pytest.mark.parametrize("how", ["raise", "exit3"])
def test_failing_rank_ends_the_job_under_mpirun(how, tmp_path):
    # libperseus meets over MPI here (no perseusrun): mpirun's own fail-fast must see the rank's
    # exit, so its exit-time finalize must not wait for the others.
    env = clean_env()
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "PYTHONPATH",
           "-x", "RANK_ERRORS_MARKER",
           "-x", "PERSEUS_LIBRARY", "-x", "OMP_NUM_THREADS", PYTHON, str(RANKS / "fails.py"),
           "hvd", how, str(tmp_path)]
    proc, took = run(cmd, tmp_path, env)
    assert proc.returncode == HOW_CODE[how], show(proc)
    assert took < WITHIN, "%.1f s\n%s" % (took, show(proc))
    assert re.search(r"Process name: \[\[\d+,1\],2\]\s+Exit code:\s+%d" % HOW_CODE[how],
                     proc.stdout + proc.stderr), show(proc)


@pytest.mark.parametrize("how", ["raise", "exit3"])
def test_failing_rank_ends_the_job_under_torchrun(how, tmp_path):
    # torchrun's launcher ends every worker when one fails and exits 1 whatever the worker's
    # code; it names the failing local rank and its exit code. (--redirects/--tee: see
    # test_torch.py's torchrun test.)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
           "--redirects", "1", "--tee", "1", str(RANKS / "fails.py"), "ddp", how, str(tmp_path)]
    proc, took = run(cmd, tmp_path, clean_env())
    assert proc.returncode == 1, show(proc)
    assert took < WITHIN, "%.1f s\n%s" % (took, show(proc))
    assert re.search(r"failed \(exitcode: %d\) local_rank: 2" % HOW_CODE[how], proc.stderr), \
        show(proc)
