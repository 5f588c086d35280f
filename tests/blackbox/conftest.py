"""Shared machinery of the black-box tests of perseusrun.

The tests run the built binary (path in $PERSEUSRUN, which CTest sets; default
<repo>/build/apps/perseusrun/perseusrun) with small Python rank programs written into the test's
tmp_path. Everything a test starts carries a unique marker (in the environment, which local ranks
inherit, and in the argv of the processes the process-tree tests spawn), so that the finalizer can
find and SIGKILL, by pid, whatever is left even when the test failed.

Budgets are generous (30 s per job by default) so that the suite also passes against builds with
AddressSanitizer; set BLACKBOX_TIMEOUT to change the default.
"""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO / "build" / "apps" / "perseusrun" / "perseusrun"
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(DEFAULT_BINARY)
PY = sys.executable
TIMEOUT = float(os.environ.get("BLACKBOX_TIMEOUT", "30"))
MARKER_VAR = "BLACKBOX_TEST_MARKER"

TAG_RE = re.compile(rb"\A\[1,(\d+)\]<(stdout|stderr)>:(.*)\Z", re.S)

# Variables that would change what perseusrun computes or what the ranks see; the tests start
# perseusrun without them so that results do not depend on the shell that runs pytest.
_SCRUB_RE = re.compile(
    r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|TORCHELASTIC_|SLURM_|"
    r"(CUDA_VISIBLE_DEVICES|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|"
    r"GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|NODE_RANK|MASTER_ADDR|MASTER_PORT)\Z)")


def has_gpu():
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))


def nproc():
    return len(os.sched_getaffinity(0))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines_of(data):
    """Splits bytes on b"\\n" only (a \\r stays inside its line); drops the empty tail."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def untag(data, stream):
    """Returns ({rank: [line bytes, ...]}, [lines that carry no tag of `stream`])."""
    by_rank, other = {}, []
    for line in lines_of(data):
        m = TAG_RE.match(line)
        if m and m.group(2).decode() == stream:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(3))
        else:
            other.append(line)
    return by_rank, other


def _show(data, limit=4000):
    text = data.decode("utf-8", "backslashreplace")
    if len(text) > limit:
        text = text[: limit // 2] + "\n...[%d chars cut]...\n" % (len(text) - limit) + text[-limit // 2:]
    return text


@dataclasses.dataclass
class Result:
    args: list
    rc: int
    stdout: bytes
    stderr: bytes
    elapsed: float
    pid: int

    @property
    def err(self):
        return self.stderr.decode("utf-8", "replace")

    @property
    def out(self):
        return self.stdout.decode("utf-8", "replace")

    def own_messages(self):
        """perseusrun's own stderr lines (those that are not tagged rank lines), as text."""
        return [l.decode("utf-8", "replace") for l in untag(self.stderr, "stderr")[1]]

    def __str__(self):
        return ("perseusrun %r\n  exit status %s after %.2f s\n--- stdout ---\n%s\n--- stderr ---\n%s"
                % (self.args, self.rc, self.elapsed,
                   _show(self.stdout), _show(self.stderr)))


PRELUDE = r'''
import os, sys, time, json, signal, subprocess
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
MARK = "@MARK@"

def _rank():
    for k in ("OMPI_COMM_WORLD_RANK", "RANK", "PERSEUS_RANK"):
        v = os.environ.get(k, "")
        if v.isdigit():
            return int(v)
    return -1

RANK = _rank()

def put(name, data=b""):
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    tmp = os.path.join(OUT, ".%s.%d.tmp" % (name, os.getpid()))
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(OUT, name))

def put_json(name, obj):
    put(name, json.dumps(obj))

def dump_env():
    put_json("env.%d.json" % os.getpid(),
             {k.hex(): v.hex() for k, v in os.environb.items()})

def exists(name):
    return os.path.exists(os.path.join(OUT, name))

def count(prefix):
    return len([n for n in os.listdir(OUT) if n.startswith(prefix)])

def wait_count(prefix, n, timeout=60):
    end = time.time() + timeout
    while count(prefix) < n:
        if time.time() > end:
            raise SystemExit("timed out waiting for %d %s* files" % (n, prefix))
        time.sleep(0.02)

def record_signals(*sigs, exit_code=None):
    """On one of `sigs`: write signal.<rank>.<pid> holding the number, then exit."""
    def handler(signum, frame):
        put("signal.%d.%d" % (RANK, os.getpid()), str(signum))
        os._exit(128 + signum if exit_code is None else exit_code)
    for s in sigs:
        signal.signal(s, handler)

def ignore_signals(*sigs):
    def handler(signum, frame):
        put("ignored.%d.%d.%d" % (RANK, os.getpid(), signum), str(signum))
    for s in sigs:
        signal.signal(s, handler)

def sleep_for(seconds):
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(min(0.2, max(0.0, end - time.time())))

# A process of the job's tree that must not outlive the job: its argv carries the marker and it
# reports alive.<what>.<pid> once it runs.
SLEEPER = ("import os, sys, time\n"
           "open(os.path.join(sys.argv[1], 'alive.%s.%d' % (sys.argv[3], os.getpid())), 'w').close()\n"
           "time.sleep(600)\n")

def spawn_child(what="child"):
    return subprocess.Popen([sys.executable, "-c", SLEEPER, OUT, MARK, what])

def spawn_setsid(what="setsid"):
    return subprocess.Popen([sys.executable, "-c", SLEEPER, OUT, MARK, what],
                            start_new_session=True, stdin=subprocess.DEVNULL)

def spawn_daemon(what="daemon"):
    """Classic double fork: the daemon is re-parented away from the rank, in its own session.
    It keeps the rank's stdout/stderr open on purpose."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.execv(sys.executable, [sys.executable, "-c", SLEEPER, OUT, MARK, what])
        finally:
            os._exit(111)
    os.waitpid(pid, 0)

put("started.%d" % os.getpid(), str(RANK))
'''


class Launcher:
    """Starts perseusrun for one test and cleans up after it."""

    def __init__(self, tmp_path):
        self.tmp = Path(tmp_path)
        self.marker = "bbmark-" + uuid.uuid4().hex
        self.out = self.tmp / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.procs = []
        self._n = 0

    # ---- rank programs -------------------------------------------------------------------
    def prog(self, body, name=None):
        """Writes an executable Python rank program (PRELUDE + body); returns its absolute path.
        The program records started.<pid> in self.out as its first act."""
        self._n += 1
        path = self.tmp / (name or "rank%d.py" % self._n)
        text = "#!%s\n" % PY + PRELUDE.replace("@MARK@", self.marker) + "\n" + body + "\n"
        path.write_text(text)
        path.chmod(0o755)
        return str(path)

    # ---- environment ---------------------------------------------------------------------
    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not _SCRUB_RE.match(k)}
        env[MARKER_VAR] = self.marker
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    # ---- running -------------------------------------------------------------------------
    def start(self, args, *, env=None, cwd=None, stdin=subprocess.DEVNULL, stdout=None,
              stderr=None):
        """Starts perseusrun with `args`; returns the Popen. stdout/stderr default to files."""
        if not (os.path.isfile(PERSEUSRUN) and os.access(PERSEUSRUN, os.X_OK)):
            pytest.fail("perseusrun binary not found at %s (set PERSEUSRUN)" % PERSEUSRUN,
                        pytrace=False)
        self._n += 1
        if stdout is None:
            stdout = open(self.tmp / ("perseusrun.%d.stdout" % self._n), "w+b")
        if stderr is None:
            stderr = open(self.tmp / ("perseusrun.%d.stderr" % self._n), "w+b")
        p = subprocess.Popen([PERSEUSRUN, *args], stdin=stdin, stdout=stdout, stderr=stderr,
                             env=self.env() if env is None else env, cwd=cwd or str(self.tmp),
                             start_new_session=True)
        p.bb_args, p.bb_stdout, p.bb_stderr, p.bb_t0 = list(args), stdout, stderr, time.monotonic()
        self.procs.append(p)
        return p

    def finish(self, p, timeout=TIMEOUT):
        """Waits for a started perseusrun; returns a Result. On timeout: SIGKILL and fail."""
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            res = self._result(p)
            pytest.fail("perseusrun did not exit within %.0f s (killed)\n%s" % (timeout, res))
        return self._result(p, rc)

    def _result(self, p, rc=None):
        elapsed = time.monotonic() - p.bb_t0
        data = []
        for f in (p.bb_stdout, p.bb_stderr):
            f.flush()
            f.seek(0)
            data.append(f.read())
        return Result(p.bb_args, p.returncode if rc is None else rc, data[0], data[1], elapsed,
                      p.pid)

    def run(self, args, *, timeout=TIMEOUT, input=None, env=None, cwd=None):
        """Runs perseusrun to completion. `input` (bytes) is fed through a pipe, then closed."""
        if input is None:
            p = self.start(args, env=env, cwd=cwd)
            return self.finish(p, timeout)
        p = self.start(args, env=env, cwd=cwd, stdin=subprocess.PIPE)

        def feed():
            try:
                p.stdin.write(input)
            except (BrokenPipeError, OSError, ValueError):
                pass
            finally:
                try:
                    p.stdin.close()
                except OSError:
                    pass

        t = threading.Thread(target=feed, daemon=True)
        t.start()
        return self.finish(p, timeout)

    # ---- files written by rank programs --------------------------------------------------
    def files(self, prefix):
        return sorted(n for n in os.listdir(self.out) if n.startswith(prefix))

    def wait_files(self, prefix, n, timeout=TIMEOUT, proc=None):
        end = time.monotonic() + timeout
        while len(self.files(prefix)) < n:
            if proc is not None and proc.poll() is not None:
                pytest.fail("perseusrun exited (%s) before %d %s* files appeared\n%s"
                            % (proc.returncode, n, prefix, self._result(proc)))
            if time.monotonic() > end:
                msg = "timed out waiting for %d %s* files; have %s" % (n, prefix, self.files(""))
                if proc is not None:
                    msg += "\n" + str(self._result(proc))
                pytest.fail(msg)
            time.sleep(0.05)
        return self.files(prefix)

    def read(self, name):
        return (self.out / name).read_bytes()

    def envs(self):
        """Environments dumped by dump_env(), as a list of {str: str} (surrogateescape)."""
        envs = []
        for name in self.files("env."):
            raw = json.loads(self.read(name))
            envs.append({bytes.fromhex(k).decode("utf-8", "surrogateescape"):
                         bytes.fromhex(v).decode("utf-8", "surrogateescape")
                         for k, v in raw.items()})
        return envs

    def envs_by_rank(self, key="OMPI_COMM_WORLD_RANK"):
        envs = self.envs()
        by_rank = {}
        for e in envs:
            assert key in e, "a rank has no %s; its environment: %r" % (key, sorted(e))
            r = int(e[key])
            assert r not in by_rank, "two ranks got %s=%d" % (key, r)
            by_rank[r] = e
        return by_rank

    def started(self):
        return self.files("started.")

    # ---- processes -----------------------------------------------------------------------
    def marked(self, where=("cmdline",)):
        """{pid: cmdline} of live (non-zombie) processes whose cmdline (and/or environ) holds
        this test's marker."""
        return find_marked(self.marker, where)

    def wait_gone(self, within, where=("cmdline",)):
        """Polls until no marked process is left, at most `within` seconds; returns leftovers."""
        end = time.monotonic() + within
        while True:
            left = self.marked(where)
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.1)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            if p.stdin:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for _ in range(20):
            left = find_marked(self.marker, ("cmdline", "environ"))
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.1)
        for p in self.procs:
            for f in (p.bb_stdout, p.bb_stderr):
                try:
                    f.close()
                except Exception:
                    pass


def _proc_state(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:data.rindex(b")") + 3]


def find_marked(marker, where=("cmdline",)):
    needle = marker.encode()
    me = os.getpid()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            hit = False
            cmd = b""
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read()
            if "cmdline" in where and needle in cmd:
                hit = True
            if not hit and "environ" in where:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    hit = needle in f.read()
            if hit and _proc_state(pid) not in (b"Z", b"X"):
                found[pid] = cmd.replace(b"\0", b" ").decode("utf-8", "replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError, OSError):
            continue
    return found


@pytest.fixture
def launcher(tmp_path):
    lr = Launcher(tmp_path)
    yield lr
    lr.cleanup()


@pytest.fixture
def python_on_path(tmp_path):
    """A directory with `python` -> this interpreter, for the seed command 'python train.py'."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "python").symlink_to(PY)
    return d


# ---- expectations shared by several files ---------------------------------------------------

ENV_PROG = "dump_env()\nprint('hello from rank %d' % RANK, flush=True)\n"


def single_host_expected(rank, size):
    """What every rank of a job that runs entirely on the local host must see."""
    r, n = str(rank), str(size)
    return {
        "OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": n,
        "OMPI_COMM_WORLD_LOCAL_RANK": r, "OMPI_COMM_WORLD_LOCAL_SIZE": n,
        "OMPI_COMM_WORLD_NODE_RANK": r,
        "RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": n,
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": r, "ROLE_WORLD_SIZE": n,
        "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "HOROVOD_RANK": r, "HOROVOD_SIZE": n, "HOROVOD_LOCAL_RANK": r, "HOROVOD_LOCAL_SIZE": n,
        "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
        "PERSEUS_RANK": r, "PERSEUS_SIZE": n, "PERSEUS_LOCAL_RANK": r, "PERSEUS_LOCAL_SIZE": n,
        "PERSEUS_CROSS_RANK": "0", "PERSEUS_CROSS_SIZE": "1", "PERSEUS_NODE_RANK": "0",
        "PERSEUS_NUM_NODES": "1",
        # --gpu-bind list (the default) on a host without GPUs, CUDA_VISIBLE_DEVICES unset.
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(size)),
    }


def check_single_host_envs(by_rank, size, extra=None):
    """Asserts the exact rank variables of a single-host job of `size` ranks; `extra` maps
    variable -> expected value (None: must be unset), or a function rank -> value."""
    assert sorted(by_rank) == list(range(size)), "ranks that ran: %s" % sorted(by_rank)
    bad = []
    for rank, env in sorted(by_rank.items()):
        want = single_host_expected(rank, size)
        for k, v in (extra or {}).items():
            want[k] = v(rank) if callable(v) else v
        for k, v in want.items():
            if env.get(k) != v:
                bad.append("rank %d: %s=%r, expected %r" % (rank, k, env.get(k), v))
    ports = {e.get("MASTER_PORT") for e in by_rank.values()}
    if len(ports) != 1:
        bad.append("MASTER_PORT differs between ranks: %s" % ports)
    else:
        port = ports.pop()
        if not (port and port.isdigit() and 1 <= int(port) <= 65535):
            bad.append("MASTER_PORT=%r is not a port number" % port)
    ids = {e.get("PERSEUS_JOB_ID") for e in by_rank.values()}
    if len(ids) != 1:
        bad.append("PERSEUS_JOB_ID differs between ranks: %s" % ids)
    else:
        job = ids.pop()
        if not (job and re.fullmatch(r"[0-9a-fA-F]+", job)):
            bad.append("PERSEUS_JOB_ID=%r is not a hex string" % job)
    assert not bad, "\n".join(bad)


def run_env_job(launcher, args, size, *, extra=None, env=None, prog_args=(), timeout=TIMEOUT):
    """Runs ENV_PROG under perseusrun `args`, checks exit 0 and the single-host environment."""
    prog = launcher.prog(ENV_PROG)
    res = launcher.run([*args, PY, prog, *prog_args], env=env, timeout=timeout)
    assert res.rc == 0, str(res)
    by_rank = launcher.envs_by_rank()
    assert len(launcher.envs()) == size, "expected %d ranks\n%s" % (size, res)
    check_single_host_envs(by_rank, size, extra)
    return res, by_rank


def expect_usage_error(launcher, args, *needles, with_prog=True, code=2):
    """Runs perseusrun `args` (+ a rank program that would leave started.<pid>), expects exit
    `code`, a "perseusrun: error: " message naming every needle, and no rank started."""
    full = list(args)
    if with_prog:
        full += [PY, launcher.prog("put('ran')")]
    res = launcher.run(full)
    assert res.rc == code, str(res)
    errors = [l for l in res.own_messages() if l.startswith("perseusrun: error: ")]
    assert errors, "no line starting with 'perseusrun: error: '\n%s" % res
    for needle in needles:
        assert needle in res.err, "the message does not name %r\n%s" % (needle, res)
    time.sleep(0.2)
    assert launcher.started() == [], "a rank was started: %s\n%s" % (launcher.started(), res)
    assert res.stdout == b"", str(res)
    return res


def own_addresses():
    """This machine's non-loopback addresses (from `hostname -I`), IPv4 first."""
    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                               timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return []
    addrs = [w for w in words if not w.startswith("127.") and w != "::1" and
             not w.lower().startswith("fe80:")]
    return sorted(addrs, key=lambda a: ":" in a)


# ---- remote hosts: network namespaces running sshd (testhosts.py) --------------------------

@pytest.fixture(scope="module")
def test_hosts():
    """Three SSH hosts (network namespaces on this machine, login user root), shared by the
    tests of one module; skips when this machine cannot provide them (not root, no ip/sshd).
    Tests must leave the hosts as they found them (restart what they stop)."""
    from testhosts import TestHosts
    with TestHosts(3) as hosts:
        yield hosts


@pytest.fixture
def make_test_hosts():
    """A factory make_test_hosts(count, **options) -> a started TestHosts of the test's own,
    closed after the test (options: fast_user=True for a /bin/sh login user, ...)."""
    from testhosts import TestHosts
    made = []

    def make(count, **options):
        hosts = TestHosts(count, **options)
        hosts.start()
        made.append(hosts)
        return hosts

    yield make
    errors = []
    for hosts in reversed(made):
        errors += hosts.close()
    assert not errors, "clean-up of test hosts failed:\n" + "\n".join(errors)
