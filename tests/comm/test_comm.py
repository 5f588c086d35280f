"""libperseus end to end: the C rank programs of this folder run under the built perseusrun.

CTest sets PERSEUSRUN, PERSEUS_COLLECTIVES_TEST, PERSEUS_PEER_LOSS_TEST and LIBPERSEUS; run
by hand, they default to the paths in <repo>/build. Budgets are generous (COMM_TIMEOUT, 300 s
per job) so that the sanitizer build passes too; the failure tests bound what matters (how soon
a job with a dead rank ends) separately.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[2] / "build"
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(BUILD / "apps/perseusrun/perseusrun")
COLLECTIVES = os.environ.get("PERSEUS_COLLECTIVES_TEST") or str(
    BUILD / "tests/comm/perseus_collectives_test")
PEER_LOSS = os.environ.get("PERSEUS_PEER_LOSS_TEST") or str(
    BUILD / "tests/comm/perseus_peer_loss_test")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(BUILD / "lib/comm/libperseus.so")
HEADER = Path(__file__).resolve().parents[2] / "include/perseus/perseus.h"
TIMEOUT = float(os.environ.get("COMM_TIMEOUT", "300"))

# The launcher's and the other ecosystems' variables from the shell running pytest would change
# what the ranks see.
_SCRUB = re.compile(r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|SLURM_)")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
    env.update(extra)
    return env


def run(args, timeout=TIMEOUT, env=None):
    """Runs perseusrun with args; returns (completed process, seconds)."""
    start = time.monotonic()
    proc = subprocess.run([PERSEUSRUN] + args, capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=env or clean_env(), stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def show(proc):
    return "exit %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
        proc.returncode, proc.stdout[-6000:], proc.stderr[-6000:])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives(n):
    proc, elapsed = run(["-np", str(n), "-H", "localhost:%d" % n, COLLECTIVES])
    assert proc.returncode == 0, show(proc)
    passed = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r"^\[1,(\d+)\]<stdout>:collectives: (\d+) checks passed", proc.stdout, re.M)}
    assert sorted(passed) == list(range(n)), show(proc)
    # Every rank made the same collective calls, so every rank counted the same checks.
    assert len(set(passed.values())) == 1, show(proc)
    print("np %d: %d checks per rank, %.2f s" % (n, passed[0], elapsed))


def exported_functions():
    out = subprocess.run(["nm", "-D", "--defined-only", LIBPERSEUS], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_exports_only_the_c_abi():
    exported = exported_functions()
    assert exported, "nm found no symbols in %s" % LIBPERSEUS
    assert all(name.startswith("perseus_") for name in exported), sorted(exported)
    declared = set(re.findall(r"PERSEUS_API [^;]*?\b(perseus_\w+)\(", HEADER.read_text()))
    assert exported == declared, "exported %s, declared %s" % (sorted(exported), sorted(declared))


def test_init_with_some_of_perseusruns_variables_says_to_use_it():
    # A few variables copied by hand, outside perseusrun: refused (with none at all the process
    # is a job of one rank instead: test_alone.py).
    proc = subprocess.run([COLLECTIVES], capture_output=True, text=True, timeout=TIMEOUT,
                          env=clean_env(PERSEUS_RANK="0", PERSEUS_SIZE="2"),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, show(proc)
    assert "returned -3" in proc.stderr and "under perseusrun" in proc.stderr, show(proc)
    assert "PERSEUS_RANK=0, PERSEUS_SIZE=2" in proc.stderr, show(proc)


@pytest.mark.parametrize("variable,value", [("PERSEUS_HIERARCHICAL_ALLREDUCE", "yes"),
                                            ("HOROVOD_HIERARCHICAL_ALLREDUCE", "2"),
                                            ("PERSEUS_ALLREDUCE_STREAMS", "0")])
def test_malformed_tuning_variable_fails_init_naming_it(variable, value):
    proc, _ = run(["-np", "2", "-H", "localhost:2", "-x", "%s=%s" % (variable, value),
                   COLLECTIVES])
    assert proc.returncode == 1, show(proc)
    assert "returned -1" in proc.stderr, show(proc)  # PERSEUS_ERROR_INVALID_ARGUMENT
    assert "%s='%s' is not a whole number" % (variable, value) in proc.stderr, show(proc)


def test_init_times_out_naming_what_it_waited_for(tmp_path):
    # Rank 1 never calls perseus_init; rank 0 must give up after PERSEUS_INIT_TIMEOUT seconds
    # and say what it waited for, and perseusrun's fail-fast ends rank 1.
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(
        "import os, sys, time\n"
        "if os.environ['PERSEUS_RANK'] == '1':\n"
        "    time.sleep(120)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")
    proc, elapsed = run(["-np", "2", "-H", "localhost:2", sys.executable, str(wrapper),
                         COLLECTIVES], env=clean_env(PERSEUS_INIT_TIMEOUT="3"))
    assert proc.returncode == 1, show(proc)
    assert elapsed < 60, "took %.1f s\n%s" % (elapsed, show(proc))
    assert re.search(r"rank 0 waited 3 s for rank 1's [a-z ]+ in the rendezvous store, in vain",
                     proc.stderr), show(proc)
    assert "returned -5" in proc.stderr and "PERSEUS_INIT_TIMEOUT" in proc.stderr, show(proc)


def test_a_rank_slow_to_join_is_named_after_10_s(tmp_path):
    # Rank 2 comes 16 s late (a slow import, a data loader): after 10 s rank 0 says whom it waits
    # for, once, and the job then runs; PERSEUS_INIT_TIMEOUT (40 s) is never reached.
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(
        "import os, sys, time\n"
        "if os.environ['PERSEUS_RANK'] == '2':\n"
        "    time.sleep(16)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")
    proc, _ = run(["-np", "3", "-H", "localhost:3", sys.executable, str(wrapper), COLLECTIVES],
                  env=clean_env(PERSEUS_INIT_TIMEOUT="40"))
    assert proc.returncode == 0, show(proc)
    notes = [l for l in proc.stderr.splitlines() if "still waiting after 10 s" in l]
    assert len(notes) == 1, show(proc)
    assert re.fullmatch(r"\[1,0\]<stderr>:perseus: rank 0: still waiting after 10 s for rank 2's "
                        r"[a-z ]+ in the rendezvous store: has rank 2 called perseus_init "
                        r"\(hvd.init\(\)\)\? It is given until PERSEUS_INIT_TIMEOUT \(40 s\)",
                        notes[0]), show(proc)


SUMMARY = re.compile(r"^perseusrun: rank (\d+) \(host \S+, pid \d+\) (?:was killed by signal 9 "
                     r"\(SIGKILL\)|exited with code 3); ending the job$", re.M)
LOST_PEER = re.compile(r"^\[1,(\d+)\]<stderr>:rank \d+: round \d+: error (-?\d+): (.*)$", re.M)


@pytest.mark.parametrize("survivors", ["default", "ignore-sigterm"])
def test_rank_killed_mid_collective_ends_the_job(survivors):
    # Rank 0 SIGKILLs itself about a second into a loop of allreduces; perseusrun's fail-fast
    # ends the job. Its code is 137 (rank 0's 128 + 9) or 3, when a survivor that got
    # PERSEUS_ERROR_COMMUNICATION and exited is reaped before rank 0 (perseusrun reports the
    # first failure it sees). With "ignore-sigterm" the survivors ignore perseusrun's SIGTERM,
    # so each ends only by libperseus's error or by the SIGKILL after --kill-grace 10.
    args = ["-np", "3", "-H", "localhost:3", "--kill-grace", "10", PEER_LOSS, "0", "1"]
    if survivors == "ignore-sigterm":
        args.append("ignore-sigterm")
    proc, elapsed = run(args, timeout=150)
    assert proc.returncode in (137, 3), show(proc)
    assert elapsed < 60, "took %.1f s: the job hung\n%s" % (elapsed, show(proc))
    assert SUMMARY.search(proc.stderr), show(proc)
    # What a survivor reports, it reports as a lost peer.
    for m in LOST_PEER.finditer(proc.stderr):
        assert m.group(1) != "0", show(proc)
        assert m.group(2) == "-4", show(proc)
        # ... naming the peer that ended and how, as the launcher saw it.
        assert re.search(r"rank 0 \(host \S+, pid \d+\) was killed by signal 9 \(SIGKILL\)",
                         m.group(3)), show(proc)
    if survivors == "ignore-sigterm":
        assert LOST_PEER.search(proc.stderr), "no survivor reported the lost peer\n" + show(proc)


def test_rank_gone_without_closing_its_connections_is_named_in_time():
    # The victim (rank 1) leaves a child holding its sockets, so the survivors' connections to it
    # never close and Gloo waits on; PERSEUS_SHM=0 keeps the all-reduces on Gloo. libperseus's
    # watch for the exit perseusrun saw must fail their operations within seconds, naming it,
    # before the SIGKILL that ends the job --kill-grace 15 s after the victim's death (the
    # victim's child, which ignores SIGTERM, lives until then).
    args = ["-np", "3", "-H", "localhost:3", "--kill-grace", "15", "-x", "PERSEUS_SHM=0",
            PEER_LOSS, "1", "1", "hold-sockets"]
    proc, elapsed = run(args, timeout=150)
    assert elapsed < 60, "took %.1f s: the job hung\n%s" % (elapsed, show(proc))
    reports = list(LOST_PEER.finditer(proc.stderr))
    assert {m.group(1) for m in reports} == {"0", "2"}, show(proc)
    for m in reports:
        assert m.group(2) == "-4", show(proc)
        assert re.search(r"rank 1 \(host \S+, pid \d+\) was killed by signal 9", m.group(3)), \
            show(proc)


@pytest.mark.parametrize("shm", ["1", "0"])
def test_rank_that_leaves_fails_the_others_naming_it(shm):
    # Rank 1 calls perseus_finalize after 5 rounds while the others go on (a script that ends
    # early, the exit-time finalize after an exception): it leaves at once, exit 0, and the
    # survivors' next allreduce fails on every one of them, naming it and how perseusrun saw it
    # end, instead of waiting for it forever.
    proc, elapsed = run(["-np", "3", "-H", "localhost:3", PEER_LOSS, "1", "5", "finalize"],
                        timeout=150, env=clean_env(PERSEUS_SHM=shm))
    assert proc.returncode == 3, show(proc)
    assert elapsed < 60, "took %.1f s: the job hung\n%s" % (elapsed, show(proc))
    assert "[1,1]<stdout>:rank 1: left the job after 5 rounds (finalize: 0)" in proc.stdout, \
        show(proc)
    reports = list(LOST_PEER.finditer(proc.stderr))
    assert {m.group(1) for m in reports} <= {"0", "2"} and reports, show(proc)
    for m in reports:
        assert m.group(2) == "-4", show(proc)
        assert "allreduce 'loop': rank 1 has left the job" in m.group(3), show(proc)
        assert re.search(r"rank 1 \(host \S+, pid \d+\) exited with code 0", m.group(3)), \
            show(proc)
