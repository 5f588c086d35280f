"""The job's rendezvous store (lib/rendezvous) as the ranks meet it: perseusrun serves it on one
address (127.0.0.1 for a job on this machine only, never the wildcard), hands every rank
PERSEUS_RENDEZVOUS_ADDR/PORT and PERSEUS_SECRET_FILE (a 0600 file in a 0700 folder, gone when the
job ends; the secret itself is in no environment and on no command line), and drops connections
that do not prove the secret or break the message protocol, while the job's ranks go on to meet.

The ranks run tests/tools/rendezvous_probe ($RENDEZVOUS_PROBE, which CTest sets): every rank sets
rank/<r>, reads every other rank's key, adds 1 to "arrived" and checks two keys. The attacks speak
the protocol of lib/rendezvous/wire.h from Python (hmac, hashlib, socket, struct).
"""

import hashlib
import hmac
import json
import os
import pwd
import re
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import PY, REPO, untag

# A second host on this machine: names of one machine are one host (one agent), unless the
# users differ; perseusrun's own user written out is a host apart from "localhost".
TWIN = "%s@localhost" % pwd.getpwuid(os.getuid()).pw_name

PROBE = os.environ.get("RENDEZVOUS_PROBE") or str(REPO / "build" / "tests" / "tools" /
                                                   "rendezvous_probe")

OP_SET, OP_GET, OP_ADD, OP_CHECK, OP_REPLY, OP_ERROR = 1, 2, 3, 4, 10, 11
NONCE = 32
MAC = 32
HELLO_LABEL = b"perseus-rdzv-hello"
KEY_LABEL = b"perseus-rdzv-key"
SOCKET_TIMEOUT = 5.0


@pytest.fixture
def probe():
    if not (os.path.isfile(PROBE) and os.access(PROBE, os.X_OK)):
        pytest.fail("rendezvous_probe not found at %s (set RENDEZVOUS_PROBE)" % PROBE,
                    pytrace=False)
    return PROBE


# ---- what the ranks run ------------------------------------------------------------------------

# Reports the rank's rendezvous variables (info.<rank>), optionally waits for the test's go file,
# then becomes the probe. argv: [marker, "wait"|"now"].
WRAPPER = r'''
info = {k: os.environ.get(k) for k in ("PERSEUS_RENDEZVOUS_ADDR", "PERSEUS_RENDEZVOUS_PORT",
                                       "PERSEUS_SECRET_FILE", "MASTER_ADDR")}
info["ns"] = os.readlink("/proc/self/ns/net")
put_json("info.%d" % RANK, info)
if sys.argv[2] == "wait":
    end = time.time() + 25
    while not exists("go"):
        if time.time() > end:
            sys.exit("rank %d: no go file within 25 s" % RANK)
        time.sleep(0.02)
os.execv(PROBE, [PROBE, MARK])
'''


def wrapper(launcher, probe):
    return launcher.prog("PROBE = %r\n" % probe + WRAPPER)


# Checks the secret from inside a rank: the file, its folder, and where the secret must not be.
SECRET_BODY = r'''
import stat
path = os.environ["PERSEUS_SECRET_FILE"]
folder = os.path.dirname(path)
report = {"path": path, "mode": stat.S_IMODE(os.lstat(path).st_mode),
          "folder_mode": stat.S_IMODE(os.lstat(folder).st_mode),
          "is_file": stat.S_ISREG(os.lstat(path).st_mode),
          "is_dir": stat.S_ISDIR(os.lstat(folder).st_mode),
          "owner": os.lstat(path).st_uid, "folder_owner": os.lstat(folder).st_uid,
          "me": os.getuid(), "folder_entries": sorted(os.listdir(folder))}
with open(path, "rb") as f:
    secret = f.read()
report["size"] = len(secret)
report["secret"] = secret.hex()
forms = [secret, secret.hex().encode(), secret.hex().upper().encode()]
report["in_env"] = [k.decode("utf-8", "replace") for k, v in os.environb.items()
                    if any(form in k or form in v for form in forms)]
in_cmdline, in_environ = [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for what, found in (("cmdline", in_cmdline), ("environ", in_environ)):
        try:
            with open("/proc/%s/%s" % (pid, what), "rb") as f:
                data = f.read()
        except OSError:
            continue
        if any(form in data for form in forms):
            found.append(int(pid))
report["in_cmdline"] = in_cmdline
report["in_environ"] = in_environ
port = int(os.environ["PERSEUS_RENDEZVOUS_PORT"])
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        fields = line.split()
        address, hexport = fields[1].split(":")
        if int(hexport, 16) == port and fields[3] == "0A":
            listening.append([table, address])
report["listening"] = listening
report["addr"] = os.environ.get("PERSEUS_RENDEZVOUS_ADDR")
report["master_addr"] = os.environ.get("MASTER_ADDR")
put_json("secret.%d" % RANK, report)
wait_count("secret.", int(os.environ["PERSEUS_SIZE"]), timeout=25)
'''


def check_probe(res, size):
    """Exit 0, and every rank read every rank's key and added once to "arrived"."""
    assert res.rc == 0, str(res)
    by_rank, other = untag(res.stdout, "stdout")
    assert sorted(by_rank) == list(range(size)), "ranks that printed: %s\n%s" % (
        sorted(by_rank), res)
    arrived = []
    for rank in range(size):
        lines = [l.decode("utf-8", "replace") for l in by_rank[rank]]
        for peer in range(size):
            want = "rank %d read rank/%d = hello from %d" % (rank, peer, peer)
            assert want in lines, "rank %d did not read rank/%d\n%s" % (rank, peer, res)
        added = [m for m in (re.fullmatch(r"rank %d added 1 to arrived: (\d+)" % rank, l)
                             for l in lines) if m]
        assert len(added) == 1, "rank %d: %r\n%s" % (rank, lines, res)
        arrived.append(int(added[0].group(1)))
    assert sorted(arrived) == list(range(1, size + 1)), "%s\n%s" % (arrived, res)
    assert "rendezvous_probe:" not in res.err, str(res)


def listening_addresses(port):
    """Local addresses (as text) of the sockets in this network namespace that listen on TCP
    `port`."""
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hexport = fields[1].split(":")
            if int(hexport, 16) != port or fields[3] != "0A":
                continue
            raw = bytes.fromhex(address)
            # /proc/net/tcp{,6} write the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(socket.inet_ntop(family, raw))
    return found


# ---- the protocol of lib/rendezvous/wire.h, in Python -------------------------------------------

def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(data), n))
        data += chunk
    return data


class Session:
    """One connection to the store. secret=None: prove nothing (a random proof)."""

    def __init__(self, address, port, secret):
        self.sock = socket.create_connection((address, port), timeout=SOCKET_TIMEOUT)
        self.server_nonce = recv_exactly(self.sock, NONCE)
        client_nonce = os.urandom(NONCE)
        if secret is None:
            proof = os.urandom(MAC)
            secret = os.urandom(32)
        else:
            proof = hmac.new(secret, HELLO_LABEL + self.server_nonce + client_nonce,
                             hashlib.sha256).digest()
        self.sock.sendall(client_nonce + proof)
        self.key = hmac.new(secret, KEY_LABEL + self.server_nonce + client_nonce,
                            hashlib.sha256).digest()
        self.sent = 0
        self.received = 0

    def frame(self, op, key, value=b""):
        self.sent += 1
        body = (struct.pack(">QBI", self.sent, op, len(key)) + key +
                struct.pack(">I", len(value)) + value)
        head = struct.pack(">I", len(body))
        return head + body + hmac.new(self.key, b"C" + head + body, hashlib.sha256).digest()

    def reply(self):
        head = recv_exactly(self.sock, 4)
        (length,) = struct.unpack(">I", head)
        assert 17 <= length <= 17 + 4096 + (16 << 20), length
        body = recv_exactly(self.sock, length)
        mac = recv_exactly(self.sock, MAC)
        want = hmac.new(self.key, b"S" + head + body, hashlib.sha256).digest()
        assert hmac.compare_digest(mac, want), "the server's reply has a wrong MAC"
        counter, op, klen = struct.unpack(">QBI", body[:13])
        self.received += 1
        assert counter == self.received, (counter, self.received)
        key = body[13:13 + klen]
        (vlen,) = struct.unpack(">I", body[13 + klen:17 + klen])
        value = body[17 + klen:]
        assert len(value) == vlen
        return op, key, value

    def call(self, op, key, value=b""):
        self.sock.sendall(self.frame(op, key, value))
        return self.reply()

    def closed_by_server(self, within=3.0):
        """True when the server closes (or resets) the connection within `within` seconds;
        anything it sends first is read and dropped."""
        end = time.monotonic() + within
        try:
            while time.monotonic() < end:
                self.sock.settimeout(max(0.01, end - time.monotonic()))
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
        return False

    def close(self):
        self.sock.close()


# ---- the probe: the ranks meet ------------------------------------------------------------------

def test_probe_three_local_ranks(launcher, probe):
    res = launcher.run(["-np", "3", "-H", "localhost:3", probe, launcher.marker])
    check_probe(res, 3)


def test_probe_four_ranks_over_two_local_aliases(launcher, probe):
    """Two agents on this machine (localhost and USER@localhost: two hosts, as the users
    differ), each with its own secret file."""
    res = launcher.run(["-np", "4", "-H", "localhost:2,%s:2" % TWIN, probe, launcher.marker])
    check_probe(res, 4)


@pytest.fixture
def hosts(launcher, test_hosts):
    yield test_hosts
    launcher.cleanup()
    test_hosts.kill_leftovers()


def test_probe_over_ssh_hosts(launcher, probe, hosts):
    """4 ranks on the three SSH hosts: every rank reaches the store on this machine's address on
    the hosts' network (the bridge's), where it listens, and nowhere else."""
    a, b, c = hosts.addresses
    env = launcher.env(HOME=str(hosts.home), SSH_AUTH_SOCK=None, SSH_AGENT_PID=None)
    p = launcher.start(["-H", "%s:2,%s:1,%s:1" % (a, b, c), PY, wrapper(launcher, probe),
                        launcher.marker, "wait"], env=env)
    launcher.wait_files("info.", 4, proc=p)
    infos = [json.loads(launcher.read("info.%d" % r)) for r in range(4)]
    ports = {i["PERSEUS_RENDEZVOUS_PORT"] for i in infos}
    assert len(ports) == 1, infos
    port = int(ports.pop())
    for rank, info in enumerate(infos):
        assert info["PERSEUS_RENDEZVOUS_ADDR"] == hosts.bridge_address, (rank, info)
        assert info["MASTER_ADDR"] == a, (rank, info)
        assert info["PERSEUS_SECRET_FILE"], (rank, info)
        assert info["ns"] != os.readlink("/proc/self/ns/net"), "rank %d ran here" % rank
    assert len({i["ns"] for i in infos}) == 3, infos
    assert listening_addresses(port) == [hosts.bridge_address]
    (launcher.out / "go").write_text("")
    res = launcher.finish(p)
    check_probe(res, 4)
    # The hosts share this file system: every agent's secret file is gone with the job.
    end = time.monotonic() + 5
    paths = {i["PERSEUS_SECRET_FILE"] for i in infos}
    while any(os.path.lexists(x) for x in paths) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [x for x in paths if os.path.lexists(x) or os.path.lexists(os.path.dirname(x))]


# ---- the secret ------------------------------------------------------------------------------------

def test_secret_file_and_where_the_secret_is_not(launcher):
    """Three ranks under two agents (localhost, USER@localhost): each sees a 0600 file of 32 bytes in a
    0700 folder of its own user; the secret is the same for all, in no rank's environment and in
    no process's command line or environment; the store listens on 127.0.0.1 only, MASTER_ADDR is
    127.0.0.1; when perseusrun has exited, the files and folders are gone."""
    res = launcher.run(["-v", "-H", "localhost:2,%s:1" % TWIN, PY, launcher.prog(SECRET_BODY)])
    assert res.rc == 0, str(res)
    reports = [json.loads(launcher.read("secret.%d" % r)) for r in range(3)]
    bad = []
    for rank, rep in enumerate(reports):
        want = {"mode": 0o600, "folder_mode": 0o700, "is_file": True, "is_dir": True,
                "owner": rep["me"], "folder_owner": rep["me"], "folder_entries": ["secret"],
                "size": 32, "in_env": [], "in_cmdline": [], "in_environ": [],
                "addr": "127.0.0.1", "master_addr": "127.0.0.1",
                "listening": [["/proc/net/tcp", "0100007F"]]}
        for k, v in want.items():
            if rep[k] != v:
                bad.append("rank %d: %s = %r, expected %r" % (rank, k, rep[k], v))
    assert not bad, "\n".join(bad) + "\n" + str(res)
    assert len({r["secret"] for r in reports}) == 1, reports
    paths = {r["path"] for r in reports}
    assert len(paths) == 2, "expected one file per agent: %s" % paths  # two agents
    secret = bytes.fromhex(reports[0]["secret"])
    for form in (secret, secret.hex().encode(), secret.hex().upper().encode()):
        assert form not in res.stdout and form not in res.stderr, str(res)
    for path in paths:
        assert not os.path.lexists(path), "%s is left after the job" % path
        assert not os.path.lexists(os.path.dirname(path)), "%s is left after the job" % (
            os.path.dirname(path))



@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_secret_folders_removed_when_perseusrun_is_ended(launcher, sig):
    """perseusrun ended by SIGTERM, or SIGKILLed (the agents see their stream end): the secret
    files and their folders go with the job."""
    prog = launcher.prog("put('path.%d' % RANK, os.environ['PERSEUS_SECRET_FILE'])\n"
                         "sleep_for(25)\n")
    p = launcher.start(["-H", "localhost:2,%s:1" % TWIN, PY, prog])
    launcher.wait_files("path.", 3, proc=p)
    paths = {launcher.read("path.%d" % r).decode() for r in range(3)}
    assert len(paths) == 2 and all(os.path.isfile(x) for x in paths), paths
    p.send_signal(sig)
    p.wait(15)
    end = time.monotonic() + 10
    left = paths
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = {x for x in paths if os.path.lexists(x) or os.path.lexists(os.path.dirname(x))}
    assert not left, "left %.0f s after perseusrun ended: %s" % (10, left)

# ---- attacks while a job runs -------------------------------------------------------------------

def test_attacks_on_the_store_while_a_job_runs(launcher, probe):
    """While the ranks wait, this test (root, so it may read the secret file) attacks the store;
    every broken connection is closed by the server; a proper session works; then the ranks meet
    as if nothing had happened."""
    p = launcher.start(["-np", "3", "-H", "localhost:3", PY, wrapper(launcher, probe),
                        launcher.marker, "wait"])
    launcher.wait_files("info.", 3, proc=p)
    info = json.loads(launcher.read("info.0"))
    address, port = info["PERSEUS_RENDEZVOUS_ADDR"], int(info["PERSEUS_RENDEZVOUS_PORT"])
    assert address == "127.0.0.1", info
    with open(info["PERSEUS_SECRET_FILE"], "rb") as f:
        secret = f.read()
    assert len(secret) == 32

    # (1) No secret: a random proof.
    s = Session(address, port, None)
    try:
        s.sock.sendall(s.frame(OP_SET, b"attack/nosecret", b"1"))
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert s.closed_by_server(), "a hello without the secret was not refused"
    s.close()

    # (2) A forged MAC.
    s = Session(address, port, secret)
    frame = bytearray(s.frame(OP_SET, b"attack/forged", b"1"))
    frame[-1] ^= 0x01
    s.sock.sendall(bytes(frame))
    assert s.closed_by_server(), "a message with a forged MAC was not refused"
    s.close()

    # (3) Replay: the first gets its reply, the second closes the connection.
    s = Session(address, port, secret)
    frame = s.frame(OP_ADD, b"attack/replay", b"1")
    s.sock.sendall(frame)
    op, _, value = s.reply()
    assert (op, value) == (OP_REPLY, b"1")
    try:
        s.sock.sendall(frame)
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert s.closed_by_server(), "a replayed message was not refused"
    s.close()

    # (4) A truncated message, then the attacker goes away.
    s = Session(address, port, secret)
    frame = s.frame(OP_SET, b"attack/truncated", b"1")
    s.sock.sendall(frame[:len(frame) // 2])
    s.close()

    # (5) A length of 2^31: closed at once, without waiting for 2 GB.
    s = Session(address, port, secret)
    start = time.monotonic()
    s.sock.sendall(struct.pack(">I", 1 << 31))
    assert s.closed_by_server(), "a 2 GB length was not refused"
    assert time.monotonic() - start < 3
    s.close()

    # (6) A proper session works: the Python implementation speaks the protocol.
    s = Session(address, port, secret)
    assert s.call(OP_SET, b"attack/ok", b"yes") == (OP_REPLY, b"", b"")
    assert s.call(OP_GET, b"attack/ok") == (OP_REPLY, b"", b"yes")
    assert s.call(OP_GET, b"attack/replay") == (OP_REPLY, b"", b"1")  # added once
    assert s.call(OP_CHECK, b"attack/truncated") == (OP_REPLY, b"", b"0")
    assert s.call(OP_CHECK, b"attack/forged") == (OP_REPLY, b"", b"0")
    assert s.call(OP_CHECK, b"attack/nosecret") == (OP_REPLY, b"", b"0")
    assert s.call(OP_ADD, b"attack/n", b"41") == (OP_REPLY, b"", b"41")
    assert s.call(OP_ADD, b"attack/n", b"1") == (OP_REPLY, b"", b"42")
    op, _, why = s.call(OP_ADD, b"attack/ok", b"1")
    assert op == OP_ERROR and b"attack/ok" in why, (op, why)
    assert s.call(OP_CHECK, b"rank/0")[0] == OP_REPLY  # the session is still in step
    s.close()

    assert p.poll() is None, "perseusrun ended during the attacks"
    (launcher.out / "go").write_text("")
    res = launcher.finish(p)
    check_probe(res, 3)


# A peer that opens `count` connections to the store and says nothing. argv: marker, address,
# port, count, file to write the number connected into.
FLOOD = r"""
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, max(hard, 8192)))
except (ValueError, OSError):
    pass
address, port, count, ready = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
held = []
for _ in range(count):
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect((address, port))
    except OSError:
        break
    held.append(s)
with open(ready + ".tmp", "w") as f:
    f.write(str(len(held)))
os.replace(ready + ".tmp", ready)
time.sleep(30)
"""


def test_idle_unauthenticated_connections_do_not_lock_the_ranks_out(launcher, probe):
    """4200 connections that never say hello (they cost an attacker nothing) are open while the
    ranks meet: the ranks must still get in."""
    p = launcher.start(["-np", "3", "-H", "localhost:3", PY, wrapper(launcher, probe),
                        launcher.marker, "wait"])
    launcher.wait_files("info.", 3, proc=p)
    info = json.loads(launcher.read("info.0"))
    ready = launcher.tmp / "flood.ready"
    flood = subprocess.Popen([PY, "-c", FLOOD, launcher.marker, info["PERSEUS_RENDEZVOUS_ADDR"],
                              info["PERSEUS_RENDEZVOUS_PORT"], "4200", str(ready)],
                             start_new_session=True)
    try:
        end = time.monotonic() + 15
        while not ready.exists():
            assert time.monotonic() < end and flood.poll() is None, "the flood did not start"
            time.sleep(0.05)
        if int(ready.read_text()) < 4200:
            pytest.skip("could open only %s connections here" % ready.read_text())
        (launcher.out / "go").write_text("")
        res = launcher.finish(p)
    finally:
        flood.kill()
        flood.wait(10)
    check_probe(res, 3)


def test_secret_folders_of_dead_agents_are_swept_live_ones_kept(launcher, tmp_path):
    """An agent that was SIGKILLed cannot remove its secret folder; the next agent removes the
    folders whose lock nobody holds, and leaves alone one whose lock is held (a live job)."""
    import fcntl
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stale, live = tmp / "perseus-0000dead-AAAAAA", tmp / "perseus-0000live-BBBBBB"
    for folder in (stale, live):
        folder.mkdir(mode=0o700)
        (folder / "secret").write_bytes(b"s" * 32)
        (folder / "secret").chmod(0o600)
    with open(live / "secret", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = launcher.run(["-np", "1", "-H", "localhost:1",
                            PY, "-c", "import os; print(os.environ['PERSEUS_SECRET_FILE'])"],
                           env=launcher.env(TMPDIR=str(tmp)))
        assert res.rc == 0, str(res)
        assert not stale.exists(), "the dead agent's folder was left behind"
        assert (live / "secret").read_bytes() == b"s" * 32, "a live job's secret was touched"
    # The job's own folder is gone too.
    assert sorted(p.name for p in tmp.iterdir()) == [live.name], str(res)
