"""A real Slurm cluster on one machine, for black-box tests of perseusrun under Slurm.

    with SlurmCluster(3) as cluster:
        cluster.node_names     # ['n1', 'n2', 'n3']
        cluster.addresses      # ['10.37.142.2', '10.37.142.3', '10.37.142.4'] (NodeAddr)
        cluster.run(["srun", "-N", "3", "-n", "3", "hostname"])   # CompletedProcess (text)
        subprocess.run(["sbatch", ...], env=cluster.env())
        assert not cluster.leftovers()

Each Slurm compute node is one host of a TestHosts (testhosts.py): a network namespace on a
bridge with its own address (and its own sshd unless sshd=False). Everything of the cluster lives
in a temporary directory: its own munged (own key, socket, pid, seed and log file; the system's
/etc/munge/munge.key and /run/munge are never used), its own slurm.conf (SLURM_CONF points every
Slurm command at it: use env() or run()), state, spool and log files. slurmctld runs in this
(root) namespace in the foreground (-D) as a child process; one `slurmd -D -N nI` runs inside each
host's namespace (`ip netns exec`, which execs: the recorded pid is slurmd's own). Ports
(SlurmctldPort, SlurmdPort, SrunPortRange) are picked free at random, so clusters do not collide
with each other or with a system Slurm. All daemons run as root (SlurmUser=SlurmdUser=root).

Needs root plus what TestHosts needs, and the Debian 12 packages (slurm-wlm 22.05.8)
    slurmctld slurmd slurm-client munge libpmi2-0
(slurm-wlm-basic-plugins, libslurm38, libmunge2 ... come with them as dependencies;
slurm-wlm-basic-plugins holds mpi_pmi2.so and mpi_pmix.so/mpi_pmix_v4.so, the latter needs
libpmix2, which it depends on). Otherwise it skips the test (pytest.skip) or, outside pytest,
raises SlurmClusterUnavailable. Installing the packages does not start any daemon here (no
systemd, policy-rc.d denies); a system munged/slurmd that does run is not touched or used.

Everything created is recorded as it is created and undone in reverse order by close(): cancel
all jobs, stop the slurmds (and SIGKILL whatever is left in the namespaces), slurmctld, munged,
remove the temporary directory, close the TestHosts. On leaving the with-block, at interpreter
exit (atexit) and on SIGTERM, also when set-up failed halfway.

Facts measured on Debian 12, Slurm 22.05.8, munge 0.5.15 (2 cores, 2-3 nodes):

* Start-up (namespaces, sshd, munged, slurmctld, 3 slurmd, until sinfo shows all idle) takes
  about 0.3-0.5 s (startup_seconds); close() about 0.2 s.
* Name resolution: node names (n1..nN) never need to resolve and /etc/hosts is not touched:
  slurmctld and srun (which reads the same slurm.conf) reach the slurmds at NodeAddr. slurmctld
  only runs on a host whose short hostname is a SlurmctldHost, so it is
  SlurmctldHost=<hostname>(<bridge address>): everybody connects to the bridge address, which
  every namespace reaches. (The hostname itself resolves to 127.0.0.1 here; that is never used.)
* srun I/O: srun (root namespace) listens on wildcard sockets with ports from SrunPortRange;
  slurmd connects back to the source address of srun's launch connection (the bridge address;
  tasks see SLURM_SRUN_COMM_HOST=SLURM_LAUNCH_NODE_IPADDR=<bridge address>), not to a name. So
  stdout/stderr/stdin work with no extra configuration; srun in a batch script on n1 launches
  from n1's address and works the same way.
* Two node-local things must not collide in the one shared file system: SlurmdSpoolDir and
  TmpFS use %n (mpi/pmix creates TmpFS/spmix_appdir_UID_JOB.STEP: with a shared /tmp the second
  node's step fails "File exists" and srun reports "task N launch failed: Unspecified error").
* slurmd initialises a cgroup plugin even with proctrack/linuxproc + task/none; inside
  `ip netns exec` (fresh /sys, no cgroup mounts) the autodetection fails ("Unable to initialize
  cgroup plugin"), so cgroup.conf names CgroupPlugin=cgroup/v1; nothing is created in cgroups.
* Tasks get (srun -N 3 -n 3): SLURM_PROCID (global rank), SLURM_LOCALID (rank on the node),
  SLURM_NODEID (node index in the step), SLURM_NTASKS=SLURM_NPROCS=3, SLURM_NNODES=3,
  SLURM_JOB_ID=SLURM_JOBID, SLURM_STEP_ID=SLURM_STEPID, SLURM_JOB_NODELIST=SLURM_NODELIST=
  SLURM_STEP_NODELIST='n[1-3]', SLURM_TASKS_PER_NODE=SLURM_STEP_TASKS_PER_NODE='1(x3)',
  SLURM_JOB_CPUS_PER_NODE='1(x3)', SLURM_CPUS_ON_NODE, SLURM_STEP_NUM_NODES/_NUM_TASKS,
  SLURMD_NODENAME='n2' (SLURM_TOPOLOGY_ADDR too), SLURM_GTIDS, SLURM_TASK_PID,
  SLURM_SRUN_COMM_HOST/_PORT, SLURM_STEP_LAUNCHER_PORT, SLURM_LAUNCH_NODE_IPADDR,
  SLURM_SUBMIT_HOST/_DIR, SLURM_CLUSTER_NAME, SLURM_CONF, SLURM_WORKING_CLUSTER,
  SLURM_JOB_PARTITION/_USER/_UID/_GID/_NAME, SLURM_UMASK. The hostname is the same on every
  node (`ip netns exec` keeps the UTS namespace): identify a node by SLURMD_NODENAME or address.
* salloc -N 3 CMD runs CMD here (root namespace) with SLURM_JOB_ID=<n>, SLURM_JOB_NODELIST=
  SLURM_NODELIST='n[1-3]', SLURM_TASKS_PER_NODE='1(x3)' (one CPU per node unless --exclusive:
  then '2(x3)' with cpus=2), SLURM_JOB_NUM_NODES=3. `salloc -N 3 --no-shell` just allocates
  ("salloc: Granted job allocation N" on stderr) and exits; the job runs until scancel
  (allocate()). sbatch -N 2 runs the script on the first node (n1, in its namespace) with
  SLURM_JOB_NODELIST='n[1-2]', SLURM_TASKS_PER_NODE='1(x2)'; submit-to-finish about 0.6 s.
* One step per node at once in one allocation ("an agent per host"):
      srun --jobid=J --nodes=1 --ntasks=1 --nodelist=nI --overlap CMD
  Three such steps start in about 0.1 s. Without --overlap a second step on a node whose CPUs
  a running step holds waits ("step creation temporarily disabled, retrying (Requested nodes
  are busy)"); an --overlap step never waits. With TaskPlugin=task/none nothing binds tasks to
  CPUs (sched_getaffinity shows all CPUs even though SLURM_CPUS_ON_NODE=1); --cpu-bind=none is
  accepted but srun then warns "cluster configuration lacks support for cpu binding" on stderr,
  so leave it out here; on a real cluster with task/affinity or task/cgroup add --cpu-bind=none
  and --whole (22.05: a step gets only the CPUs it asks for unless --whole; --exclusive, the
  opposite of --overlap, is the default for steps). srun forwards its stdin to task 0 (default
  --input=0): with `cat`, lines come back at once; srun exits (status 0, ~10 ms) when its stdin
  is closed (cat sees EOF), and when the task exits by itself with stdin still open (srun's
  status is the task's, e.g. 3, plus "srun: error: n1: task 0: Exited with exit code 3").
* A step may not have more tasks than the allocation has CPUs ("Unable to create step for job
  J: More processors requested than permitted"), --overlap or not, unless --overcommit (-O).
* scancel J kills every step's processes on the nodes (SIGTERM, then SIGKILL after KillWait;
  the srun processes exit with 143 and "*** STEP J.S ON nI CANCELLED ***"); leftovers() is
  empty within ~50 ms.
* PMI2: `srun --mpi=pmi2` (mpi_pmi2.so, package slurm-wlm-basic-plugins) gives each task PMI_FD,
  PMI_RANK, PMI_SIZE, PMI_JOBID ('J.S'); the client library is
  /usr/lib/x86_64-linux-gnu/libpmi2.so.0 (package libpmi2-0). Verified with -N 2 -n 4 (ctypes):
      int PMI2_Init(int *spawned, int *size, int *rank, int *appnum);  -> 0, 0, 4, r, -1
      int PMI2_Job_GetId(char *jobid, int jobid_size);                 -> "J.S"
      int PMI2_KVS_Put(const char *key, const char *value);
      int PMI2_KVS_Fence(void);
      int PMI2_KVS_Get(const char *jobid /* NULL: own job */, int src_pmi_id /* -1 */,
                       const char *key, char *value, int maxvalue, int *vallen);
      int PMI2_Finalize(void);
  all returned 0 and every rank read every other rank's value (both nodes) after the fence.
* PMIx: `srun --mpi=pmix` (mpi_pmix.so + mpi_pmix_v4.so in slurm-wlm-basic-plugins, with
  libpmix2 4.2.2) works once TmpFS is per node: tasks get PMIX_RANK, PMIX_NAMESPACE
  ('slurm.pmix.J.S'), PMIX_SERVER_URI*, PMIX_SERVER_TMPDIR (in the spool dir) ...;
  PMIx_Init/PMIx_Fence/PMIx_Finalize from libpmix.so.2 return 0 on both nodes (-N 2 -n 4).

Fragile: slurmctld needs this machine's short hostname as SlurmctldHost; SlurmctldPort can be
taken between picking and binding (slurmctld is then restarted on new ports; SlurmdPort binds in
the fresh namespaces and cannot collide; srun tries the other ports of SrunPortRange); SIGTERM to
slurmd leaves running slurmstepds behind, so stop_node() and close() SIGKILL what is left in the
namespace; CgroupPlugin=cgroup/v1 is only verified on this (cgroup v1) machine. munged logs "Unauthorized credential for client UID=0" and
"Replayed credential" at Info level during normal operation; harmless.

Standard library only (pytest is used when it is importable).
"""

import atexit
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import pytest
except ImportError:  # pragma: no cover - the module also works outside pytest
    pytest = None

import testhosts
from testhosts import TestHosts

IP = testhosts.IP
MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMSTEPD = "/usr/sbin/slurmstepd"
CLIENTS = ("srun", "sinfo", "squeue", "scancel", "scontrol", "salloc", "sbatch")
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/slurm-wlm", "/usr/lib64/slurm",
               "/usr/lib/slurm")

READY_TIMEOUT = 30.0

# Variables that Slurm commands read as input (SLURM_*, SRUN_*, SALLOC_*, SBATCH_*, SQUEUE_*,
# SINFO_*, SCANCEL_*, SCONTROL_*): inherited ones would change what the commands do.
_SLURM_ENV_RE = re.compile(r"\A(SLURM_|SLURMD_|SRUN_|SALLOC_|SBATCH_|SQUEUE_|SINFO_|SCANCEL_|"
                           r"SCONTROL_|PMI_|PMIX_)")


class SlurmClusterUnavailable(Exception):
    """This machine cannot provide a Slurm cluster (not root, packages missing, ...)."""


class SlurmClusterError(RuntimeError):
    """Set-up or clean-up of the Slurm cluster failed."""


SlurmClusterUnavailable.__test__ = False
SlurmClusterError.__test__ = False


def _unavailable(msg):
    testhosts.skip_or_raise("slurm cluster unavailable: " + msg, SlurmClusterUnavailable)


def _which(name):
    return shutil.which(name) or os.path.join("/usr/bin", name)


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def plugin_dir():
    """The directory with Slurm's plugins (auth_munge.so, ...), or None."""
    for d in PLUGIN_DIRS:
        if os.path.isfile(os.path.join(d, "auth_munge.so")):
            return d
    return None


def unavailable_reason():
    """Why this machine cannot provide a Slurm cluster, or None when it can (as far as can be
    told without creating anything)."""
    reason = testhosts.unavailable_reason()
    if reason:
        return reason
    missing = [what for what, path in (("munged (munge)", MUNGED),
                                       ("slurmctld (slurmctld)", SLURMCTLD),
                                       ("slurmd (slurmd)", SLURMD),
                                       ("slurmstepd (slurmd)", SLURMSTEPD))
               if not _executable(path)]
    missing += ["%s (slurm-client)" % c for c in CLIENTS if not _executable(_which(c))]
    if missing:
        return "missing " + ", ".join(missing)
    d = plugin_dir()
    if d is None:
        return "missing Slurm plugins (slurm-wlm-basic-plugins: auth_munge.so)"
    missing = [p for p in ("cred_munge.so", "proctrack_linuxproc.so", "task_none.so",
                           "select_cons_tres.so", "mpi_none.so")
               if not os.path.isfile(os.path.join(d, p))]
    if missing:
        return "missing Slurm plugins %s in %s" % (", ".join(missing), d)
    return None


def _run(args, check=True, **kw):
    return testhosts.run_command(args, check, SlurmClusterError, **kw)


def _free_port(exclude=()):
    """A TCP port free on every address of this namespace right now (not in `exclude`)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port not in exclude and port not in (6817, 6818, 6819):
            return port
    raise SlurmClusterError("no free port found")


def _free_port_range(size, exclude=()):
    """A run of `size` ports, all free on this machine right now, outside the ephemeral range."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        start = rng.randrange(20000, 30000 - size)
        ports = range(start, start + size)
        if any(p in exclude for p in ports):
            continue
        ok = True
        for p in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return start, start + size - 1
    raise SlurmClusterError("no free port range found")


def _tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no %s)" % path
    return "\n".join(data.splitlines()[-lines:])


def _stop_proc(p, timeout=10.0, sig=signal.SIGTERM):
    """Signals a Popen, waits up to `timeout`, then SIGKILLs it; returns its exit status."""
    if p.poll() is None:
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            p.wait(10)
    return p.returncode


class SlurmCluster(testhosts.UndoOnExit):
    """A Slurm cluster of `count` nodes (network namespaces), `cpus` CPUs each; a context
    manager. See the module docstring.

    Attributes (valid once entered): hosts (the TestHosts), node_names, addresses, namespaces,
    bridge_address, conf_path, tmpdir, cluster_name, slurmctld_port, slurmd_port,
    srun_port_range, munge_socket, cpus.
    """

    __test__ = False

    def __init__(self, count, *, cpus=2, sshd=True, ready_timeout=READY_TIMEOUT, tmp_root=None,
                 extra_conf=(), mpi_default="none"):
        if count < 1 or count > 250:
            raise ValueError("count must be 1..250")
        if cpus < 1:
            raise ValueError("cpus must be >= 1")
        self.count = count
        self.cpus = cpus
        self.sshd = sshd
        self.mpi_default = mpi_default  # slurm.conf's MpiDefault: what a plain srun gives tasks
        self.ready_timeout = ready_timeout
        self.tmp_root = tmp_root
        self.extra_conf = list(extra_conf)
        self.hosts = None
        self.tmpdir = None
        self.conf_path = None
        self.cluster_name = None
        self.node_names = ["n%d" % (i + 1) for i in range(count)]
        self.addresses = []
        self.namespaces = []
        self.bridge_address = None
        self.controller_host = None
        self.slurmctld_port = None
        self.slurmd_port = None
        self.srun_port_range = None
        self.munge_socket = None
        self.munge_key = None
        self.startup_seconds = None
        self._munged = None
        self._slurmctld = None
        self._slurmds = {}   # node index -> Popen of `ip netns exec NS slurmd -D -N nI`
        self._undo = []
        self._entered = False
        self._closed = False
        self._closing = False
        self._prev_sigterm = None
        self._sigterm_installed = False
        self._pending_sigterm = None

    # ---- context manager ---------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        errors = self.close()
        if errors and exc_type is None:
            raise SlurmClusterError("clean-up of the Slurm cluster failed:\n  "
                                    + "\n  ".join(errors))
        if errors:
            sys.stderr.write("slurmcluster: clean-up failed:\n  %s\n" % "\n  ".join(errors))
        return False

    def start(self):
        if self._entered:
            raise RuntimeError("SlurmCluster already started")
        self.check_prerequisites()
        self._entered = True
        t0 = time.monotonic()
        try:
            self._setup()
        except BaseException:
            errors = self.close()
            if errors:
                sys.stderr.write("slurmcluster: clean-up after failed set-up failed:\n  %s\n"
                                 % "\n  ".join(errors))
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    @staticmethod
    def check_prerequisites():
        """Skips (pytest) or raises SlurmClusterUnavailable unless this machine can provide a
        cluster; cheap, creates nothing."""
        reason = unavailable_reason()
        if reason:
            _unavailable(reason)

    # ---- public API --------------------------------------------------------------------------
    def env(self, base=None):
        """A copy of os.environ (or of `base`, e.g. cluster.hosts.env() for the hosts' SSH
        HOME) without inherited Slurm/PMI variables, with SLURM_CONF pointing at this
        cluster's slurm.conf."""
        env = dict(os.environ if base is None else base)
        for k in list(env):
            if _SLURM_ENV_RE.match(k):
                del env[k]
        env["SLURM_CONF"] = self.conf_path
        return env

    def run(self, args, *, timeout=60, check=False, input=None, **kw):
        """Runs a command (e.g. ["srun", "-N2", "hostname"]) with env(); returns a
        CompletedProcess (text, stdout and stderr captured unless given)."""
        kw.setdefault("env", self.env())
        kw.setdefault("text", True)
        if "stdout" not in kw and "stderr" not in kw and "capture_output" not in kw:
            kw["capture_output"] = True
        if input is None and "stdin" not in kw:
            kw["stdin"] = subprocess.DEVNULL
        p = subprocess.run(args, input=input, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise SlurmClusterError("%r: exit status %d\nstdout: %s\nstderr: %s\n%s"
                                    % (args, p.returncode, p.stdout, p.stderr, self.log_tails()))
        return p

    def popen(self, args, **kw):
        """subprocess.Popen with env() (the caller waits for it / kills it)."""
        kw.setdefault("env", self.env())
        return subprocess.Popen(args, **kw)

    def node_states(self):
        """{node name: state} as sinfo reports it ('idle', 'alloc', 'mix', 'down*', ...)."""
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15)
        if p.returncode != 0:
            raise SlurmClusterError("sinfo failed (%d): %s" % (p.returncode, p.stderr.strip()))
        states = {}
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].lower()
        return states

    def jobs(self):
        """Ids (strings) of the jobs slurmctld knows that are not finished."""
        p = self.run(["squeue", "-h", "-o", "%i"], timeout=15)
        if p.returncode != 0:
            raise SlurmClusterError("squeue failed (%d): %s" % (p.returncode, p.stderr.strip()))
        return [j.strip() for j in p.stdout.split() if j.strip()]

    def cancel_all(self, wait=10.0):
        """scancels every job and waits (bounded) until squeue shows none."""
        end = time.monotonic() + wait
        while True:
            ids = self.jobs()
            if not ids:
                return
            self.run(["scancel", *ids], timeout=15)
            if time.monotonic() > end:
                raise SlurmClusterError("jobs %s still there after scancel" % ids)
            time.sleep(0.2)

    def allocate(self, *args, timeout=30):
        """`salloc --no-shell ARGS` (e.g. "-N", "3"): an allocation that lasts until scancel;
        returns its job id (a string)."""
        p = self.run(["salloc", "--no-shell", *args], timeout=timeout)
        m = re.search(r"Granted job allocation (\d+)", p.stderr)
        if p.returncode != 0 or not m:
            raise SlurmClusterError("salloc --no-shell %s failed (%d): %s\n%s"
                                    % (" ".join(args), p.returncode, p.stderr.strip(),
                                       self.log_tails()))
        return m.group(1)

    def log_path(self, which):
        """'munged', 'slurmctld' or a node name: that daemon's log file."""
        if which == "munged":
            return self._path("munged.log")
        if which == "slurmctld":
            return self._path("log", "slurmctld.log")
        return self._path("log", "slurmd.%s.log" % which)

    def log_tails(self, lines=30):
        """The last lines of every daemon's log (and its stderr), for failure messages."""
        parts = []
        if self.tmpdir is None:
            return "(no logs: set-up did not get that far)"
        for which in ["munged", "slurmctld"] + self.node_names:
            log = self.log_path(which)
            log_tail = _tail(log, lines) if os.path.exists(log) else ""
            if log_tail:
                parts.append("==== %s ====\n%s" % (log, log_tail))
            # The daemons in the foreground copy their log to stderr ("slurmd: ..."); show
            # stderr only for what is not in the log (errors before it was opened, crashes).
            err = self._path("log", "%s.stderr" % which)
            if os.path.exists(err) and os.path.getsize(err):
                with open(log, "rb") if os.path.exists(log) else open(os.devnull, "rb") as f:
                    logged = f.read().decode("utf-8", "replace")
                err_tail = _tail(err, lines)
                extra = [l for l in err_tail.splitlines()
                         if l.split(": ", 1)[-1].strip() not in logged]
                if extra:
                    parts.append("==== %s ====\n%s" % (err, "\n".join(extra)))
        return "\n".join(parts) or "(logs empty)"

    def slurmd_pid(self, i):
        """Pid of node i's slurmd, or None when it is not running."""
        p = self._slurmds.get(i)
        return p.pid if p is not None and p.poll() is None else None

    def daemon_pids(self):
        """Pids of munged, slurmctld and the slurmds started (running or not)."""
        procs = [self._munged, self._slurmctld] + list(self._slurmds.values())
        return [p.pid for p in procs if p is not None]

    def pids_on(self, i):
        """Pids of the live processes in node i's namespace (slurmd and sshd included)."""
        return self.hosts.pids_on(i)

    def leftovers(self):
        """Pids of what runs inside the nodes' namespaces besides each node's slurmd and sshd:
        slurmstepds and tasks of running steps, batch scripts, whatever they left behind."""
        keep = {self.slurmd_pid(i) for i in range(self.count)}
        keep |= {self.hosts.sshd_pid(i) for i in range(self.count)}
        keep.discard(None)
        return [p for i in range(self.count) for p in self.pids_on(i) if p not in keep]

    def wait_no_leftovers(self, timeout=10.0):
        """Waits until leftovers() is empty; returns what is left after `timeout` (or [])."""
        end = time.monotonic() + timeout
        while True:
            left = self.leftovers()
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.05)

    def kill_leftovers(self):
        """SIGKILLs, by pid, whatever runs in the nodes' namespaces besides slurmd and sshd,
        until nothing is left or about 2.5 s have passed."""
        for _ in range(50):
            left = self.leftovers()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)

    def stop_node(self, i, *, kill_all=True):
        """Stops node i's slurmd (SIGKILL: like a crashed node) and, with kill_all, every process
        in its namespace except its sshd. slurmctld marks it down after SlurmdTimeout."""
        p = self._slurmds.get(i)
        if p is not None:
            _stop_proc(p, sig=signal.SIGKILL)
        if kill_all:
            sshd = self.hosts.sshd_pid(i)
            for _ in range(100):
                left = [q for q in self.pids_on(i) if q != sshd]
                if not left:
                    break
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.02)

    def start_node(self, i, wait=True):
        """(Re)starts node i's slurmd; with wait, until sinfo shows it idle again."""
        if self.slurmd_pid(i) is not None:
            return
        self._start_slurmd(i)
        if wait:
            self.wait_idle([self.node_names[i]])

    def wait_idle(self, names=None, timeout=None):
        """Waits until sinfo shows the named nodes (default: all) idle; raises with the logs'
        tails on timeout or when a daemon died."""
        names = list(names or self.node_names)
        timeout = self.ready_timeout if timeout is None else timeout
        end = time.monotonic() + timeout
        states = {}
        while True:
            self._check_daemons()
            try:
                states = self.node_states()
            except (SlurmClusterError, subprocess.TimeoutExpired):
                states = {}
            if all(states.get(n) == "idle" for n in names):
                return
            if time.monotonic() > end:
                raise SlurmClusterError("nodes not idle within %.0f s: %s\n%s"
                                        % (timeout, states, self.log_tails()))
            time.sleep(0.1)

    # ---- close: UndoOnExit.close() undoes self._undo ------------------------------------------

    # ---- set-up ------------------------------------------------------------------------------
    def _record(self, what, fn):
        if self._closed:
            raise SlurmClusterError("Slurm cluster closed during set-up")
        self._undo.append((what, fn))

    def _path(self, *names):
        return os.path.join(self.tmpdir, *names)

    def _setup(self):
        # The hosts first: their atexit/SIGTERM handlers are installed before ours, so ours run
        # first (atexit is LIFO; our SIGTERM handler forwards to theirs) and stop the daemons
        # before the namespaces go.
        hosts = TestHosts(self.count, tmp_root=self.tmp_root)
        self.hosts = hosts
        self._record("close test hosts", lambda: self._close_hosts(hosts))
        hosts.start()
        atexit.register(self._atexit)
        self._install_sigterm()
        if not self.sshd:
            for i in range(self.count):
                hosts.stop_host(i)
        self.addresses = list(hosts.addresses)
        self.namespaces = list(hosts.namespaces)
        self.bridge_address = hosts.bridge_address
        self.cluster_name = "perseus" + hosts.prefix[2:]

        self.tmpdir = tempfile.mkdtemp(prefix="perseus-slurm-%s-" % hosts.prefix,
                                       dir=self.tmp_root)
        tmpdir = self.tmpdir
        self._record("remove %s" % tmpdir, lambda: shutil.rmtree(tmpdir))
        os.chmod(tmpdir, 0o755)
        for d in ("state", "spool", "log"):
            os.mkdir(self._path(d), 0o755)
        for name in self.node_names:
            os.mkdir(self._path("spool", name), 0o755)
            os.makedirs(self._path("tmp", name), 0o755)

        self._start_munged()
        # slurmctld may lose the race for its picked port: then pick again.
        for attempt in range(3):
            self._write_conf()
            self._start_slurmctld()
            try:
                self._wait_slurmctld()
                break
            except SlurmClusterError:
                if attempt == 2 or "Address already in use" not in self.log_tails():
                    raise
                _stop_proc(self._slurmctld)
        for i in range(self.count):
            self._start_slurmd(i)
        self._record("cancel all jobs", self._cancel_all_quietly)
        self.wait_idle()

    def _close_hosts(self, hosts):
        # Our SIGTERM handler sits on top of the hosts' one: put theirs back first, so that
        # theirs can restore the one before it.
        if self._entered:
            self._restore_sigterm()
        errors = hosts.close()
        if errors:
            raise SlurmClusterError("; ".join(errors))

    def _start_munged(self):
        mdir = self._path("munge")
        os.mkdir(mdir, 0o755)
        self.munge_key = os.path.join(mdir, "munge.key")
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(1024))
        finally:
            os.close(fd)
        self.munge_socket = os.path.join(mdir, "munge.socket")
        log = open(self._path("munged.log"), "ab")
        try:
            # -F: foreground, so the pid is munged's own; it logs to stderr then. --force: the
            # directory checks that munged makes on the socket/key/log paths would refuse a
            # temporary directory.
            p = subprocess.Popen([MUNGED, "-F", "--force", "--socket", self.munge_socket,
                                  "--key-file", self.munge_key,
                                  "--pid-file", os.path.join(mdir, "munged.pid"),
                                  "--log-file", self._path("munged.log"),
                                  "--seed-file", os.path.join(mdir, "munged.seed"),
                                  "--num-threads", "4"],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True)
        finally:
            log.close()
        self._munged = p
        self._record("stop munged (pid %d)" % p.pid, lambda: _stop_proc(p))
        munge, unmunge = _which("munge"), _which("unmunge")
        end = time.monotonic() + 10
        while True:
            if p.poll() is not None:
                raise SlurmClusterError("munged exited with status %s:\n%s"
                                        % (p.returncode, _tail(self._path("munged.log"))))
            if os.path.exists(self.munge_socket):
                if not (_executable(munge) and _executable(unmunge)):
                    break
                enc = subprocess.run([munge, "-n", "-S", self.munge_socket],
                                     capture_output=True, timeout=10)
                if enc.returncode == 0:
                    dec = subprocess.run([unmunge, "-S", self.munge_socket], input=enc.stdout,
                                         capture_output=True, timeout=10)
                    if dec.returncode == 0:
                        break
            if time.monotonic() > end:
                raise SlurmClusterError("munged not ready within 10 s:\n%s"
                                        % _tail(self._path("munged.log")))
            time.sleep(0.02)

    def _write_conf(self):
        self.slurmctld_port = _free_port()
        self.slurmd_port = _free_port(exclude=(self.slurmctld_port,))
        self.srun_port_range = _free_port_range(
            max(64, 16 * self.count), exclude=(self.slurmctld_port, self.slurmd_port))
        # slurmctld only runs where its hostname is one of the SlurmctldHost names; the address
        # in parentheses is what everybody else connects to.
        self.controller_host = socket.gethostname().split(".")[0]
        auth = "socket=%s" % self.munge_socket
        lines = [
            "# perseus test cluster %s (slurmcluster.py)" % self.cluster_name,
            "ClusterName=%s" % self.cluster_name,
            "SlurmctldHost=%s(%s)" % (self.controller_host, self.bridge_address),
            "SlurmctldPort=%d" % self.slurmctld_port,
            "SlurmdPort=%d" % self.slurmd_port,
            "SrunPortRange=%d-%d" % self.srun_port_range,
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "AuthInfo=%s" % auth,
            "CredType=cred/munge",
            "PluginDir=%s" % plugin_dir(),
            "StateSaveLocation=%s" % self._path("state"),
            "SlurmdSpoolDir=%s" % self._path("spool", "%n"),
            # Per node: the nodes share one file system, and mpi/pmix makes its directories
            # (spmix_appdir_UID_JOB.STEP) under TmpFS, which would collide in a shared /tmp.
            "TmpFS=%s" % self._path("tmp", "%n"),
            "SlurmctldPidFile=%s" % self._path("slurmctld.pid"),
            "SlurmdPidFile=%s" % self._path("slurmd.%n.pid"),
            "SlurmctldLogFile=%s" % self.log_path("slurmctld"),
            "SlurmdLogFile=%s" % self._path("log", "slurmd.%n.log"),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "MpiDefault=%s" % self.mpi_default,
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "PropagateResourceLimits=NONE",
            "PlugStackConfig=%s" % self._path("plugstack.conf"),
            "MailProg=/bin/true",
            "ReturnToService=2",
            # The configured CPUs count, not the machine's: no DRAIN for "Low socket*core*thread
            # count" or the like.
            "SlurmdParameters=config_overrides",
            "MessageTimeout=5",
            "TCPTimeout=2",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=2",
            "UnkillableStepTimeout=10",
            "BatchStartTimeout=10",
            "Waittime=0",
        ]
        lines += self.extra_conf
        for name, addr in zip(self.node_names, self.addresses):
            lines.append("NodeName=%s NodeAddr=%s NodeHostname=%s CPUs=%d RealMemory=1000 "
                         "State=UNKNOWN" % (name, addr, name, self.cpus))
        lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=NO")
        self.conf_path = self._path("slurm.conf")
        with open(self.conf_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(self._path("plugstack.conf"), "w") as f:
            f.write("")
        # slurmd initialises a cgroup plugin even with proctrack/linuxproc and task/none; the
        # autodetection fails inside `ip netns exec`, which mounts a fresh /sys without the
        # cgroup file systems. Naming the plugin makes slurmd load it without looking.
        with open(self._path("cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\n"
                    "ConstrainRAMSpace=no\nConstrainDevices=no\n")

    def _daemon_env(self):
        return self.env()

    def _start_slurmctld(self):
        err = open(self._path("log", "slurmctld.stderr"), "ab")
        try:
            # -D: foreground (the pid is slurmctld's own); -c: no state from a previous run;
            # -i: ignore state file errors.
            p = subprocess.Popen([SLURMCTLD, "-D", "-c", "-i", "-f", self.conf_path],
                                 stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                 env=self._daemon_env(), start_new_session=True)
        finally:
            err.close()
        self._slurmctld = p
        self._record("stop slurmctld (pid %d)" % p.pid, lambda: _stop_proc(p))

    def _wait_slurmctld(self):
        end = time.monotonic() + self.ready_timeout
        while True:
            if self._slurmctld.poll() is not None:
                raise SlurmClusterError("slurmctld exited with status %s:\n%s"
                                        % (self._slurmctld.returncode, self.log_tails()))
            try:
                p = self.run(["scontrol", "ping"], timeout=10)
                if p.returncode == 0 and " is UP" in p.stdout:
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > end:
                raise SlurmClusterError("slurmctld not up within %.0f s:\n%s"
                                        % (self.ready_timeout, self.log_tails()))
            time.sleep(0.05)

    def _start_slurmd(self, i):
        name = self.node_names[i]
        err = open(self._path("log", "%s.stderr" % name), "ab")
        try:
            # `ip netns exec` execs slurmd: the pid is slurmd's own.
            p = subprocess.Popen([IP, "netns", "exec", self.namespaces[i], SLURMD, "-D",
                                  "-N", name, "-f", self.conf_path],
                                 stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                 env=self._daemon_env(), start_new_session=True)
        finally:
            err.close()
        self._slurmds[i] = p
        self._record("stop slurmd %s (pid %d)" % (name, p.pid),
                     lambda i=i, p=p: self._stop_slurmd(i, p))

    def _stop_slurmd(self, i, p):
        _stop_proc(p)
        if self._slurmds.get(i) is p:
            del self._slurmds[i]
        # slurmd leaves running slurmstepds (and their tasks) behind: kill them while slurmctld
        # and the links still exist.
        sshd = self.hosts.sshd_pid(i)
        end = time.monotonic() + 10
        while True:
            left = [q for q in self.hosts.pids_on(i) if q != sshd]
            if not left:
                return
            if time.monotonic() > end:
                raise SlurmClusterError("processes %s on node %s survive SIGKILL"
                                        % (left, self.node_names[i]))
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def _check_daemons(self):
        for what, p in [("munged", self._munged), ("slurmctld", self._slurmctld)] + \
                [("slurmd %s" % self.node_names[i], p) for i, p in self._slurmds.items()]:
            if p is not None and p.poll() is not None:
                raise SlurmClusterError("%s exited with status %s:\n%s"
                                        % (what, p.returncode, self.log_tails()))

    def _cancel_all_quietly(self):
        if self._slurmctld is None or self._slurmctld.poll() is not None:
            return
        try:
            self.cancel_all(wait=5.0)
        except (SlurmClusterError, subprocess.TimeoutExpired):
            pass  # the slurmds' undo kills what is left anyway

    # ---- atexit / SIGTERM (as in testhosts.py) -----------------------------------------------
    def _atexit(self):
        errors = self.close()
        if errors:
            sys.stderr.write("slurmcluster: clean-up at exit failed:\n  %s\n"
                             % "\n  ".join(errors))
