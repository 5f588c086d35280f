"""The Slurm test cluster itself (slurmcluster.py): nodes come up idle in their own namespaces,
srun reaches every one of them, scancel leaves nothing behind, and nothing of the cluster is
left after close(), atexit or SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import testhosts
from slurmcluster import SlurmCluster

HERE = os.path.dirname(os.path.abspath(__file__))

# Prints what a task sees: its rank variables and the address it has toward the bridge.
TASK = textwrap.dedent("""
    import json, os, socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((os.environ["BRIDGE"], 9))
    print(json.dumps({k: os.environ.get(k) for k in
                      ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME",
                       "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_TASKS_PER_NODE")}
                     | {"addr": s.getsockname()[0]}))
""")


def snapshot(cluster):
    """What a SlurmCluster consists of, to check afterwards that none of it is left."""
    hosts = cluster.hosts
    pids = set(cluster.daemon_pids())
    for i in range(cluster.count):
        pids.update(hosts.pids_on(i))
    pids.update(p.pid for p in hosts._procs.values())
    return {"prefix": hosts.prefix, "tmpdirs": [cluster.tmpdir, hosts.tmpdir],
            "pids": sorted(pids), "daemons": cluster.daemon_pids()}


def leftovers(snap):
    prefix = snap["prefix"]
    assert prefix and prefix.startswith("ps") and len(prefix) == 8, prefix
    left = []
    ns = [n for n in testhosts._netns_names() if n.startswith(prefix)]
    if ns:
        left.append("namespaces %s" % ns)
    links = [l["ifname"] for l in testhosts._ip_json("link", "show")
             if l.get("ifname", "").startswith(prefix)]
    if links:
        left.append("links %s" % links)
    alive = [p for p in snap["pids"] if testhosts._pid_alive(p)]
    if alive:
        left.append("processes %s" % alive)
    dirs = [d for d in snap["tmpdirs"] if d and os.path.exists(d)]
    if dirs:
        left.append("directories %s" % dirs)
    return left


def assert_nothing_left(snap):
    end = time.monotonic() + 2
    left = leftovers(snap)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = leftovers(snap)
    assert not left, "left behind: %s" % "; ".join(left)


@pytest.fixture(scope="module")
def cluster():
    with SlurmCluster(3) as c:
        yield c


@pytest.fixture
def clean(cluster):
    """Fails the test if it leaves jobs or processes on the nodes; removes them either way."""
    yield cluster
    try:
        cluster.cancel_all()
        left = cluster.wait_no_leftovers(5)
    finally:
        cluster.kill_leftovers()
    assert not left, "left on the nodes: %s" % left


def test_all_nodes_idle(cluster):
    assert cluster.node_names == ["n1", "n2", "n3"]
    assert cluster.node_states() == {n: "idle" for n in cluster.node_names}
    assert len(set(cluster.addresses)) == 3
    assert cluster.startup_seconds < 30
    assert not cluster.leftovers()
    assert all(cluster.slurmd_pid(i) in cluster.pids_on(i) for i in range(3))
    with open(cluster.conf_path) as f:
        conf = f.read()
    assert "NodeAddr=%s" % cluster.addresses[2] in conf


def test_srun_reaches_every_node(clean):
    cluster = clean
    env = cluster.env()
    env["BRIDGE"] = cluster.bridge_address
    p = cluster.run(["srun", "-N", "3", "-n", "3", sys.executable, "-c", TASK], env=env,
                    timeout=30)
    assert p.returncode == 0, p.stderr + cluster.log_tails()
    tasks = sorted((json.loads(l) for l in p.stdout.splitlines()),
                   key=lambda t: int(t["SLURM_PROCID"]))
    assert [t["SLURM_PROCID"] for t in tasks] == ["0", "1", "2"]
    assert all(t["SLURM_LOCALID"] == "0" for t in tasks)
    assert sorted(t["SLURM_NODEID"] for t in tasks) == ["0", "1", "2"]
    assert sorted(t["addr"] for t in tasks) == sorted(cluster.addresses)
    # Task i runs on node n(i+1), whose NodeAddr is the address it has.
    for t in tasks:
        i = cluster.node_names.index(t["SLURMD_NODENAME"])
        assert t["addr"] == cluster.addresses[i]
        assert t["SLURM_JOB_NODELIST"] == t["SLURM_STEP_NODELIST"] == "n[1-3]"
        assert t["SLURM_TASKS_PER_NODE"] == "1(x3)"


def test_agent_step_per_node_with_stdin(clean):
    cluster = clean
    job = cluster.allocate("-N", "3")
    procs = [cluster.popen(["srun", "--jobid", job, "--nodes=1", "--ntasks=1",
                            "--nodelist=" + n, "--overlap", "sh", "-c",
                            "echo $SLURMD_NODENAME; exec cat"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
             for n in cluster.node_names]
    try:
        for n, p in zip(cluster.node_names, procs):
            assert p.stdout.readline() == (n + "\n").encode()
            p.stdin.write(b"ping " + n.encode() + b"\n")
            p.stdin.flush()
            assert p.stdout.readline() == b"ping " + n.encode() + b"\n"
        for p in procs:
            p.stdin.close()
            assert p.wait(15) == 0, p.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_scancel_leaves_nothing(clean):
    cluster = clean
    job = cluster.allocate("-N", "3")
    srun = cluster.popen(["srun", "--jobid", job, "-N", "3", "-n", "3", "--overlap",
                          "sh", "-c", "sleep 300 & sleep 300; wait"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 20
        # 3 tasks (sh + 2 sleeps each) plus one slurmstepd per node.
        while len(cluster.leftovers()) < 3 * 3 + 3:
            assert srun.poll() is None, srun.stderr.read()
            assert time.monotonic() < end, "steps did not start: %s" % cluster.log_tails()
            time.sleep(0.05)
        assert cluster.run(["scancel", job]).returncode == 0
        srun.wait(20)
        assert srun.returncode != 0
        assert cluster.wait_no_leftovers(10) == []
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_close_leaves_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with SlurmCluster(2, sshd=False) as c:
        assert signal.getsignal(signal.SIGTERM) == c._on_sigterm
        assert all(c.hosts.sshd_pid(i) is None for i in range(2))
        # Something still running when the cluster closes.
        sleeper = c.popen(["srun", "-N", "2", "sleep", "300"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 20
        while len(c.leftovers()) < 4:
            assert time.monotonic() < end, c.log_tails()
            time.sleep(0.05)
        snap = snapshot(c)
        assert len(snap["daemons"]) == 4  # munged, slurmctld, 2 slurmd
    sleeper.wait(20)
    assert_nothing_left(snap)
    assert signal.getsignal(signal.SIGTERM) == before


CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, %(here)r)
    from slurmcluster import SlurmCluster
    c = SlurmCluster(2)
    c.start()
    hosts = c.hosts
    pids = set(c.daemon_pids())
    for i in range(2):
        pids.update(hosts.pids_on(i))
    print(json.dumps({"prefix": hosts.prefix, "tmpdirs": [c.tmpdir, hosts.tmpdir],
                      "pids": sorted(pids), "daemons": c.daemon_pids()}), flush=True)
    time.sleep(60)
    sys.exit(3)
""")


def test_sigterm_cleans_up():
    SlurmCluster.check_prerequisites()
    p = subprocess.Popen([sys.executable, "-c", CHILD % {"here": HERE}],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        snap = json.loads(line)
        assert all(testhosts._pid_alive(pid) for pid in snap["daemons"]), snap
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == -signal.SIGTERM, err
        assert_nothing_left(snap)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


PMI2_CLIENT = textwrap.dedent("""
    import ctypes, json, os
    lib = ctypes.CDLL(%(lib)r)
    lib.PMI2_KVS_Put.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.PMI2_KVS_Get.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                 ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    spawned, size, rank, appnum = (ctypes.c_int() for _ in range(4))
    assert lib.PMI2_Init(ctypes.byref(spawned), ctypes.byref(size), ctypes.byref(rank),
                         ctypes.byref(appnum)) == 0
    node = os.environ["SLURMD_NODENAME"].encode()
    assert lib.PMI2_KVS_Put(b"k%%d" %% rank.value, node) == 0
    assert lib.PMI2_KVS_Fence() == 0
    got = []
    for r in range(size.value):
        buf, n = ctypes.create_string_buffer(256), ctypes.c_int()
        assert lib.PMI2_KVS_Get(None, -1, b"k%%d" %% r, buf, 256, ctypes.byref(n)) == 0
        got.append(buf.value.decode())
    assert lib.PMI2_Finalize() == 0
    print(json.dumps({"rank": rank.value, "size": size.value, "got": got,
                      "env": sorted(k for k in os.environ if k.startswith("PMI_"))}))
""")

PMI2_LIB = "/usr/lib/x86_64-linux-gnu/libpmi2.so.0"


def test_pmi2_across_nodes(clean, tmp_path):
    cluster = clean
    if not os.path.exists(PMI2_LIB):
        pytest.skip("no %s (package libpmi2-0)" % PMI2_LIB)
    prog = tmp_path / "pmi2_client.py"
    prog.write_text(PMI2_CLIENT % {"lib": PMI2_LIB})
    p = cluster.run(["srun", "--mpi=pmi2", "-N", "2", "-n", "4", sys.executable, str(prog)],
                    timeout=30)
    assert p.returncode == 0, p.stderr + cluster.log_tails()
    ranks = sorted((json.loads(l) for l in p.stdout.splitlines()), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for r in ranks:
        assert r["size"] == 4
        assert r["got"] == ["n1", "n1", "n2", "n2"]  # block distribution, both nodes
        assert {"PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_JOBID"} <= set(r["env"])


def test_pmix_steps_on_two_nodes(clean):
    cluster = clean
    if "pmix" not in cluster.run(["srun", "--mpi=list"]).stdout + \
            cluster.run(["srun", "--mpi=list"]).stderr:
        pytest.skip("no mpi/pmix plugin")
    # Twice: the second step used to collide in a shared /tmp (spmix_appdir_*).
    for _ in range(2):
        p = cluster.run(["srun", "--mpi=pmix", "-N", "2", "-n", "2", "sh", "-c",
                         'echo "$PMIX_RANK $PMIX_NAMESPACE"'], timeout=30)
        assert p.returncode == 0, p.stderr + cluster.log_tails()
        assert sorted(l.split()[0] for l in p.stdout.splitlines()) == ["0", "1"]


class _FailingCluster(SlurmCluster):
    """Fails while starting the second slurmd: hosts, munged, slurmctld and one slurmd exist."""

    def _start_slurmd(self, i):
        if i == 1:
            self.failed_snapshot = snapshot(self)
            raise RuntimeError("injected failure")
        super()._start_slurmd(i)


def test_cleanup_after_failed_setup():
    c = _FailingCluster(2)
    with pytest.raises(RuntimeError, match="injected failure"):
        c.start()
    assert len(c.failed_snapshot["daemons"]) == 3
    assert_nothing_left(c.failed_snapshot)
