"""A per-host agent that dies (SIGKILL, the OOM killer) leaves nothing of the job behind: its
ranks die with it (PDEATHSIG), and the job guard ends what the ranks started (children, setsid'd
sessions, new process groups, double-forked daemons) and removes the job's cgroup and secret
folder, locally and on an SSH host, with the job cgroup (the default where cgroup v2 is
writable) and without it (PERSEUS_AGENT_CGROUP=0: the guard's process scans).

Every rank records its cgroup and its secret file's path, so that the test can check that the
rank was in the job's cgroup and that both are gone afterwards."""

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import PY

# Four processes per rank that outlive it unless someone ends them, each reporting alive.<what>.
FORKING_RANK = (
    "def spawn_new_group(what='pgid'):\n"
    "    return subprocess.Popen([sys.executable, '-c', SLEEPER, OUT, MARK, what],\n"
    "                            process_group=0, stdin=subprocess.DEVNULL)\n"
    "put('cgroup.%d' % RANK, open('/proc/self/cgroup').read())\n"
    "put('secret.%d' % RANK, os.environ.get('PERSEUS_SECRET_FILE', ''))\n"
    "spawn_child()\n"
    "spawn_setsid()\n"
    "spawn_daemon()\n"
    "spawn_new_group()\n"
    "put('ready.%d' % RANK)\n"
    "sleep_for(120)\n")
PER_RANK = 4


def cgroup2_mount():
    """(mount point, root) of the cgroup v2 hierarchy, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            if after.split(" ")[0] == "cgroup2":
                fields = before.split(" ")
                return fields[4], fields[3]
    return None


def cgroup_v2_writable():
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        return False
    with open("/proc/self/cgroup") as f:
        own = [l[3:].strip() for l in f if l.startswith("0::")]
    return bool(own) and os.access(mount[0] + own[0], os.W_OK)


def folder_of(cgroup_text):
    """The folder of a process's v2 cgroup, from the text of its /proc/<pid>/cgroup."""
    mount_point, root = cgroup2_mount()
    path = [l[3:] for l in cgroup_text.splitlines() if l.startswith("0::")][0]
    if root != "/":
        path = path[len(root):]
    return mount_point + (path if path != "/" else "")


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2:].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, ValueError):
                pass
    return found


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_agent(pid):
    return b"--agent" in cmdline(pid) and comm(pid) == "perseusrun"


def wait_for(find, within=10):
    end = time.monotonic() + within
    while time.monotonic() < end:
        found = find()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail("not found within %d s" % within)


def start_job(launcher, hosts_arg, nranks, env):
    p = launcher.start(["-H", hosts_arg, PY, launcher.prog(FORKING_RANK), launcher.marker],
                       env=env)
    launcher.wait_files("ready.", nranks, proc=p)
    launcher.wait_files("alive.", PER_RANK * nranks, proc=p)
    marked = launcher.marked()
    assert len(marked) >= (PER_RANK + 1) * nranks, "the scan does not see the job: %s" % marked
    return p


def job_leftovers(launcher):
    """The rank's cgroups and secret folders that still exist."""
    left = []
    for name in launcher.files("cgroup."):
        folder = folder_of(launcher.read(name).decode())
        if os.path.basename(folder).startswith("perseus-") and os.path.exists(folder):
            left.append(folder)
    for name in launcher.files("secret."):
        path = launcher.read(name).decode()
        if path and os.path.exists(os.path.dirname(path)):
            left.append(os.path.dirname(path))
    return left


def check_in_job_cgroup(launcher, want):
    folders = {folder_of(launcher.read(n).decode()) for n in launcher.files("cgroup.")}
    in_job = {f for f in folders if os.path.basename(f).startswith("perseus-")}
    if want:
        assert len(in_job) == 1 and in_job == folders, "ranks' cgroups: %s" % folders
    else:
        assert not in_job, "PERSEUS_AGENT_CGROUP=0, yet the ranks are in %s" % in_job


def kill_and_check(launcher, p, agent, extra_leftovers=lambda: {}):
    os.kill(agent, signal.SIGKILL)
    t0 = time.monotonic()
    end = t0 + 10
    while time.monotonic() < end and (launcher.marked() or extra_leftovers()):
        time.sleep(0.05)
    took = time.monotonic() - t0
    assert launcher.marked() == {}, ("10 s after SIGKILL of the agent these are alive: %s"
                                     % launcher.marked())
    assert extra_leftovers() == {}, "10 s after SIGKILL of the agent: %s" % extra_leftovers()
    res = launcher.finish(p)
    ended = time.monotonic() - t0
    assert res.rc != 0, "a job whose agent was killed exited 0\n%s" % res
    assert ended < 10, "perseusrun took %.1f s to end a job whose agent died\n%s" % (ended, res)
    # The guard (it inherited the marker in its environment locally) is gone too.
    left = launcher.wait_gone(5, ("cmdline", "environ"))
    assert left == {}, "after perseusrun exited: %s" % left
    assert job_leftovers(launcher) == [], "left behind: %s" % job_leftovers(launcher)
    print("all of the job gone %.2f s, perseusrun exited (%d) %.2f s after SIGKILL of the agent"
          % (took, res.rc, ended))
    return res


@pytest.mark.parametrize("cgroup", ["1", "0"])
def test_sigkill_of_local_agent_leaves_nothing(launcher, cgroup):
    if cgroup == "1" and not cgroup_v2_writable():
        pytest.skip("cgroup v2 is not writable here")
    p = start_job(launcher, "localhost:3", 3, launcher.env(PERSEUS_AGENT_CGROUP=cgroup))
    check_in_job_cgroup(launcher, cgroup == "1")
    agents = [c for c in children_of(p.pid) if is_agent(c)]
    assert len(agents) == 1, "children of perseusrun: %s" % children_of(p.pid)
    guards = [c for c in children_of(agents[0]) if comm(c) == "perseus-guard"]
    assert len(guards) == 1, "the agent has no guard: %s" % children_of(agents[0])
    if cgroup == "0":
        time.sleep(1)  # the guard's scans (every 0.1 s) see a process after it started
    kill_and_check(launcher, p, agents[0])


@pytest.mark.parametrize("cgroup", ["1", "0"])
def test_normal_end_removes_cgroup_and_daemons(launcher, cgroup):
    """Ranks that start daemons and exit 0: the job ends 0 and its cgroup, files and daemons
    are gone when perseusrun returns (the agent's own clean-up, then the guard's)."""
    if cgroup == "1" and not cgroup_v2_writable():
        pytest.skip("cgroup v2 is not writable here")
    prog = launcher.prog(FORKING_RANK.replace("sleep_for(120)", "wait_count('alive.', 8)"))
    res = launcher.run(["-H", "localhost:2", "--kill-grace", "1", PY, prog, launcher.marker],
                       env=launcher.env(PERSEUS_AGENT_CGROUP=cgroup))
    assert res.rc == 0, str(res)
    check_in_job_cgroup(launcher, cgroup == "1")
    assert launcher.marked(("cmdline", "environ")) == {}, launcher.marked(("cmdline", "environ"))
    assert job_leftovers(launcher) == [], "left behind: %s" % job_leftovers(launcher)


def test_ranks_that_end_at_once_get_no_cgroup_warning(launcher):
    """A rank that has already ended when the agent checks it (`true`) has left the job's
    cgroup as every exiting process does; it was in it before its exec, so the agent must not
    warn that it is not. Before the fix about a third of these jobs warned."""
    if not cgroup_v2_writable():
        pytest.skip("cgroup v2 is not writable here: no job cgroup, no check")
    for _ in range(6):
        res = launcher.run(["-H", "localhost:8", "true"],
                           env=launcher.env(PERSEUS_AGENT_CGROUP="1"))
        assert res.rc == 0, str(res)
        assert "not in the job's cgroup" not in res.err, str(res)


def test_bad_cgroup_setting(launcher):
    res = launcher.run(["-np", "1", PY, launcher.prog("put('ran')")],
                       env=launcher.env(PERSEUS_AGENT_CGROUP="yes"))
    assert res.rc == 2, str(res)
    assert "PERSEUS_AGENT_CGROUP=yes" in res.err and "expected 1" in res.err, str(res)
    assert launcher.started() == [], str(res)


@pytest.fixture
def one_host(launcher, make_test_hosts):
    hosts = make_test_hosts(1)
    yield hosts
    launcher.cleanup()
    hosts.kill_leftovers()


def mount_cgroup2_on(hosts, i):
    """`ip netns exec` gives a host a fresh /sys without cgroups (so agents there fall back to
    scans); mounts the cgroup v2 hierarchy in the mount namespace of host i's sshd."""
    subprocess.run(["nsenter", "-t", str(hosts.sshd_pid(i)), "-m", "mount", "-t", "cgroup2",
                    "cgroup2", "/sys/fs/cgroup"], check=True, timeout=10)


@pytest.mark.parametrize("cgroup", ["mounted", "absent"])
def test_sigkill_of_remote_agent_leaves_nothing(launcher, one_host, cgroup):
    from test_ssh import remote_leftovers, ssh_env
    if cgroup == "mounted":
        if not cgroup_v2_writable() or not shutil.which("nsenter"):
            pytest.skip("cgroup v2 is not writable here, or no nsenter")
        mount_cgroup2_on(one_host, 0)
    p = start_job(launcher, one_host.addresses[0] + ":2", 2, ssh_env(launcher, one_host.home))
    check_in_job_cgroup(launcher, cgroup == "mounted")
    agents = wait_for(lambda: [q for q in one_host.pids_on(0) if is_agent(q)])
    assert len(agents) == 1, "agents on the host: %s" % agents
    if cgroup == "absent":
        time.sleep(1)  # the guard's scans (every 0.1 s) see a process after it started
    kill_and_check(launcher, p, agents[0], lambda: remote_leftovers(one_host))
