"""Real remote hosts on one machine, for the black-box tests of perseusrun's SSH launch.

    with TestHosts(3) as hosts:
        hosts.addresses        # ['10.37.142.2', '10.37.142.3', '10.37.142.4']
        hosts.ssh(0, "true")   # OpenSSH client, returns a CompletedProcess
        subprocess.run([PERSEUSRUN, "-H", ",".join(hosts.addresses), ...], env=hosts.env())

Each host is a network namespace joined to a Linux bridge on this machine by a veth pair, with its
own address in a /24 of 10.0.0.0/8 picked at random (the bridge holds .1, the hosts .2, .3, ...)
and its own sshd (own host key, own config, all in a temporary directory). The namespaces share
this machine's process table and file system: a path that exists here exists "on" every host,
and `ip netns exec` does not change the hostname, so identify a host by its address.

The client side gets a temporary HOME (see `home`, `env()`): HOME/.ssh/id_ed25519 (+ .pub) is
authorized on every host, HOME/.ssh/known_hosts has one plain entry per host address and
`hashed_known_hosts` the same entries hashed (ssh-keygen -H). OpenSSH's `ssh` ignores $HOME (it
uses the passwd entry), so `ssh()` passes the key and known_hosts explicitly; a launcher built on
libssh2 that looks under $HOME finds them through `env()`.

Needs root, iproute2 (`ip`) and openssh-server/openssh-client; otherwise it skips the test
(pytest.skip) or, outside pytest, raises TestHostsUnavailable. Everything it creates (temporary
directory, user, bridge, namespaces, veths, sshd processes) is recorded as it is created and
undone in reverse order by close(): on leaving the with-block, at interpreter exit (atexit) and on
SIGTERM, also when set-up failed halfway. It never touches namespaces, links, users or processes
it did not create (except processes that run inside its own namespaces, which it SIGKILLs before
deleting them).

Standard library only (pytest is used when it is importable).
"""

import atexit
import ipaddress
import json
import os
import pwd
import random
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

IP = shutil.which("ip") or "/usr/sbin/ip"
SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and needs an absolute path
SSH = shutil.which("ssh") or "/usr/bin/ssh"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
USERADD = shutil.which("useradd") or "/usr/sbin/useradd"
USERDEL = shutil.which("userdel") or "/usr/sbin/userdel"

READY_TIMEOUT = 10.0


class TestHostsUnavailable(Exception):
    """This machine cannot provide test hosts (not root, tools missing, no CAP_NET_ADMIN)."""


class TestHostsError(RuntimeError):
    """Set-up or clean-up of the test hosts failed."""


# pytest must not collect these as test classes.
TestHostsUnavailable.__test__ = False
TestHostsError.__test__ = False


def skip_or_raise(msg, error):
    """pytest.skip(msg) under pytest, else raises error(msg): what a fixture of real machinery
    (these hosts, slurmcluster.py's cluster) does when this machine cannot provide it."""
    if pytest is not None:
        pytest.skip(msg)
    raise error(msg)


def _unavailable(msg):
    skip_or_raise("test hosts unavailable: " + msg, TestHostsUnavailable)


def unavailable_reason():
    """Why this machine cannot provide test hosts, or None when it can (as far as can be told
    without creating anything)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (network namespaces, a bridge, sshd)"
    missing = [name for name, path in (("ip (iproute2)", IP), ("sshd (openssh-server)", SSHD),
                                       ("ssh (openssh-client)", SSH),
                                       ("ssh-keygen (openssh-client)", SSH_KEYGEN))
               if not (os.path.isfile(path) and os.access(path, os.X_OK))]
    if missing:
        return "missing " + ", ".join(missing)
    return None


def run_command(args, check=True, error=None, **kw):
    """Runs args (no stdin, text output captured, 30 s unless told); a failure with check
    raises `error` (TestHostsError) naming the command, its status and its output."""
    kw.setdefault("timeout", 30)
    p = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise (error or TestHostsError)("command %r failed with exit status %d: %s"
                                        % (args, p.returncode, (p.stderr or p.stdout).strip()))
    return p


_run = run_command


def _ip_json(*args):
    out = _run([IP, "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


def _link_names():
    return {l.get("ifname") for l in _ip_json("link", "show")}


def _netns_names():
    out = _run([IP, "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _pid_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return False
    state = data[data.rindex(b")") + 2:data.rindex(b")") + 3]
    return state not in (b"Z", b"X")


def _pids_in_netns(ns_name):
    """Pids of the live processes whose network namespace is the named one."""
    try:
        ino = os.stat("/run/netns/" + ns_name).st_ino
    except OSError:
        return []
    want = "net:[%d]" % ino
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.readlink("/proc/%s/ns/net" % entry) == want:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def _kill_all_in_netns(ns_name, timeout=10.0):
    """SIGKILLs every process inside the namespace until none is left (bounded)."""
    end = time.monotonic() + timeout
    while True:
        pids = [p for p in _pids_in_netns(ns_name) if _pid_alive(p)]
        if not pids:
            return
        if time.monotonic() > end:
            raise TestHostsError("processes %s in namespace %s survive SIGKILL" % (pids, ns_name))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


class UndoOnExit:
    """What an object that owns resources (TestHosts, SlurmCluster) needs to give them all back:
    close() undoes its _undo list ([(description, callable)], recorded as things are created) in
    reverse order, also at interpreter exit (the object's _atexit(), registered when it starts)
    and on SIGTERM, whose handler runs _atexit() and then forwards the signal to the handler
    before it, or dies of it; a SIGTERM during close() waits for close() to finish. The object
    sets _undo = [], _entered, _closed, _closing = False, _prev_sigterm = None,
    _sigterm_installed = False and _pending_sigterm = None, and calls _install_sigterm() when it
    starts."""

    def close(self):
        """Undoes everything created, in reverse order; returns a list of error messages."""
        errors = []
        if self._closed:
            return errors
        self._closed = True
        self._closing = True
        while self._undo:
            what, fn = self._undo.pop()
            try:
                fn()
            except Exception as e:  # keep going: undo everything that can be undone
                errors.append("%s: %s" % (what, e))
        if self._entered:
            try:
                atexit.unregister(self._atexit)
            except Exception:
                pass
            self._restore_sigterm()
        self._closing = False
        if self._pending_sigterm is not None:
            # SIGTERM came while cleaning up: finish first, then act on it.
            self._forward_sigterm(*self._pending_sigterm)
        return errors

    def _install_sigterm(self):
        try:
            prev = signal.getsignal(signal.SIGTERM)
            if prev == signal.SIG_IGN:
                return  # whoever ignores SIGTERM does not want to die of it
            if prev is None:  # a handler not installed from Python: the best we can restore
                prev = signal.SIG_DFL
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread
            return
        self._prev_sigterm = prev
        self._sigterm_installed = True

    def _restore_sigterm(self):
        if not self._sigterm_installed:
            return
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
                self._sigterm_installed = False
        except ValueError:
            pass
        # Otherwise someone installed a handler after ours; ours stays in their chain and only
        # forwards to the previous handler from now on.

    def _on_sigterm(self, signum, frame):
        if self._closing:
            self._pending_sigterm = (signum, frame)
            return
        self._atexit()
        self._forward_sigterm(signum, frame)

    def _forward_sigterm(self, signum, frame):
        self._pending_sigterm = None
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
            return
        # SIG_DFL (or None: set outside Python): die of the signal as we would have.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


class TestHosts(UndoOnExit):
    """`count` SSH hosts in network namespaces; a context manager. See the module docstring.

    Attributes (valid once entered): addresses, bridge_address, network, prefix, namespaces,
    home, client_key, client_key_pub, known_hosts, hashed_known_hosts, user, tmpdir.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, count, *, fast_user=False, ready_timeout=READY_TIMEOUT, tmp_root=None):
        if count < 1 or count > 250:
            raise ValueError("count must be 1..250")
        self.count = count
        self.fast_user = fast_user
        self.ready_timeout = ready_timeout
        self.tmp_root = tmp_root
        self.prefix = None
        self.tmpdir = None
        self.network = None
        self.bridge = None
        self.bridge_address = None
        self.addresses = []
        self.namespaces = []
        self.veths = []
        self.home = None
        self.client_key = None
        self.client_key_pub = None
        self.known_hosts = None
        self.hashed_known_hosts = None
        self.user = "root"
        self.user_home = None
        self.created_user = None
        self._procs = {}     # host index -> Popen of its listening sshd
        self._undo = []      # [(description, callable)], undone in reverse
        self._entered = False
        self._closed = False
        self._prev_sigterm = None
        self._sigterm_installed = False
        self._closing = False
        self._pending_sigterm = None

    # ---- context manager ---------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        errors = self.close()
        if errors and exc_type is None:
            raise TestHostsError("clean-up of test hosts failed:\n  " + "\n  ".join(errors))
        if errors:
            sys.stderr.write("testhosts: clean-up failed:\n  %s\n" % "\n  ".join(errors))
        return False

    def start(self):
        if self._entered:
            raise RuntimeError("TestHosts already started")
        self.check_prerequisites()
        self._entered = True
        atexit.register(self._atexit)
        self._install_sigterm()
        try:
            self._setup()
        except BaseException:
            errors = self.close()
            if errors:
                sys.stderr.write("testhosts: clean-up after failed set-up failed:\n  %s\n"
                                 % "\n  ".join(errors))
            raise
        return self

    # ---- public API --------------------------------------------------------------------------
    def env(self):
        """A copy of os.environ with HOME set to the temporary home and no SSH agent."""
        env = dict(os.environ)
        env["HOME"] = str(self.home)
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("SSH_AGENT_PID", None)
        return env

    def host_key_pub(self, i):
        """Host i's current public host key line ('ssh-ed25519 AAAA... comment')."""
        with open(self._host_key(i) + ".pub") as f:
            return f.read().strip()

    def sshd_log(self, i):
        """What host i's sshd wrote to stderr (LogLevel ERROR) so far."""
        try:
            with open(self._path("sshd%d.log" % i), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def pids_on(self, i):
        """Pids of the live processes running in host i's namespace (its sshd included)."""
        return [p for p in _pids_in_netns(self.namespaces[i]) if _pid_alive(p)]

    def leftovers(self):
        """Pids of what runs inside the hosts' namespaces besides their listening sshd."""
        return [p for i in range(self.count) for p in self.pids_on(i) if p != self.sshd_pid(i)]

    def kill_leftovers(self):
        """SIGKILLs, by pid, whatever a test left inside the hosts' namespaces (never their
        sshd), until nothing is left or about 2.5 s have passed."""
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

    def sshd_pid(self, i):
        """Pid of host i's listening sshd, or None when it is stopped."""
        p = self._procs.get(i)
        return p.pid if p is not None and p.poll() is None else None

    def ssh_args(self, i, command=None, *, user=None, known_hosts=None, options=()):
        """The argv of an OpenSSH client call to host i (command appended when given).
        `options` come first, so they override the defaults (ssh keeps an option's first value)."""
        args = [SSH, "-F", "/dev/null", *options,
                "-o", "BatchMode=yes",
                "-o", "UserKnownHostsFile=%s" % (known_hosts or self.known_hosts),
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes",
                "-o", "ConnectTimeout=10",
                "-o", "LogLevel=ERROR",
                "-i", self.client_key,
                "%s@%s" % (user or self.user, self.addresses[i])]
        if command is not None:
            args.append(command)
        return args

    def ssh(self, i, command, *, user=None, known_hosts=None, options=(), timeout=30,
            check=False, input=None):
        """Runs `command` on host i with the OpenSSH client; returns a CompletedProcess (text)."""
        p = subprocess.run(self.ssh_args(i, command, user=user, known_hosts=known_hosts,
                                         options=options),
                           input=input, stdin=None if input is not None else subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout, env=self.env())
        if check and p.returncode != 0:
            raise TestHostsError("ssh to host %d (%s) %r: exit status %d\n%s"
                                 % (i, self.addresses[i], command, p.returncode, p.stderr))
        return p

    def stop_host(self, i, *, kill_sessions=False):
        """Kills host i's listening sshd: new connections are refused. With kill_sessions, every
        process in the host's namespace (open sessions, remote daemons) is SIGKILLed as well."""
        self._stop_sshd(i)
        if kill_sessions:
            _kill_all_in_netns(self.namespaces[i])

    def start_host(self, i):
        """(Re)starts host i's sshd and waits until it accepts connections."""
        if self.sshd_pid(i) is not None:
            return
        self._start_sshd(i)
        self._wait_ready([i])

    def set_link(self, i, up):
        """Takes host i's link to the bridge down (up=False) or up again: a silent partition.
        Packets to and from the host are dropped without any error; open connections see
        nothing until they time out. Tests must bring it up again (close() deletes the link
        either way)."""
        _run([IP, "link", "set", self.veths[i], "up" if up else "down"])

    def session_pids(self, i):
        """Pids of the SSH session processes on host i ('sshd: USER@notty' and the like): the
        descendants of its listening sshd that serve a logged-in connection. SIGKILL of one
        drops its connection at once, like a reset or a reboot of the host."""
        listener = self.sshd_pid(i)
        if listener is None:
            return []
        children = {}
        for pid in self.pids_on(i):
            try:
                with open("/proc/%d/stat" % pid, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(pid)
        found, todo = [], list(children.get(listener, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    name = f.read().split(b"\0")[0].decode("utf-8", "replace")
            except OSError:
                continue
            if name.startswith("sshd: ") and "@" in name:
                found.append(pid)
        return sorted(found)

    def change_host_key(self, i):
        """Gives host i a new host key and restarts its sshd: known_hosts no longer matches."""
        self._stop_sshd(i)
        key = self._host_key(i)
        for path in (key, key + ".pub"):
            if os.path.exists(path):
                os.unlink(path)
        self._keygen(key, "testhost%d-%s-new" % (i, self.prefix))
        self.start_host(i)

    # ---- prerequisites -----------------------------------------------------------------------
    @staticmethod
    def check_prerequisites():
        """Skips (pytest) or raises TestHostsUnavailable unless this machine can provide hosts;
        cheap, creates nothing. (An unprivileged container passes and skips later, when the
        bridge cannot be created.)"""
        reason = unavailable_reason()
        if reason:
            _unavailable(reason)

    # ---- set-up ------------------------------------------------------------------------------
    def _record(self, what, fn):
        if self._closed:
            raise TestHostsError("test hosts closed during set-up")
        self._undo.append((what, fn))

    def _path(self, name):
        return os.path.join(self.tmpdir, name)

    def _host_key(self, i):
        return self._path("host%d_ed25519" % i)

    def _setup(self):
        existing_links, existing_ns = _link_names(), _netns_names()
        for _ in range(100):
            prefix = "ps" + secrets.token_hex(3)
            if not any(n and n.startswith(prefix) for n in existing_links | existing_ns):
                try:
                    pwd.getpwnam(prefix + "u")
                    continue
                except KeyError:
                    break
        else:
            raise TestHostsError("no unused name prefix found")
        self.prefix = prefix
        self.bridge = prefix + "br"
        self.namespaces = ["%sh%d" % (prefix, i) for i in range(self.count)]
        self.veths = ["%sv%d" % (prefix, i) for i in range(self.count)]

        # Temporary directory. 0755 so that the fast user reaches authorized_keys and its home;
        # private keys inside are 0600.
        self.tmpdir = tempfile.mkdtemp(prefix="perseus-testhosts-%s-" % prefix, dir=self.tmp_root)
        tmpdir = self.tmpdir
        self._record("remove %s" % tmpdir, lambda: shutil.rmtree(tmpdir))
        os.chmod(tmpdir, 0o755)

        # sshd's privilege separation directory; shared with the system's sshd and with other
        # instances, so it is created when missing and never removed.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

        if self.fast_user:
            self._create_user()

        self._keys()
        self._network()
        for i in range(self.count):
            self._write_sshd_config(i)
        for i in range(self.count):
            self._start_sshd(i)
        self._wait_ready(range(self.count))

    def _create_user(self):
        name = self.prefix + "u"
        home = self._path("userhome")
        os.mkdir(home, 0o755)
        for attempt in range(50):
            p = _run([USERADD, "-r", "-M", "-N", "-d", home, "-s", "/bin/sh", "-p", "*",
                      "-c", "perseus test hosts", name], check=False)
            if p.returncode == 0:
                break
            if p.returncode != 10 or attempt == 49:  # 10: cannot lock the passwd file
                raise TestHostsError("useradd %s failed (%d): %s"
                                     % (name, p.returncode, p.stderr.strip()))
            time.sleep(0.1)
        self.created_user = name
        self._record("userdel %s" % name, lambda: self._delete_user(name))
        pw = pwd.getpwnam(name)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        self.user = name
        self.user_home = home

    @staticmethod
    def _delete_user(name):
        try:
            pwd.getpwnam(name)
        except KeyError:
            return
        for attempt in range(50):
            p = _run([USERDEL, name], check=False)
            if p.returncode == 0 or p.returncode == 6:  # 6: no such user
                return
            if p.returncode != 10 or attempt == 49:
                raise TestHostsError("userdel %s failed (%d): %s"
                                     % (name, p.returncode, p.stderr.strip()))
            time.sleep(0.1)

    def _keygen(self, path, comment):
        _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])

    def _keys(self):
        # Client side: a temporary HOME with the key pair and known_hosts.
        self.home = self._path("home")
        ssh_dir = os.path.join(self.home, ".ssh")
        os.makedirs(ssh_dir, mode=0o700)
        os.chmod(self.home, 0o700)
        self.client_key = os.path.join(ssh_dir, "id_ed25519")
        self.client_key_pub = self.client_key + ".pub"
        self._keygen(self.client_key, "testhosts-client-%s" % self.prefix)
        with open(self.client_key_pub) as f:
            pub = f.read().strip()
        auth = self._path("authorized_keys")
        with open(auth, "w") as f:
            f.write(pub + "\n")
        os.chmod(auth, 0o644)
        for i in range(self.count):
            self._keygen(self._host_key(i), "testhost%d-%s" % (i, self.prefix))

    def _write_known_hosts(self):
        self.known_hosts = os.path.join(self.home, ".ssh", "known_hosts")
        self.hashed_known_hosts = os.path.join(self.home, ".ssh", "known_hosts.hashed")
        lines = []
        for i, addr in enumerate(self.addresses):
            kind, blob = self.host_key_pub(i).split()[:2]
            lines.append("%s %s %s\n" % (addr, kind, blob))
        for path in (self.known_hosts, self.hashed_known_hosts):
            with open(path, "w") as f:
                f.writelines(lines)
        _run([SSH_KEYGEN, "-q", "-H", "-f", self.hashed_known_hosts])
        try:
            os.unlink(self.hashed_known_hosts + ".old")
        except FileNotFoundError:
            pass

    def _pick_network(self):
        """A random 10.a.b.0/24 that overlaps no address and no narrow route of this machine."""
        taken = []
        for link in _ip_json("-4", "addr", "show"):
            for a in link.get("addr_info", []):
                if a.get("family") == "inet":
                    taken.append(ipaddress.ip_interface("%s/%s" % (a["local"], a["prefixlen"])))
        routes = []
        for r in _ip_json("-4", "route", "show", "table", "all"):
            dst = r.get("dst")
            if dst and dst != "default":
                try:
                    routes.append(ipaddress.ip_network(dst, strict=False))
                except ValueError:
                    pass
        rng = random.SystemRandom()
        for _ in range(1000):
            net = ipaddress.ip_network("10.%d.%d.0/24" % (rng.randrange(1, 255),
                                                          rng.randrange(0, 256)))
            if any(t.ip in net or (t.network.prefixlen >= 16 and t.network.overlaps(net))
                   for t in taken):
                continue
            if any(r.prefixlen >= 16 and r.overlaps(net) for r in routes):
                continue
            return net
        raise TestHostsError("no free /24 in 10.0.0.0/8")

    def _network(self):
        br = self.bridge
        p = _run([IP, "link", "add", br, "type", "bridge"], check=False)
        if p.returncode != 0:
            # The first thing that needs CAP_NET_ADMIN: an unprivileged container lands here.
            if "Operation not permitted" in p.stderr:
                _unavailable("cannot create a bridge (%s)" % p.stderr.strip())
            raise TestHostsError("ip link add %s type bridge failed: %s" % (br, p.stderr.strip()))
        self._record("delete bridge %s" % br, lambda: self._del_link(br))

        # Pick the /24 and claim it with the bridge's address; if a concurrent instance claimed
        # the same one at the same time, both see it afterwards and pick again.
        for _ in range(20):
            net = self._pick_network()
            hosts = list(net.hosts())
            bridge_addr = str(hosts[0])
            _run([IP, "addr", "add", "%s/24" % bridge_addr, "dev", br])
            clash = False
            for link in _ip_json("-4", "addr", "show"):
                if link.get("ifname") == br:
                    continue
                for a in link.get("addr_info", []):
                    if ipaddress.ip_address(a.get("local", "0.0.0.0")) in net:
                        clash = True
            if not clash:
                break
            _run([IP, "addr", "del", "%s/24" % bridge_addr, "dev", br], check=False)
            time.sleep(random.random() * 0.05)
        else:
            raise TestHostsError("could not claim a free /24")
        self.network = net
        self.bridge_address = bridge_addr
        self.addresses = [str(hosts[1 + i]) for i in range(self.count)]
        _run([IP, "link", "set", br, "up"])

        for i in range(self.count):
            ns, veth, addr = self.namespaces[i], self.veths[i], self.addresses[i]
            p = _run([IP, "netns", "add", ns], check=False)
            if p.returncode != 0:
                raise TestHostsError("ip netns add %s failed: %s" % (ns, p.stderr.strip()))
            self._record("delete namespace %s" % ns, lambda ns=ns: self._del_netns(ns))
            _run([IP, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
                 check=False)
            if veth not in _link_names():
                raise TestHostsError("could not create veth %s" % veth)
            self._record("delete veth %s" % veth, lambda veth=veth: self._del_link(veth))
            _run([IP, "link", "set", veth, "master", br])
            _run([IP, "link", "set", veth, "up"])
            _run([IP, "-n", ns, "link", "set", "lo", "up"])
            _run([IP, "-n", ns, "addr", "add", "%s/24" % addr, "dev", "eth0"])
            _run([IP, "-n", ns, "link", "set", "eth0", "up"])
            # Lets a host reach this machine's other addresses through the bridge too.
            _run([IP, "-n", ns, "route", "add", "default", "via", bridge_addr])
        self._write_known_hosts()

    @staticmethod
    def _del_link(name):
        if name in _link_names():
            _run([IP, "link", "del", name])

    @staticmethod
    def _del_netns(ns):
        if ns not in _netns_names():
            return
        _kill_all_in_netns(ns)
        _run([IP, "netns", "del", ns])

    def _write_sshd_config(self, i):
        allow = "root" if self.user == "root" else "root %s" % self.user
        conf = "\n".join([
            "# perseus test host %d (%s)" % (i, self.prefix),
            "ListenAddress %s" % self.addresses[i],
            "Port 22",
            "AddressFamily inet",
            "HostKey %s" % self._host_key(i),
            "PidFile %s" % self._path("sshd%d.pid" % i),
            "AuthorizedKeysFile %s" % self._path("authorized_keys"),
            "AuthorizedKeysCommand none",
            "AllowUsers %s" % allow,
            "UsePAM no",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "PermitRootLogin prohibit-password",
            "PermitUserRC no",
            "PermitUserEnvironment no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "X11Forwarding no",
            "MaxStartups 200",
            "MaxSessions 200",
            "LoginGraceTime 30",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
            "",
        ])
        with open(self._path("sshd%d.conf" % i), "w") as f:
            f.write(conf)

    def _start_sshd(self, i):
        log = open(self._path("sshd%d.log" % i), "ab")
        try:
            # `ip netns exec` execs the command: the pid is sshd's own.
            p = subprocess.Popen([IP, "netns", "exec", self.namespaces[i], SSHD, "-D", "-e",
                                  "-f", self._path("sshd%d.conf" % i)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True)
        finally:
            log.close()
        self._procs[i] = p
        self._record("stop sshd of host %d (pid %d) and its sessions" % (i, p.pid),
                     lambda i=i, p=p: self._stop_sshd(i, p, kill_sessions=True))

    def _stop_sshd(self, i, proc=None, kill_sessions=False):
        p = proc or self._procs.get(i)
        if p is None:
            return
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            p.wait(10)
        if self._procs.get(i) is p:
            del self._procs[i]
        if kill_sessions:
            # While the host's link still exists, so that the other ends see their TCP
            # connections closed instead of waiting forever on a vanished peer.
            _kill_all_in_netns(self.namespaces[i])

    def _wait_ready(self, indices):
        """Waits until each host's sshd sends its SSH banner to a connection from this host."""
        pending = list(indices)
        end = time.monotonic() + self.ready_timeout
        while pending:
            for i in list(pending):
                p = self._procs[i]
                if p.poll() is not None:
                    raise TestHostsError("sshd of host %d (%s) exited with status %s:\n%s"
                                         % (i, self.addresses[i], p.returncode,
                                            self.sshd_log(i)))
                try:
                    with socket.create_connection((self.addresses[i], 22), timeout=1) as s:
                        s.settimeout(2)
                        if s.recv(8).startswith(b"SSH-"):
                            pending.remove(i)
                except OSError:
                    pass
            if pending:
                if time.monotonic() > end:
                    raise TestHostsError("sshd of hosts %s did not accept connections within "
                                         "%.0f s:\n%s" % ([self.addresses[i] for i in pending],
                                                          self.ready_timeout,
                                                          self.sshd_log(pending[0])))
                time.sleep(0.02)

    # ---- atexit / SIGTERM --------------------------------------------------------------------
    def _atexit(self):
        errors = self.close()
        if errors:
            sys.stderr.write("testhosts: clean-up at exit failed:\n  %s\n" % "\n  ".join(errors))
