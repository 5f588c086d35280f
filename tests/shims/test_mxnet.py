"""perseus.mxnet end to end: the rank programs of mxnet_ranks/ (and examples/mxnet_mnist.py) run
under the built perseusrun with 2 and 3 ranks, in .venv-mxnet (scripts/setup_mxnet.sh: MXNet
1.9.1 needs numpy < 1.24, so it has its own virtual environment).

Skips, saying why, when .venv-mxnet or the build is missing. PERSEUSRUN and LIBPERSEUS (as
CTest sets them for tests/comm) and MXNET_PYTHON override the default paths. Each rank program
checks every result against a reference it computes itself and prints a line this file looks
for on every rank.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(BUILD / "apps/perseusrun/perseusrun")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(BUILD / "lib/comm/libperseus.so")
PYTHON = os.environ.get("MXNET_PYTHON") or str(ROOT / ".venv-mxnet/bin/python")
SHIMS = str(ROOT / "lib/framework_shims")
RANKS = ROOT / "tests/shims/mxnet_ranks"
BLACKBOX = ROOT / "tests/blackbox"
TIMEOUT = float(os.environ.get("MXNET_TEST_TIMEOUT", "300"))

_SCRUB = re.compile(r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|SLURM_)")


def _missing():
    if not os.path.exists(PYTHON):
        return ("%s is missing: run scripts/setup_mxnet.sh (MXNet 1.9.1 in its own virtual "
                "environment)" % PYTHON)
    for path in (PERSEUSRUN, LIBPERSEUS):
        if not os.path.exists(path):
            return "%s is missing: run scripts/setup.sh" % path
    probe = subprocess.run([PYTHON, "-c", "import mxnet"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "%s cannot import mxnet: %s" % (PYTHON, probe.stderr.strip()[-500:])
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
    env.update(extra)
    return env


def perseusrun(hosts, program, *args, env=None, timeout=TIMEOUT):
    """perseusrun -H hosts PYTHON program args, with PYTHONPATH and PERSEUS_LIBRARY passed to
    every rank (-x), in its own session so that a timeout ends the whole job."""
    cmd = [PERSEUSRUN, "-H", hosts, "-x", "PYTHONPATH=" + SHIMS, "-x",
           "PERSEUS_LIBRARY=" + LIBPERSEUS, "-x", "MXNET_SUBGRAPH_VERBOSE=0", PYTHON,
           str(program)] + [str(a) for a in args]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         env=env or clean_env(), cwd=str(ROOT), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError("timed out after %s s\n%s" % (timeout, show_text(p, out, err)))
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def show_text(p, out, err):
    return "exit %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (p.returncode, out[-6000:],
                                                                err[-6000:])


def show(proc):
    return show_text(proc, proc.stdout, proc.stderr)


def rank_lines(proc, pattern):
    """{rank: match} of pattern on each rank's tagged stdout lines."""
    found = {}
    for m in re.finditer(r"^\[1,(\d+)\]<stdout>:(.*)$", proc.stdout, re.M):
        hit = re.match(pattern, m.group(2))
        if hit:
            found[int(m.group(1))] = hit
    return found


def run_ranks(n, program, *args):
    proc = perseusrun("localhost:%d" % n, RANKS / program, *args)
    assert proc.returncode == 0, show(proc)
    return proc


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_against_reference(n):
    proc = run_ranks(n, "ops.py")
    passed = rank_lines(proc, r"mxnet ops: (\d+) checks passed")
    assert sorted(passed) == list(range(n)), show(proc)
    assert len({m.group(1) for m in passed.values()}) == 1, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_distributed_trainer_equals_one_process(n):
    proc = run_ranks(n, "trainer.py")
    assert sorted(rank_lines(proc, r"mxnet trainer: ok")) == list(range(n)), show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_kvstore_and_the_fit_py_pattern(n):
    proc = run_ranks(n, "kvstore.py")
    passed = rank_lines(proc, r"mxnet kvstore: (\d+) checks passed")
    assert sorted(passed) == list(range(n)), show(proc)


def test_unpatched_fit_py_with_the_store_name():
    # Issue 19, item 3: mx.kvstore.create / Module.fit / gluon.Trainer with 'dist_sync_perseus'.
    proc = run_ranks(2, "fit_registry.py")
    passed = rank_lines(proc, r"mxnet fit_registry: (\d+) checks passed")
    assert sorted(passed) == [0, 1], show(proc)


EXAMPLES = os.environ.get("PERSEUS_MXNET_EXAMPLES")


@pytest.mark.skipif(not EXAMPLES, reason="PERSEUS_MXNET_EXAMPLES (a checkout's "
                    "example/image-classification folder; not in the mxnet wheel) is not set")
@pytest.mark.parametrize("launcher", ["perseusrun", "mpirun"])
def test_mxnet_example_fit_py(launcher):
    # Issue 19: MXNet's own fit.py with --kv-store dist_sync_perseus, under both launchers.
    if launcher == "mpirun" and not shutil.which("mpirun"):
        pytest.skip("mpirun (Open MPI) is not installed")
    args = (EXAMPLES, "--kv-store", "dist_sync_perseus")
    if launcher == "perseusrun":
        proc = perseusrun("localhost:2", RANKS / "fit_example.py", *args)
        lines = lambda pattern: rank_lines(proc, pattern)  # noqa: E731
    else:
        proc = mpirun(2, RANKS / "fit_example.py", *args)
        lines = lambda pattern: mpirun_rank_lines(proc, pattern)  # noqa: E731
    assert proc.returncode == 0, show(proc)
    assert sorted(lines(r"mxnet fit_example: done")) == [0, 1], show(proc)
    text = proc.stdout
    accuracy = {}
    for rank, epoch, value in re.findall(r"\[\d+,(\d)\]<stdout>:\s?mxnet fit_example: "
                                         r"Epoch\[(\d+)\] Validation-accuracy=([0-9.]+)", text):
        accuracy.setdefault(int(epoch), {})[int(rank)] = float(value)
    assert sorted(accuracy) == [0, 1, 2, 3], show(proc)
    for epoch, ranks in accuracy.items():
        assert sorted(ranks) == [0, 1] and ranks[0] == ranks[1], (epoch, ranks)
    assert accuracy[3][0] > 0.6, accuracy


@pytest.mark.parametrize("n,scope", [(2, 1), (3, 1), (2, 0), (3, 0)])
def test_sync_batch_norm_matches_batch_norm(n, scope):
    # One host: comm_scope 0 (the host's ranks) is every rank, as comm_scope 1.
    proc = run_ranks(n, "sync_bn.py", scope)
    passed = rank_lines(proc, r"mxnet sync_bn: (\d+) checks passed \(scope (\d), group (.*)\)")
    assert sorted(passed) == list(range(n)), show(proc)
    assert {m.group(3) for m in passed.values()} == {str(list(range(n)))}, show(proc)


def test_hosts_of_ranks_from_the_places():
    sys.path.insert(0, SHIMS)
    try:
        from perseus import _native
    finally:
        sys.path.remove(SHIMS)
    # 2 hosts x 2, by slot and round robin (mpirun --map-by node): the rank within the node
    # (OMPI_COMM_WORLD_NODE_RANK) would give {0,2},{1,3} for the first layout.
    assert _native.hosts_of_ranks([(0, 2, 0), (1, 2, 0), (0, 2, 1), (1, 2, 1)]) == [0, 0, 1, 1]
    assert _native.hosts_of_ranks([(0, 2, 0), (0, 2, 1), (1, 2, 0), (1, 2, 1)]) == [0, 1, 0, 1]
    # uneven hosts: 1 rank, then 3
    assert _native.hosts_of_ranks([(0, 1, 0), (0, 3, 1), (1, 3, 0), (2, 3, 0)]) == [0, 1, 1, 1]
    with pytest.raises(_native.PerseusError, match=r"rank 1's place \(local rank 1 of 2"):
        _native.hosts_of_ranks([(0, 2, 0), (1, 2, 3)])


def mpirun(n, program, *args, hosts=None, env=None, timeout=TIMEOUT):
    """Open MPI's mpirun -np n PYTHON program args (libperseus meets over MPI)."""
    env = env or clean_env()
    env.update(PYTHONPATH=SHIMS, PERSEUS_LIBRARY=LIBPERSEUS, MXNET_SUBGRAPH_VERBOSE="0")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", str(n)]
    if hosts:
        cmd += ["-H", hosts]
    cmd += ["-x", "PYTHONPATH", "-x", "PERSEUS_LIBRARY", "-x", "MXNET_SUBGRAPH_VERBOSE", PYTHON,
            str(program)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=str(ROOT))


def mpirun_rank_lines(proc, pattern):
    """{rank: match} of pattern on mpirun --tag-output's "[jobid,rank]<stdout>:" chunks. Open
    MPI tags what it reads as it reads it, so a rank's line and its newline may come apart,
    with another rank's tagged text between them: a chunk ends at the next tag or newline."""
    found = {}
    for m in re.finditer(r"\[\d+,(\d+)\]<stdout>:\s?(.*?)(?=\[\d+,\d+\]<std(?:out|err)>:|$)",
                         proc.stdout, re.M):
        hit = re.match(pattern, m.group(2))
        if hit:
            found[int(m.group(1))] = hit
    return found


@pytest.mark.skipif(not shutil.which("mpirun"), reason="mpirun (Open MPI) is not installed")
@pytest.mark.parametrize("n,scope", [(2, 0), (3, 0), (2, 1), (3, 1)])
def test_sync_batch_norm_under_mpirun_one_host(n, scope):
    # Issue 19, item 1: under mpirun, scope 0 took the host from OMPI_COMM_WORLD_NODE_RANK (the
    # rank within the node), so on one host every rank was its own group.
    proc = mpirun(n, RANKS / "sync_bn.py", scope)
    assert proc.returncode == 0, show(proc)
    passed = mpirun_rank_lines(proc, r"mxnet sync_bn: \d+ checks passed \(scope \d, group (.*)\)")
    assert {r: m.group(1) for r, m in passed.items()} == {
        r: str(list(range(n))) for r in range(n)}, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_mnist_example_loss_falls(n):
    proc = perseusrun("localhost:%d" % n, ROOT / "examples/mxnet_mnist.py")
    assert proc.returncode == 0, show(proc)
    done = rank_lines(proc, r"done: loss ([\d.]+) -> ([\d.]+), parameters equal on all ranks")
    assert list(done) == [0], show(proc)
    first, last = float(done[0].group(1)), float(done[0].group(2))
    assert last < 0.25 * first, show(proc)


# ---- 2 SSH test hosts x 2 ranks (tests/blackbox/testhosts.py) -------------------------------

@pytest.mark.parametrize("scope,groups", [
    (0, {0: "[0, 1]", 1: "[0, 1]", 2: "[2, 3]", 3: "[2, 3]"}),
    (1, {r: "[0, 1, 2, 3]" for r in range(4)}),
])
def test_sync_batch_norm_two_ssh_hosts(scope, groups):
    sys.path.insert(0, str(BLACKBOX))
    try:
        import testhosts
    finally:
        sys.path.remove(str(BLACKBOX))
    reason = testhosts.unavailable_reason()
    if reason:
        pytest.skip("test hosts unavailable: " + reason)
    with testhosts.TestHosts(2) as hosts:  # skips when it cannot make them; always cleans up
        env = clean_env(HOME=str(hosts.home))
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("SSH_AGENT_PID", None)
        try:
            proc = perseusrun(",".join(a + ":2" for a in hosts.addresses),
                              RANKS / "sync_bn.py", scope, env=env)
        finally:
            hosts.kill_leftovers()
        assert proc.returncode == 0, show(proc)
        passed = rank_lines(proc, r"mxnet sync_bn: \d+ checks passed \(scope \d, group (.*)\)")
        assert {r: m.group(1) for r, m in passed.items()} == groups, show(proc)
        end = time.monotonic() + 5
        while hosts.leftovers() and time.monotonic() < end:
            time.sleep(0.05)
        assert hosts.leftovers() == [], hosts.leftovers()


@pytest.mark.skipif(not shutil.which("mpirun"), reason="mpirun (Open MPI) is not installed")
@pytest.mark.parametrize("scope,groups", [
    (0, {0: "[0, 1]", 1: "[0, 1]", 2: "[2, 3]", 3: "[2, 3]"}),
    (1, {r: "[0, 1, 2, 3]" for r in range(4)}),
])
def test_sync_batch_norm_two_ssh_hosts_under_mpirun(scope, groups):
    # mpirun reaches the test hosts through ssh with the test key and known_hosts (OpenSSH
    # ignores $HOME); Open MPI's shared-memory transport crashes across the namespaces (one host
    # name for all), hence btl tcp,self.
    sys.path.insert(0, str(BLACKBOX))
    try:
        import testhosts
    finally:
        sys.path.remove(str(BLACKBOX))
    reason = testhosts.unavailable_reason()
    if reason:
        pytest.skip("test hosts unavailable: " + reason)
    with testhosts.TestHosts(2) as hosts:
        env = clean_env(HOME=str(hosts.home))
        for var in ("SSH_AUTH_SOCK", "SSH_AGENT_PID"):
            env.pop(var, None)
        agent = "ssh -i %s -o UserKnownHostsFile=%s -o BatchMode=yes -o IdentitiesOnly=yes" % (
            hosts.client_key, hosts.known_hosts)
        env.update(OMPI_MCA_plm_rsh_agent=agent, OMPI_MCA_routed="direct",
                   OMPI_MCA_btl="tcp,self", OMPI_MCA_pml="ob1")
        try:
            proc = mpirun(4, RANKS / "sync_bn.py", scope, env=env,
                          hosts=",".join(a + ":2" for a in hosts.addresses))
        finally:
            hosts.kill_leftovers()
        assert proc.returncode == 0, show(proc)
        passed = mpirun_rank_lines(proc, r"mxnet sync_bn: \d+ checks passed \(scope \d, group (.*)\)")
        assert {r: m.group(1) for r, m in passed.items()} == groups, show(proc)


@pytest.mark.parametrize("how,code", [("raise", 1), ("exit3", 3), ("exit0", 1)])
def test_failing_rank_ends_the_job(how, code, tmp_path):
    # Issue 15, item 1 (tests/shims/test_rank_errors.py has the torch cases): rank 2 raises, or
    # calls sys.exit, while the others wait in an all-reduce; over Gloo's TCP pairs
    # (PERSEUS_SHM=0) as on a multi-host job. sys.exit(0) leaves cleanly: the others then fail,
    # naming it, and the job ends with their code 1.
    proc = perseusrun("localhost:3", ROOT / "tests/shims/ranks/fails.py", "mxnet", how,
                      tmp_path, env=clean_env(PERSEUS_SHM="0"), timeout=120)
    took = time.time() - float((tmp_path / "failed_at").read_text())
    assert proc.returncode == code, show(proc)
    assert took < 10, "%.1f s from the failure to the end\n%s" % (took, show(proc))
    if how == "exit0":
        assert "rank 2 has left the job" in (tmp_path / "error.0").read_text(), show(proc)
    else:
        assert re.search(r"perseusrun: rank 2 \(host localhost, pid \d+\) exited with code %d; "
                         r"ending the job" % code, proc.stderr), show(proc)


@pytest.mark.skipif(not shutil.which("mpirun"), reason="mpirun (Open MPI) is not installed")
@pytest.mark.parametrize("how,code", [("raise", 1), ("exit3", 3)])
def test_failing_rank_ends_the_job_under_mpirun(how, code, tmp_path):
    # The same under Open MPI's mpirun (libperseus meets over MPI): mpirun's fail-fast sees the
    # rank's exit at once, since its exit-time finalize does not wait for the others.
    env = clean_env(PYTHONPATH=SHIMS, PERSEUS_LIBRARY=LIBPERSEUS, PERSEUS_SHM="0")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "PYTHONPATH",
           "-x", "PERSEUS_LIBRARY", "-x", "PERSEUS_SHM", PYTHON,
           str(ROOT / "tests/shims/ranks/fails.py"), "mxnet", how, str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                          timeout=120, stdin=subprocess.DEVNULL)
    took = time.time() - float((tmp_path / "failed_at").read_text())
    assert proc.returncode == code, show(proc)
    assert took < 10, "%.1f s from the failure to the end\n%s" % (took, show(proc))
    assert re.search(r"Process name: \[\[\d+,1\],2\]\s+Exit code:\s+%d" % code,
                     proc.stdout + proc.stderr), show(proc)


def test_collectives_alone_are_a_job_of_one():
    # `python alone.py`, no launcher at all (not even torchrun's RANK/WORLD_SIZE): rank 0 of 1,
    # every collective of every dtype and odd shapes gives its input back, the KVStore works,
    # shutdown and init again.
    env = clean_env(PYTHONPATH=SHIMS, PERSEUS_LIBRARY=LIBPERSEUS, MXNET_SUBGRAPH_VERBOSE="0",
                    OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    proc = subprocess.run([PYTHON, str(RANKS / "alone.py")], capture_output=True, text=True,
                          errors="replace", timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^mxnet alone: (\d+) checks passed$", proc.stdout, re.M)
    assert len(passed) == 1 and int(passed[0]) > 500, show(proc)


def elastic_finals(report):
    """The last "final" event of every process of mxnet_ranks/elastic_train.py."""
    import json
    found = {}
    for name in os.listdir(report):
        if name.startswith("events."):
            events = [json.loads(l) for l in open(os.path.join(report, name)) if l.strip()]
            finals = [e for e in events if e["what"] == "final"]
            if finals:
                found[int(name.split(".")[1])] = (finals[-1], events)
    return found


@pytest.mark.parametrize("elastic", [False, True])
def test_elastic_state_in_place(tmp_path, elastic):
    """hvd.elastic with MXNetState (a Gluon model, DistributedTrainer): in elastic mode rank 1
    dies at step 8 and the two others go on in world 1 with a new process, from their last
    commit, in their own processes; without elastic mode the same script just trains."""
    report = tmp_path / "report"
    report.mkdir()
    hosts = ["-H", "localhost:3"]
    args = ["--steps", "24", "--report", str(report)]
    if elastic:
        script = tmp_path / "discover.sh"
        script.write_text("#!/bin/sh\necho localhost:3\n")
        script.chmod(0o755)
        hosts = ["-np", "3", "--host-discovery-script", str(script)]
        args += ["--die-at", "8", "--die-rank", "1", "--step-seconds", "0.05"]
    cmd = [PERSEUSRUN] + hosts + ["-x", "PYTHONPATH=" + SHIMS, "-x",
                                  "PERSEUS_LIBRARY=" + LIBPERSEUS, PYTHON,
                                  str(RANKS / "elastic_train.py")] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT,
                          env=clean_env(), cwd=str(ROOT), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, show(proc)
    finals = elastic_finals(report)
    assert len(finals) == 3, (finals, show(proc))
    assert {f["size"] for f, _ in finals.values()} == {3}
    assert {f["step"] for f, _ in finals.values()} == {24}
    assert len({f["checksum"] for f, _ in finals.values()}) == 1, finals
    assert all(f["equal"] for f, _ in finals.values())
    if not elastic:
        assert {f["world"] for f, _ in finals.values()} == {-1}
        return
    assert {f["world"] for f, _ in finals.values()} == {1}, finals
    joins = sorted(len([e for e in events if e["what"] == "joined"])
                   for _, events in finals.values())
    assert joins == [1, 2, 2], "two survivors joined twice, the new process once: %s" % finals
    assert "world 1 of 3 ranks (1 new), from the ranks' last commit" in proc.stderr, show(proc)
