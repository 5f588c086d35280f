"""The test-host infrastructure itself (testhosts.py): hosts come up in their own namespaces,
reach each other, and everything they consist of is gone afterwards, however they end."""

import concurrent.futures
import ipaddress
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import testhosts
from testhosts import TestHosts

HERE = os.path.dirname(os.path.abspath(__file__))


def parallel(fn, items):
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(items))) as ex:
        return list(ex.map(fn, items))


def snapshot(hosts):
    """What a TestHosts consists of, to check afterwards that none of it is left."""
    pids = set()
    for i in range(len(hosts.namespaces)):
        pids.update(hosts.pids_on(i))
    pids.update(p.pid for p in hosts._procs.values())
    return {"prefix": hosts.prefix, "tmpdir": hosts.tmpdir, "pids": sorted(pids),
            "user": hosts.created_user}


def leftovers(snap):
    """Everything of a snapshot that still exists, as a list of descriptions."""
    prefix = snap["prefix"]
    assert prefix and prefix.startswith("ps") and len(prefix) == 8, prefix
    left = []
    links = [l["ifname"] for l in testhosts._ip_json("link", "show")
             if l.get("ifname", "").startswith(prefix)]
    if links:
        left.append("links %s" % links)
    ns = [n for n in testhosts._netns_names() if n.startswith(prefix)]
    if ns:
        left.append("namespaces %s" % ns)
    alive = [p for p in snap["pids"] if testhosts._pid_alive(p)]
    if alive:
        left.append("processes %s" % alive)
    if snap["tmpdir"] and os.path.exists(snap["tmpdir"]):
        left.append("directory %s" % snap["tmpdir"])
    users = [p.pw_name for p in pwd.getpwall() if p.pw_name.startswith(prefix)]
    if users:
        left.append("users %s" % users)
    return left


def assert_nothing_left(snap):
    left = leftovers(snap)
    # Deleting a namespace is synchronous for what we delete explicitly; allow the kernel a
    # moment anyway before calling it a leak.
    end = time.monotonic() + 2
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = leftovers(snap)
    assert not left, "left behind: %s" % "; ".join(left)


# ---- hosts shared by the module ------------------------------------------------------------

def test_hosts_come_up(test_hosts):
    h = test_hosts
    assert len(h.addresses) == 3 and len(set(h.addresses)) == 3
    assert h.network.prefixlen == 24 and h.network.subnet_of(
        ipaddress.ip_network("10.0.0.0/8"))
    assert h.bridge_address == str(h.network.network_address + 1)
    for i, addr in enumerate(h.addresses):
        assert ipaddress.ip_address(addr) in h.network
        assert h.sshd_pid(i) in h.pids_on(i)
        assert "ssh-ed25519 " in h.host_key_pub(i)
    assert h.user == "root"
    assert len(h.prefix) == 8 and all(len(n) <= 15 for n in [h.bridge, *h.veths])
    env = h.env()
    assert env["HOME"] == h.home and "SSH_AUTH_SOCK" not in env
    assert os.path.isfile(os.path.join(h.home, ".ssh", "id_ed25519"))
    assert h.client_key == os.path.join(h.home, ".ssh", "id_ed25519")
    assert h.known_hosts == os.path.join(h.home, ".ssh", "known_hosts")


def test_commands_run_in_their_host(test_hosts):
    h = test_hosts
    results = parallel(lambda i: h.ssh(i, "ip -4 -o addr show"), range(3))
    for i, p in enumerate(results):
        assert p.returncode == 0, p.stderr
        assert "inet %s/24" % h.addresses[i] in p.stdout, p.stdout
        for j, other in enumerate(h.addresses):
            if j != i:
                assert "inet %s/" % other not in p.stdout, p.stdout
        assert "inet %s/" % h.bridge_address not in p.stdout, p.stdout


def test_hosts_reach_each_other_and_this_host(test_hosts):
    h = test_hosts
    have_ping = shutil.which("ping") is not None

    def probe(i):
        others = [a for j, a in enumerate(h.addresses) if j != i]
        # TCP to every other host's sshd (bash's /dev/tcp; the login shell may be sh).
        script = "".join("exec 3<>/dev/tcp/%s/22 && head -c 4 <&3 && echo ' %s' && exec 3<&-;"
                         % (a, a) for a in others)
        cmd = "bash -c %s" % shlex.quote(script)
        if have_ping:
            cmd += "; " + "; ".join("ping -c1 -W2 -q %s >/dev/null && echo ping %s" % (a, a)
                                    for a in others + [h.bridge_address])
        return h.ssh(i, cmd)

    for i, p in enumerate(parallel(probe, range(3))):
        assert p.returncode == 0, "host %d: %s%s" % (i, p.stdout, p.stderr)
        for j, a in enumerate(h.addresses):
            if j != i:
                assert "SSH- %s" % a in p.stdout, p.stdout
                if have_ping:
                    assert "ping %s" % a in p.stdout, p.stdout
        if have_ping:
            assert "ping %s" % h.bridge_address in p.stdout, p.stdout


def test_known_hosts_plain_and_hashed(test_hosts):
    h = test_hosts
    with open(h.known_hosts) as f:
        plain = f.read().splitlines()
    with open(h.hashed_known_hosts) as f:
        hashed = f.read().splitlines()
    assert plain == ["%s %s" % (a, " ".join(h.host_key_pub(i).split()[:2]))
                     for i, a in enumerate(h.addresses)]
    assert len(hashed) == 3 and all(l.startswith("|1|") for l in hashed), hashed
    assert not any(a in l for a in h.addresses for l in hashed)
    assert not os.path.exists(h.hashed_known_hosts + ".old")
    p = h.ssh(2, "echo ok", known_hosts=h.hashed_known_hosts)
    assert (p.returncode, p.stdout) == (0, "ok\n"), p.stderr


# ---- hosts of their own --------------------------------------------------------------------

def test_cleanup_leaves_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with TestHosts(2) as h:
        assert signal.getsignal(signal.SIGTERM) == h._on_sigterm
        assert h.ssh(1, "true").returncode == 0
        snap = snapshot(h)
        assert len(snap["pids"]) >= 2
    assert_nothing_left(snap)
    assert signal.getsignal(signal.SIGTERM) == before


def test_cleanup_after_exception_in_block():
    with pytest.raises(ZeroDivisionError):
        with TestHosts(2) as h:
            # A session still running on the host when the block is left.
            sleeper = subprocess.Popen(h.ssh_args(0, "sleep 60"), env=h.env(),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            end = time.monotonic() + 10
            while not any(open("/proc/%d/cmdline" % p, "rb").read().startswith(b"sleep")
                          for p in h.pids_on(0) if os.path.exists("/proc/%d/cmdline" % p)):
                assert time.monotonic() < end, "remote sleep did not start"
                time.sleep(0.05)
            snap = snapshot(h)
            1 / 0
    sleeper.wait(10)
    assert_nothing_left(snap)


class _FailingHosts(TestHosts):
    """Fails while starting the second sshd: network, keys and one sshd exist by then."""

    def _start_sshd(self, i):
        if i == 1:
            self.failed_snapshot = snapshot(self)
            raise RuntimeError("injected failure")
        super()._start_sshd(i)


def test_cleanup_after_failed_setup():
    h = _FailingHosts(3)
    with pytest.raises(RuntimeError, match="injected failure"):
        with h:
            pytest.fail("the block must not run")
    snap = h.failed_snapshot
    assert len(snap["pids"]) >= 1
    assert_nothing_left(snap)
    assert h.close() == []  # closing twice is harmless


def test_stop_and_start_host(make_test_hosts):
    h = make_test_hosts(1)
    session = subprocess.Popen(h.ssh_args(0, "sleep 60"), env=h.env(),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    end = time.monotonic() + 10
    while len(h.pids_on(0)) < 3:  # listener + session's sshd(s) + sleep
        assert time.monotonic() < end, "session did not start"
        time.sleep(0.05)
    h.stop_host(0)
    assert h.sshd_pid(0) is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((h.addresses[0], 22), timeout=5).close()
    p = h.ssh(0, "true")
    assert p.returncode == 255 and "Connection refused" in p.stderr, p.stderr
    assert session.poll() is None, "stopping sshd alone keeps open sessions"
    h.stop_host(0, kill_sessions=True)
    assert h.pids_on(0) == []
    session.communicate(timeout=10)
    assert session.returncode != 0
    h.start_host(0)
    p = h.ssh(0, "echo back")
    assert (p.returncode, p.stdout) == (0, "back\n"), p.stderr


def test_change_host_key(make_test_hosts, tmp_path):
    h = make_test_hosts(2)
    old = h.host_key_pub(1)
    h.change_host_key(1)
    new = h.host_key_pub(1)
    assert new.split()[1] != old.split()[1]
    for kh in (h.known_hosts, h.hashed_known_hosts):
        p = h.ssh(1, "echo should-not-run", known_hosts=kh,
                  options=["-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=INFO"])
        assert p.returncode == 255 and p.stdout == "", p
        assert "Host key verification failed" in p.stderr, p.stderr
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in p.stderr, p.stderr
    assert h.ssh(0, "true").returncode == 0  # the other host is untouched
    fixed = tmp_path / "known_hosts"
    fixed.write_text("%s %s\n" % (h.addresses[1], " ".join(new.split()[:2])))
    p = h.ssh(1, "echo ok", known_hosts=str(fixed))
    assert (p.returncode, p.stdout) == (0, "ok\n"), p.stderr


def test_fast_user(make_test_hosts):
    h = make_test_hosts(1, fast_user=True)
    assert h.user != "root" and h.user == h.created_user
    pw = pwd.getpwnam(h.user)
    assert pw.pw_shell == "/bin/sh" and pw.pw_dir == h.user_home
    p = h.ssh(0, 'id -un; echo "$0"; pwd')
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [h.user, "sh", h.user_home], p.stdout
    assert h.ssh(0, "id -u", user="root").stdout == "0\n"  # root may still log in
    snap = snapshot(h)
    assert h.close() == []
    assert_nothing_left(snap)
    with pytest.raises(KeyError):
        pwd.getpwnam(snap["user"])


def test_concurrent_instances_do_not_collide():
    with TestHosts(1) as a, TestHosts(1) as b:
        assert a.prefix != b.prefix and a.network != b.network
        assert a.ssh(0, "true").returncode == 0 and b.ssh(0, "true").returncode == 0


# ---- atexit and SIGTERM, in a process of their own -----------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, %(here)r)
    from testhosts import TestHosts
    h = TestHosts(2)
    h.start()
    pids = sorted({p for i in range(2) for p in h.pids_on(i)})
    daemons = [h.sshd_pid(i) for i in range(2)]
    print(json.dumps({"prefix": h.prefix, "tmpdir": h.tmpdir, "pids": pids, "daemons": daemons,
                      "user": None}), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(60)
        sys.exit(3)
    sys.exit(0)  # never closed explicitly: atexit must clean up
""")


def run_child(mode):
    TestHosts.check_prerequisites()
    return subprocess.Popen([sys.executable, "-c", CHILD % {"here": HERE}, mode],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_atexit_cleans_up():
    p = run_child("exit")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    snap = json.loads(out.splitlines()[0])
    assert snap["pids"]
    assert_nothing_left(snap)
    assert "clean-up" not in err, err


def test_sigterm_cleans_up():
    p = run_child("wait")
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        snap = json.loads(line)
        # The listening sshds must be running before the signal. (Not every pid of the
        # snapshot: the readiness probe's per-connection sshd child may still be exiting when
        # the snapshot is taken, and be gone a moment later.)
        assert all(pid is not None for pid in snap["daemons"]), snap
        assert set(snap["daemons"]) <= set(snap["pids"]), snap
        assert all(testhosts._pid_alive(pid) for pid in snap["daemons"]), snap
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            # A check above failed: SIGTERM first, so that the child removes its hosts (a SIGKILL
            # would leave its sshds and namespaces behind).
            p.terminate()
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert p.returncode == -signal.SIGTERM, (p.returncode, err)
    assert_nothing_left(snap)
    assert "clean-up" not in err, err
