"""perseusrun and libperseus on a real Slurm cluster (slurmcluster.py: slurmctld and munge on
this machine, one slurmd per network namespace, no sshd on the nodes):

- perseusrun inside `salloc -N 3` takes the hosts and slots from the allocation and starts one
  agent a node through srun: rank places, an all-reduce job over Gloo between the nodes,
  fail-fast with a rank SIGKILLed, scancel of the job, --check over the allocation, and a batch
  script (sbatch) whose perseusrun runs on the first node;
- `srun -N 2 -n 4` (the cluster's MpiDefault is pmi2, as on many clusters; `--mpi=pmi2` for the
  C program) of a C program, a Horovod-API script and a DDP script with `import perseus`, which
  join through Slurm's PMI2 without perseusrun or MPI; and `srun --mpi=pmix` of the C program,
  through PMIx without MPI.
After each test nothing is left running on any node.
"""

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import PERSEUSRUN, PY, TIMEOUT
from slurmcluster import SlurmCluster

BUILD = Path(PERSEUSRUN).resolve().parents[2]
REPO = Path(__file__).resolve().parents[2]
COLLECTIVES = os.environ.get("PERSEUS_COLLECTIVES_TEST") or str(
    BUILD / "tests/comm/perseus_collectives_test")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(BUILD / "lib/comm/libperseus.so")
SHIMS = str(REPO / "lib/framework_shims")
TORCH_PYTHON = os.environ.get("SHIMS_PYTHON") or "/usr/bin/python3"
RANKS = REPO / "tests/shims/ranks"
needs_python_libperseus = pytest.mark.skipif(
    bool(os.environ.get("PERSEUS_TESTS_SANITIZED")),
    reason="a sanitizer build: Python cannot load a libperseus built with AddressSanitizer")

SUMMARY_RE = re.compile(
    r"^perseusrun: rank (\d+) \(host (\S+), pid (\d+)\) "
    r"(?:exited with code (\d+)|was killed by signal (\d+) \((SIG[A-Z0-9]+)\)); ending the job$",
    re.M)


@pytest.fixture(scope="module")
def cluster():
    # MpiDefault=pmi2, as many clusters set it: a plain `srun -n 4 python` gets PMI2.
    with SlurmCluster(3, cpus=2, sshd=False, mpi_default="pmi2") as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left(cluster):
    """Every test starts on idle nodes and must leave nothing running on any of them."""
    cluster.cancel_all()
    cluster.kill_leftovers()
    yield
    left = cluster.wait_no_leftovers(timeout=10)
    cluster.cancel_all()
    cluster.kill_leftovers()
    assert not left, "left running on the nodes: %s" % left


def env_of(cluster, **extra):
    env = cluster.env()
    for name in list(env):
        if name.startswith(("PERSEUS_", "OMPI_", "HOROVOD_")) or name in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            del env[name]
    env["PYTHONPATH"] = SHIMS
    env["PERSEUS_LIBRARY"] = LIBPERSEUS
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def show(proc):
    return "exit %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
        proc.returncode, proc.stdout[-5000:], proc.stderr[-5000:])


def salloc(cluster, args, *, nodes=3, timeout=TIMEOUT, env=None):
    """`salloc -N nodes --exclusive perseusrun args` (2 slots a node): the CompletedProcess."""
    return cluster.run(["salloc", "-N", str(nodes), "--exclusive", PERSEUSRUN, *args],
                       env=env or env_of(cluster), timeout=timeout)


def marker_processes(marker):
    """Pids of the processes (anywhere on this machine) whose argv holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


# A rank that says where it runs: its place, its node and what of its launch it can see.
WHERE = textwrap.dedent("""
    import os
    e = os.environ
    print("where", e["PERSEUS_RANK"], e["PERSEUS_SIZE"], e["PERSEUS_LOCAL_RANK"],
          e["PERSEUS_NODE_RANK"], e["SLURMD_NODENAME"], e["MASTER_ADDR"],
          e.get("SLURM_PROCID", "-"), e.get("PMI_FD", "-"), e["SLURM_JOB_ID"],
          os.readlink("/proc/self/ns/net"))
""")


def test_salloc_takes_hosts_and_slots_and_starts_agents_through_srun(cluster):
    proc = salloc(cluster, [PY, "-c", WHERE])
    assert proc.returncode == 0, show(proc)
    rows = sorted(line.split()[1:] for line in re.findall(r"^\[1,\d+\]<stdout>:(where .*)$",
                                                          proc.stdout, re.M))
    assert len(rows) == 6, show(proc)
    namespaces = {}
    for rank, (r, size, local, node, name, master, procid, pmi_fd, job, ns) in enumerate(rows):
        assert (int(r), int(size)) == (rank, 6), show(proc)
        # By slot, two a node, in the allocation's node order.
        assert (int(local), int(node), name) == (rank % 2, rank // 2, "n%d" % (rank // 2 + 1))
        # MASTER_ADDR is rank 0's node as Slurm reaches it (NodeAddr), not an unresolvable name.
        assert master == cluster.addresses[0], show(proc)
        # The agent's own one-task step does not describe the ranks.
        assert (procid, pmi_fd) == ("-", "-"), show(proc)
        namespaces.setdefault(name, set()).add(ns)
    assert all(len(v) == 1 for v in namespaces.values()) and len(
        set.union(*namespaces.values())) == 3, namespaces
    assert "ssh" not in proc.stderr.lower(), show(proc)  # no sshd runs on the nodes


def test_allreduce_job_across_the_allocation(cluster):
    # The C collectives program: every op and dtype over Gloo between three nodes.
    proc = salloc(cluster, [COLLECTIVES], timeout=240)
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^\[1,(\d+)\]<stdout>:collectives: (\d+) checks passed \(rank \d+ of 6",
                        proc.stdout, re.M)
    assert sorted(int(r) for r, _ in passed) == list(range(6)), show(proc)
    assert len({n for _, n in passed}) == 1, show(proc)


def test_np_and_npernode_within_the_allocation(cluster):
    proc = salloc(cluster, ["-np", "3", "-npernode", "1", PY, "-c", WHERE])
    assert proc.returncode == 0, show(proc)
    nodes = sorted(line.split()[5] for line in re.findall(r"<stdout>:(where .*)$", proc.stdout,
                                                          re.M))
    assert nodes == ["n1", "n2", "n3"], show(proc)
    # More ranks than the allocation's slots is refused, naming the allocation's hosts.
    proc = salloc(cluster, ["-np", "7", PY, "-c", "pass"])
    assert proc.returncode == 2, show(proc)
    assert "7" in proc.stderr and "slots" in proc.stderr, show(proc)


def test_fail_fast_with_a_rank_sigkilled(cluster):
    marker = "slurm-failfast-" + uuid.uuid4().hex
    body = ("import os, signal, time, sys\n"
            "if os.environ['PERSEUS_RANK'] == '3':\n"
            "    time.sleep(1); sys.stderr.write('rank 3 going\\n'); sys.stderr.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(120)\n")
    t0 = time.monotonic()
    proc = salloc(cluster, [PY, "-c", body, marker])
    elapsed = time.monotonic() - t0
    assert proc.returncode == 137, show(proc)
    assert elapsed < 30, "took %.1f s\n%s" % (elapsed, show(proc))
    summary = SUMMARY_RE.search(proc.stderr)
    assert summary and summary.group(1) == "3" and summary.group(2) == "n2", show(proc)
    assert summary.group(6) == "SIGKILL", show(proc)
    assert "rank 3 going" in proc.stderr, show(proc)
    assert cluster.wait_no_leftovers(timeout=10) == [], show(proc)
    assert marker_processes(marker) == []


def test_scancel_ends_the_job_and_leaves_nothing(cluster, tmp_path):
    marker = "slurm-scancel-" + uuid.uuid4().hex
    started = tmp_path / "started"
    started.mkdir()
    body = ("import os, sys, time\n"
            "open(os.path.join(sys.argv[1], os.environ['PERSEUS_RANK']), 'w').close()\n"
            "time.sleep(300)\n")
    p = cluster.popen(["salloc", "-N", "3", "--exclusive", PERSEUSRUN, PY, "-c", body,
                       str(started), marker], env=env_of(cluster), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while len(os.listdir(started)) < 6 and time.monotonic() < end and p.poll() is None:
            time.sleep(0.1)
        assert len(os.listdir(started)) == 6, "ranks started: %s" % os.listdir(started)
        jobs = cluster.jobs()
        assert len(jobs) == 1, jobs
        t0 = time.monotonic()
        cluster.run(["scancel", jobs[0]], check=True)
        out, err = p.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0, (out, err)
    assert elapsed < 30, "%.1f s\n%s\n%s" % (elapsed, out, err)
    assert cluster.wait_no_leftovers(timeout=10) == [], err
    end = time.monotonic() + 10
    while marker_processes(marker) and time.monotonic() < end:
        time.sleep(0.1)
    assert marker_processes(marker) == [], err  # perseusrun itself too
    # The job leaves the queue once slurmctld has heard every node's epilog (COMPLETING first).
    end = time.monotonic() + 20
    while cluster.jobs() and time.monotonic() < end:
        time.sleep(0.2)
    assert cluster.jobs() == []


def test_check_over_the_allocation(cluster):
    proc = salloc(cluster, ["--check", "--json"])
    assert proc.returncode == 0, show(proc)
    import json
    report = json.loads(proc.stdout)
    text = json.dumps(report)
    for name in cluster.node_names:
        assert name in text, text


def test_sbatch_script_runs_perseusrun_on_the_first_node(cluster, tmp_path):
    out = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n#SBATCH -N 2\n#SBATCH --exclusive\n"
                      "exec %s %s -c '%s'\n" % (PERSEUSRUN, PY, WHERE.replace("'", "\"")))
    proc = cluster.run(["sbatch", "--wait", "-o", str(out), str(script)],
                       env=env_of(cluster), timeout=TIMEOUT)
    assert proc.returncode == 0, show(proc) + "\n" + (out.read_text() if out.exists() else "")
    rows = re.findall(r"<stdout>:where (\d+) 4 \d (\d) (n\d)", out.read_text())
    assert sorted(rows) == [("0", "0", "n1"), ("1", "0", "n1"), ("2", "1", "n2"),
                            ("3", "1", "n2")], out.read_text()


def pmi2_srun(cluster, program, *, nodes=2, tasks=4, timeout=TIMEOUT, env=None, mpi=()):
    # --kill-on-bad-exit: a failing task ends the others (a test failure, not a hang). Without
    # `mpi`, the cluster's MpiDefault (pmi2) applies, as a user's plain srun gets it.
    return cluster.run(["srun", *mpi, "--kill-on-bad-exit=1", "-N", str(nodes), "-n",
                        str(tasks), "-O",
                        *program], env=env or env_of(cluster), timeout=timeout)


def test_srun_pmi2_c_program_without_perseusrun_or_mpi(cluster):
    # perseus_collectives_test compares perseus_rank/size with PERSEUS_RANK/SIZE; they are set
    # from Slurm's, and PERSEUS_RENDEZVOUS_ADDR stays unset: the bootstrap is PMI2's.
    as_rank = 'PERSEUS_RANK=$SLURM_PROCID PERSEUS_SIZE=$SLURM_NTASKS exec "$0"'
    proc = pmi2_srun(cluster, ["/bin/sh", "-c", as_rank, COLLECTIVES],
                     env=env_of(cluster, PERSEUS_MPI_LIBRARY="/nonexistent/libmpi.so"),
                     timeout=240, mpi=["--mpi=pmi2"])
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^collectives: (\d+) checks passed \(rank (\d) of 4", proc.stdout, re.M)
    assert sorted(r for _, r in passed) == ["0", "1", "2", "3"], show(proc)


def test_srun_pmix_c_program_without_mpi(cluster):
    # srun --mpi=pmix: libperseus talks to Slurm's PMIx server itself (libpmix.so.2), not
    # through Open MPI (made unloadable here).
    as_rank = 'PERSEUS_RANK=$SLURM_PROCID PERSEUS_SIZE=$SLURM_NTASKS exec "$0"'
    proc = pmi2_srun(cluster, ["/bin/sh", "-c", as_rank, COLLECTIVES],
                     env=env_of(cluster, PERSEUS_MPI_LIBRARY="/nonexistent/libmpi.so"),
                     timeout=240, mpi=["--mpi=pmix"])
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^collectives: (\d+) checks passed \(rank (\d) of 4", proc.stdout, re.M)
    assert sorted(r for _, r in passed) == ["0", "1", "2", "3"], show(proc)


@needs_python_libperseus
def test_srun_pmi2_horovod_api_script(cluster):
    proc = pmi2_srun(cluster, [TORCH_PYTHON, str(RANKS / "api.py")], timeout=300)
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^api: (\d+) checks passed", proc.stdout, re.M)
    assert len(passed) == 4 and len(set(passed)) == 1 and int(passed[0]) > 0, show(proc)


# A DDP script as Slurm users write it: its process group from Slurm's variables and a file on
# the shared file system; `import perseus` first moves its gradient all-reduce to libperseus.
DDP = textwrap.dedent("""
    import perseus
    import os, sys, torch, torch.distributed as dist
    # The test's nodes share one host name (network namespaces of one machine), which torch's
    # Gloo would resolve to loopback: use the node's one interface. Real nodes need nothing.
    os.environ["GLOO_SOCKET_IFNAME"] = [i for i in os.listdir("/sys/class/net") if i != "lo"][0]
    rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank,
                            world_size=size)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 7, generator=g)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, flat) for g in gathered), "parameters differ between ranks"
    stats = perseus.ddp_stats()
    assert stats["models"] == 1 and stats["buckets"] >= 5 and not stats["skipped"], stats
    from perseus import _native  # libperseus joined the step's 4 tasks through PMI2
    assert (_native.rank(), _native.size(), _native.cross_size()) == (rank, size, 2)
    print("ddp ok", rank, flush=True)
    dist.destroy_process_group()
""")


@needs_python_libperseus
def test_srun_pmi2_ddp_script_with_import_perseus(cluster, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    proc = pmi2_srun(cluster, [TORCH_PYTHON, str(script), str(tmp_path / "rendezvous")],
                     timeout=180)
    assert proc.returncode == 0, show(proc)
    assert sorted(re.findall(r"^ddp ok (\d)", proc.stdout, re.M)) == ["0", "1", "2", "3"], \
        show(proc)
    assert "keeps torch" not in proc.stderr, show(proc)


def test_srun_without_pmi_says_how_to_start_it(cluster):
    # srun --mpi=none: no process manager to meet through, and no MPI here to try instead.
    as_rank = 'PERSEUS_RANK=$SLURM_PROCID PERSEUS_SIZE=$SLURM_NTASKS exec "$0"'
    proc = cluster.run(["srun", "--mpi=none", "-N", "2", "-n", "2", "/bin/sh", "-c", as_rank,
                        COLLECTIVES],
                       env=env_of(cluster, PERSEUS_MPI_LIBRARY="/nonexistent/libmpi.so"),
                       timeout=120)
    assert proc.returncode != 0, show(proc)
    assert "srun --mpi=pmi2" in proc.stderr, show(proc)


def test_srun_missing_is_named(cluster):
    # An allocation's hosts, but no srun on perseusrun's PATH (Slurm's client not installed on
    # the host perseusrun runs on): the error names srun, nothing starts anywhere.
    proc = cluster.run(["salloc", "-N", "2", "/usr/bin/env", "PATH=/nonexistent", PERSEUSRUN,
                        "/bin/true"], env=env_of(cluster), timeout=60)
    assert proc.returncode == 1, show(proc)
    assert "'srun' exited with code 126: it could not be run here" in proc.stderr, show(proc)
