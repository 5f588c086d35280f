"""perseusrun --check and the launch preflight, black-box.

--check reaches every host's agent as a launch would, reports each host (its hostname, agent
version, ranks it would run, GPUs, the --master-port on rank 0's host) as a table or, with --json,
as one JSON document, and exits 0 when the job can start, 1 when something blocks it. A launch
first runs a quick preflight: a --master-port that a process holds on rank 0's host stops it
before anything runs (--no-preflight skips that).

This machine has no NVIDIA driver: that is a note (ranks run on CPU), never a blocker. Ports are
held by sockets of this test process or of a child it starts (by pid, killed afterwards); the SSH
tests use the test hosts of testhosts.py (network namespaces with their own sshd).
"""

import json
import os
import platform
import re
import select
import socket
import subprocess
import time

import pytest

from conftest import PY, expect_usage_error, free_port, nproc

VERSION_RE = r"perseusrun \d+\.\d+\.\d+"
TOP_KEYS = {"can_start", "hosts", "blockers", "warnings", "notes", "gpu_busy_threshold_mib"}
HOST_KEYS = {"host", "reachable", "error", "agent_version", "hostname", "ranks"}
REPORT_KEYS = {"gpus", "ports", "free_gpus"}
GPU_KEYS = {"driver_found", "problem", "driver_version", "cuda_driver_version", "nccl_version",
            "gpus"}
HOSTNAME = socket.gethostname()

# A child that holds a TCP port: argv address, "1" to listen (else only bind). Prints the port
# the OS picked, then sleeps until it is killed.
HOLDER = r'''
import socket, sys, time
addr, listen = sys.argv[1], sys.argv[2] == "1"
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
s.bind((addr, 0))
if listen:
    s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(300)
'''


# ---- helpers --------------------------------------------------------------------------------

def kernel_at_least(major, minor):
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def check_json(res):
    """The one JSON document of a --check --json run, with its keys checked."""
    try:
        doc = json.loads(res.out)
    except ValueError as e:
        pytest.fail("stdout is not one JSON document (%s)\n%s" % (e, res))
    assert isinstance(doc, dict) and TOP_KEYS <= set(doc), "keys %s\n%s" % (sorted(doc), res)
    assert isinstance(doc["can_start"], bool), str(res)
    for key in ("hosts", "blockers", "warnings", "notes"):
        assert isinstance(doc[key], list), "%s is not a list\n%s" % (key, res)
    for host in doc["hosts"]:
        assert HOST_KEYS <= set(host), "host entry keys %s\n%s" % (sorted(host), res)
        assert isinstance(host["reachable"], bool), str(res)
        if host["reachable"]:
            assert REPORT_KEYS <= set(host), "host entry keys %s\n%s" % (sorted(host), res)
            assert GPU_KEYS <= set(host["gpus"]), "gpus keys %s\n%s" % (sorted(host["gpus"]), res)
            assert isinstance(host["ports"], list), str(res)
    return doc


def host_entries(doc):
    return {h["host"]: h for h in doc["hosts"]}


def assert_no_driver_host(entry, res):
    """A reachable host of this machine (no NVIDIA driver) as --json reports it."""
    assert entry["reachable"] is True and entry["error"] == "", str(res)
    assert re.fullmatch(r"\d+\.\d+\.\d+", entry["agent_version"]), str(res)
    assert entry["hostname"] == HOSTNAME, str(res)
    gpus = entry["gpus"]
    assert gpus["driver_found"] is False, str(res)
    assert "driver" in gpus["problem"].lower(), str(res)
    assert gpus["gpus"] == [], str(res)
    assert entry["free_gpus"] == 0, str(res)


def assert_nothing_left(launcher, res):
    left = launcher.wait_gone(5, ("cmdline", "environ"))
    assert not left, "processes left behind: %s\n%s" % (left, res)


def port_entry(entry, port, res):
    ports = [p for p in entry["ports"] if p["port"] == port]
    assert len(ports) == 1, "port %d not reported once for %s\n%s" % (port, entry["host"], res)
    return ports[0]


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture
def held_socket():
    """A factory held_socket(addr, listen=True) -> (socket, port): a TCP socket of this process
    bound to addr on a port the OS picks; closed after the test."""
    socks = []

    def hold(addr="127.0.0.1", listen=True):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            pytest.skip("no socket of family %s: %s" % (family, e))
        socks.append(s)
        try:
            s.bind((addr, 0))
        except OSError as e:
            pytest.skip("cannot bind %s: %s" % (addr, e))
        if listen:
            s.listen()
        return s, s.getsockname()[1]

    yield hold
    for s in socks:
        s.close()


@pytest.fixture
def port_holder():
    """A factory port_holder(addr, listen=True, netns=None) -> (pid, port): a child process
    holding a TCP port (inside network namespace `netns` when given); SIGKILLed, by pid, after
    the test."""
    procs = []

    def start(addr="127.0.0.1", listen=True, netns=None):
        argv = [PY, "-c", HOLDER, addr, "1" if listen else "0"]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]  # execs: the pid is the holder's own
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        procs.append(p)
        ready, _, _ = select.select([p.stdout], [], [], 15)
        line = p.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            p.kill()
            err = p.stderr.read() if p.poll() is not None else b""
            pytest.fail("the port holder did not start (%r): %r" % (line, err))
        return p.pid, int(line)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdout, p.stderr):
            f.close()


# ---- --check on this machine ----------------------------------------------------------------

def test_check_table_local(launcher):
    """No hosts: the local host, with its hostname, version and ranks; no NVIDIA driver is a
    note (ranks run on CPU), not a blocker; exit 0; no agent left behind."""
    res = launcher.run(["--check"])
    assert res.rc == 0, str(res)
    lines = res.out.splitlines()
    head = r"host localhost \(%s, %s, %d ranks\)" % (re.escape(HOSTNAME), VERSION_RE, nproc())
    assert any(re.fullmatch(head, l) for l in lines), "no line %r\n%s" % (head, res)
    gpu = [l for l in lines if "GPUs:" in l]
    assert len(gpu) == 1, str(res)
    assert "no NVIDIA driver" in gpu[0] and "CPU" in gpu[0], str(res)
    assert "BLOCKS THE JOB" not in res.out, str(res)
    assert lines[-1] == "result: the job can start", str(res)
    assert_nothing_left(launcher, res)


def test_check_json_local(launcher):
    """--check --json: one JSON document with every key; can_start true; the driver's absence
    is a note, not a blocker; no port asked, none reported."""
    res = launcher.run(["--check", "--json"])
    assert res.rc == 0, str(res)
    doc = check_json(res)
    assert doc["can_start"] is True and doc["blockers"] == [], str(res)
    assert len(doc["hosts"]) == 1 and doc["hosts"][0]["host"] == "localhost", str(res)
    entry = doc["hosts"][0]
    assert_no_driver_host(entry, res)
    assert entry["ranks"] == nproc(), str(res)
    assert entry["ports"] == [], str(res)
    assert any("localhost" in n and "CPU" in n for n in doc["notes"]), str(res)
    assert isinstance(doc["gpu_busy_threshold_mib"], int), str(res)
    assert_nothing_left(launcher, res)


def test_check_json_threshold(launcher):
    """--gpu-busy-threshold is echoed in gpu_busy_threshold_mib."""
    res = launcher.run(["--check", "--json", "--gpu-busy-threshold", "1000"])
    assert res.rc == 0, str(res)
    assert check_json(res)["gpu_busy_threshold_mib"] == 1000, str(res)


def test_check_json_local_aliases(launcher):
    """-H localhost:2,127.0.0.1:1: names of this machine are one host (one agent), named as
    first mentioned, reachable, with the 3 ranks it would run."""
    res = launcher.run(["--check", "--json", "-H", "localhost:2,127.0.0.1:1"])
    assert res.rc == 0, str(res)
    doc = check_json(res)
    assert [h["host"] for h in doc["hosts"]] == ["localhost"], str(res)
    assert_no_driver_host(doc["hosts"][0], res)
    assert doc["hosts"][0]["ranks"] == 3, str(res)
    assert doc["can_start"] is True, str(res)


def test_check_with_an_unreachable_host(launcher):
    """One host that cannot be reached (a name that does not resolve): the reachable one still
    shows the ranks it would run, in both forms; each message names the lost host once."""
    args = ["--check", "-H", "localhost:2,nosuch.invalid:1"]
    res = launcher.run(args)
    assert res.rc == 1, str(res)
    assert re.search(r"^host localhost \(.*, 2 ranks\)$", res.out, re.M), str(res)
    lines = [l for l in res.out.splitlines() if "nosuch.invalid" in l]
    assert len(lines) == 2, str(res)  # its UNREACHABLE line and its blocker
    for line in lines:
        assert line.count("host nosuch.invalid") == 1, line
        assert "cannot resolve" in line, line
    doc = check_json(launcher.run(args[:1] + ["--json"] + args[1:]))
    assert [h["ranks"] for h in doc["hosts"]] == [2, 1], doc
    assert [h["reachable"] for h in doc["hosts"]] == [True, False], doc
    assert doc["hosts"][1]["error"].startswith("cannot resolve the name"), doc
    assert doc["blockers"] == ["host nosuch.invalid: " + doc["hosts"][1]["error"]], doc


def test_check_free_master_port(launcher):
    """A free --master-port is reported as free on rank 0's host and blocks nothing."""
    port = free_port()
    res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 0, str(res)
    doc = check_json(res)
    use = port_entry(doc["hosts"][0], port, res)
    assert use["in_use"] is False and use["holders"] == [], str(res)
    assert doc["can_start"] is True, str(res)
    res = launcher.run(["--check", "--master-port", str(port)])
    assert res.rc == 0, str(res)
    assert "port %d is free" % port in res.out, str(res)


def test_check_placement_blocker(launcher):
    """-np 9 on 2 slots: a blocker "the job cannot be placed", exit 1, in both forms."""
    res = launcher.run(["--check", "-np", "9", "-H", "localhost:2"])
    assert res.rc == 1, str(res)
    blocks = [l for l in res.out.splitlines() if l.startswith("BLOCKS THE JOB: ")]
    assert len(blocks) == 1 and "the job cannot be placed" in blocks[0], str(res)
    assert res.out.splitlines()[-1].startswith("result: the job cannot start"), str(res)
    res = launcher.run(["--check", "--json", "-np", "9", "-H", "localhost:2"])
    assert res.rc == 1, str(res)
    doc = check_json(res)
    assert doc["can_start"] is False, str(res)
    assert any("the job cannot be placed" in b for b in doc["blockers"]), str(res)


# ---- ports held on this machine -------------------------------------------------------------

@pytest.mark.parametrize("addr", ["127.0.0.1", "::1"])
def test_check_listening_port_blocks(launcher, held_socket, addr):
    """A port this test process listens on: the table names it with this process's pid and
    blocks the job (exit 1); --json has can_start false and the port in use by this pid."""
    _, port = held_socket(addr)
    me = os.getpid()
    family = "IPv6" if ":" in addr else "IPv4"
    res = launcher.run(["--check", "--master-port", str(port)])
    assert res.rc == 1, str(res)
    blocks = [l for l in res.out.splitlines() if l.startswith("BLOCKS THE JOB: ")]
    assert len(blocks) == 1, str(res)
    assert "port %d" % port in blocks[0] and "pid %d " % me in blocks[0], str(res)
    assert "LISTEN on %s" % family in blocks[0], str(res)
    assert res.out.splitlines()[-1].startswith("result: the job cannot start"), str(res)

    res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 1, str(res)
    doc = check_json(res)
    assert doc["can_start"] is False, str(res)
    use = port_entry(doc["hosts"][0], port, res)
    assert use["in_use"] is True, str(res)
    assert [h["pid"] for h in use["holders"]] == [me], str(res)
    assert "LISTEN on %s" % family in use["detail"], str(res)
    assert any("port %d" % port in b for b in doc["blockers"]), str(res)


@pytest.mark.skipif(not kernel_at_least(6, 8),
                    reason="bound-only sockets are listed by sock_diag from Linux 6.8 on")
@pytest.mark.parametrize("addr", ["127.0.0.1", "::1"])
def test_check_bound_port_blocks(launcher, held_socket, addr):
    """A socket bound to the port but not listening also makes it in use."""
    _, port = held_socket(addr, listen=False)
    res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 1, str(res)
    doc = check_json(res)
    assert doc["can_start"] is False, str(res)
    use = port_entry(doc["hosts"][0], port, res)
    assert use["in_use"] is True, str(res)
    assert [h["pid"] for h in use["holders"]] == [os.getpid()], str(res)
    assert "bound" in use["detail"], str(res)


def test_check_port_held_by_child(launcher, port_holder):
    """The holder named is the process that holds the socket (a child of the test)."""
    pid, port = port_holder("127.0.0.1")
    res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 1, str(res)
    use = port_entry(check_json(res)["hosts"][0], port, res)
    assert use["in_use"] is True, str(res)
    assert [h["pid"] for h in use["holders"]] == [pid], str(res)
    assert "python" in use["holders"][0]["command"], str(res)


def test_check_established_port_blocks(launcher):
    """A port with only a connection left on it (its listener closed) is in use, by the process
    holding the connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        accepted, _ = listener.accept()
    with client, accepted:
        res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 1, str(res)
    use = port_entry(check_json(res)["hosts"][0], port, res)
    assert use["in_use"] is True and "ESTABLISHED" in use["detail"], str(res)
    assert [h["pid"] for h in use["holders"]] == [os.getpid()], str(res)


def test_check_time_wait_port_is_free(launcher):
    """A port whose only socket is in TIME_WAIT (no process holds it) is free."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        accepted, _ = listener.accept()
    accepted.close()  # the side that closes first keeps TIME_WAIT on `port`
    client.recv(1)
    client.close()
    time.sleep(0.2)
    res = launcher.run(["--check", "--json", "--master-port", str(port)])
    assert res.rc == 0, str(res)
    doc = check_json(res)
    use = port_entry(doc["hosts"][0], port, res)
    assert use["in_use"] is False and doc["can_start"] is True, str(res)


def test_check_json_non_utf8_holder_command(launcher):
    """The holder's command line is not UTF-8 (an argument with bytes 0xe9 0xff, well inside
    the 200 bytes kept): --check --json still prints one JSON document naming the holder's pid
    (the table shows it too)."""
    script = launcher.tmp / "hold.py"
    script.write_text(HOLDER)
    argv = [PY.encode(), bytes(script), b"127.0.0.1", b"1", b"caf\xe9\xff"]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 15)
        line = p.stdout.readline() if ready else b""
        assert line.strip().isdigit(), "the port holder did not start: %r" % line
        port = int(line)
        table = launcher.run(["--check", "--master-port", str(port)])
        res = launcher.run(["--check", "--json", "--master-port", str(port)])
    finally:
        p.kill()
        p.wait(10)
        p.stdout.close()
    assert table.rc == 1 and "pid %d " % p.pid in table.out, str(table)
    assert res.rc == 1, str(res)
    doc = check_json(res)
    use = port_entry(doc["hosts"][0], port, res)
    assert use["in_use"] is True and [h["pid"] for h in use["holders"]] == [p.pid], str(res)
    assert "hold.py" in use["holders"][0]["command"], str(res)


@pytest.mark.parametrize("addr", ["127.0.0.1", "::1"])
def test_launch_preflight_stops_on_held_port(launcher, port_holder, addr):
    """A launch with a --master-port that a process listens on exits 1 with one error naming the
    port and the holder's pid, and runs nothing: no rank started, no process left."""
    if addr == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    pid, port = port_holder(addr)
    prog = launcher.prog("put('ran')\n")
    res = launcher.run(["--master-port", str(port), "-np", "2", PY, prog])
    assert res.rc == 1, str(res)
    errors = [l for l in res.own_messages() if l.startswith("perseusrun: error: ")]
    assert len(errors) == 1, str(res)
    assert "port %d" % port in errors[0] and "pid %d " % pid in errors[0], str(res)
    assert res.stdout == b"", str(res)
    time.sleep(0.3)
    assert launcher.started() == [] and not (launcher.out / "ran").exists(), str(res)
    assert_nothing_left(launcher, res)


def test_launch_no_preflight_runs(launcher, port_holder):
    """--no-preflight skips the port check: the job runs with the held --master-port as
    MASTER_PORT (the ranks do not bind it)."""
    _, port = port_holder("127.0.0.1")
    prog = launcher.prog("dump_env()\nput('ran.%d' % RANK)\n")
    res = launcher.run(["--no-preflight", "--master-port", str(port), "-np", "2", PY, prog])
    assert res.rc == 0, str(res)
    assert launcher.files("ran.") == ["ran.0", "ran.1"], str(res)
    assert {e.get("MASTER_PORT") for e in launcher.envs()} == {str(port)}, str(res)


def test_launch_preflight_free_port_runs(launcher):
    """A free --master-port passes the preflight: the job runs with it as MASTER_PORT."""
    port = free_port()
    prog = launcher.prog("dump_env()\nput('ran.%d' % RANK)\n")
    res = launcher.run(["--master-port", str(port), "-np", "2", PY, prog])
    assert res.rc == 0, str(res)
    assert launcher.files("ran.") == ["ran.0", "ran.1"], str(res)
    assert {e.get("MASTER_PORT") for e in launcher.envs()} == {str(port)}, str(res)


# ---- usage errors ---------------------------------------------------------------------------

def test_json_without_check(launcher):
    expect_usage_error(launcher, ["--json"], "--json", "--check")


def test_check_with_program(launcher):
    expect_usage_error(launcher, ["--check"], "--check")


@pytest.mark.parametrize("value", ["-5", "abc"])
def test_bad_gpu_busy_threshold(launcher, value):
    expect_usage_error(launcher, ["--check", "--gpu-busy-threshold", value],
                       "--gpu-busy-threshold", with_prog=False)
    expect_usage_error(launcher, ["--gpu-busy-threshold", value], "--gpu-busy-threshold")


# ---- over SSH (test hosts) ------------------------------------------------------------------

def ssh_env(launcher, hosts):
    return launcher.env(HOME=str(hosts.home), SSH_AUTH_SOCK=None, SSH_AGENT_PID=None)


@pytest.fixture
def hosts(launcher, test_hosts):
    """The module's three hosts; afterwards what the test left on them is killed and stopped
    hosts are restarted."""
    yield test_hosts
    launcher.cleanup()
    test_hosts.kill_leftovers()
    for i in range(test_hosts.count):
        if test_hosts.sshd_pid(i) is None:
            test_hosts.start_host(i)


def test_check_ssh_hosts(launcher, hosts):
    """-H a,b,c --check: every host reachable, with its hostname and one rank; exit 0."""
    env = ssh_env(launcher, hosts)
    res = launcher.run(["--check", "-H", ",".join(hosts.addresses)], env=env)
    assert res.rc == 0, str(res)
    lines = res.out.splitlines()
    for addr in hosts.addresses:
        head = r"host %s \(%s, %s, 1 ranks\)" % (re.escape(addr), re.escape(HOSTNAME), VERSION_RE)
        assert any(re.fullmatch(head, l) for l in lines), "no line %r\n%s" % (head, res)
    assert "UNREACHABLE" not in res.out and lines[-1] == "result: the job can start", str(res)

    res = launcher.run(["--check", "--json", "-H", ",".join(hosts.addresses)], env=env)
    assert res.rc == 0, str(res)
    doc = check_json(res)
    assert [h["host"] for h in doc["hosts"]] == hosts.addresses, str(res)
    for entry in doc["hosts"]:
        assert_no_driver_host(entry, res)
        assert entry["ranks"] == 1, str(res)
    assert doc["can_start"] is True, str(res)


def test_check_ssh_port_on_rank0_host(launcher, hosts, port_holder):
    """--master-port is checked on rank 0's host, in its own network: a port listened on inside
    host 0's namespace blocks the job, naming that host and the holder's pid; a launch stops
    before any rank runs."""
    pid, port = port_holder("0.0.0.0", netns=hosts.namespaces[0])
    env = ssh_env(launcher, hosts)
    hostlist = ",".join(hosts.addresses)
    res = launcher.run(["--check", "--json", "--master-port", str(port), "-H", hostlist],
                       env=env)
    assert res.rc == 1, str(res)
    doc = check_json(res)
    assert doc["can_start"] is False, str(res)
    by_host = host_entries(doc)
    use = port_entry(by_host[hosts.addresses[0]], port, res)
    assert use["in_use"] is True and [h["pid"] for h in use["holders"]] == [pid], str(res)
    blockers = [b for b in doc["blockers"] if "port %d" % port in b]
    assert len(blockers) == 1 and hosts.addresses[0] in blockers[0], str(res)
    for addr in hosts.addresses[1:]:  # the port is free in their networks
        assert not any(u["in_use"] for u in by_host[addr]["ports"]), str(res)

    prog = launcher.prog("put('ran')\n")
    res = launcher.run(["--master-port", str(port), "-H", hostlist, PY, prog, launcher.marker],
                       env=env)
    assert res.rc == 1, str(res)
    errors = [l for l in res.own_messages() if l.startswith("perseusrun: error: ")]
    assert len(errors) == 1, str(res)
    assert hosts.addresses[0] in errors[0] and "pid %d " % pid in errors[0], str(res)
    time.sleep(0.3)
    assert launcher.started() == [], str(res)
    end = time.monotonic() + 5
    while True:
        left = {p for i in range(hosts.count) for p in hosts.pids_on(i)} - {
            hosts.sshd_pid(i) for i in range(hosts.count)} - {pid}
        if not left or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert not left, "left on the hosts: %s\n%s" % (sorted(left), res)


def test_check_ssh_unreachable_host(launcher, make_test_hosts):
    """One host's sshd stopped: the table names it UNREACHABLE with the cause, the others are
    still reported, exit 1; --json has reachable false and the error for it."""
    h = make_test_hosts(3)
    try:
        h.stop_host(1)
        env = ssh_env(launcher, h)
        down = h.addresses[1]
        res = launcher.run(["--check", "-H", ",".join(h.addresses)], env=env)
        assert res.rc == 1, str(res)
        lines = res.out.splitlines()
        bad = [l for l in lines if l.startswith("host %s: UNREACHABLE: " % down)]
        assert len(bad) == 1 and "refused" in bad[0].lower(), str(res)
        for addr in (h.addresses[0], h.addresses[2]):
            head = r"host %s \(%s, %s, \d+ ranks\)" % (re.escape(addr), re.escape(HOSTNAME),
                                                       VERSION_RE)
            assert any(re.fullmatch(head, l) for l in lines), "no line %r\n%s" % (head, res)
        assert any(l.startswith("BLOCKS THE JOB: host %s: " % down) for l in lines), str(res)
        assert lines[-1].startswith("result: the job cannot start"), str(res)

        res = launcher.run(["--check", "--json", "-H", ",".join(h.addresses)], env=env)
        assert res.rc == 1, str(res)
        doc = check_json(res)
        assert doc["can_start"] is False, str(res)
        assert [e["host"] for e in doc["hosts"]] == h.addresses, str(res)
        by_host = host_entries(doc)
        assert by_host[down]["reachable"] is False and by_host[down]["error"], str(res)
        for addr in (h.addresses[0], h.addresses[2]):
            assert_no_driver_host(by_host[addr], res)
        assert any(down in b for b in doc["blockers"]), str(res)
    finally:
        launcher.cleanup()
        h.kill_leftovers()
