"""Failure handling: fail-fast, exit codes, the summary line, --kill-grace, --timeout, and no
process of the job left behind (children, setsid'd grandchildren, double-forked daemons)."""

import os
import re
import signal
import time

import pytest

from conftest import PY, TIMEOUT

SUMMARY_RE = re.compile(
    r"^perseusrun: rank (\d+) \(host (\S+), pid (\d+)\) "
    r"(?:exited with code (\d+)|was killed by signal (\d+) \((SIG[A-Z0-9]+)\)); ending the job$")


def summary(res):
    """The one summary line; returns its match."""
    lines = [l for l in res.own_messages() if "ending the job" in l]
    assert len(lines) == 1, "expected exactly one summary line\n%s" % res
    m = SUMMARY_RE.match(lines[0])
    assert m, "summary line not in the specified form: %r" % lines[0]
    return m


# Every rank: records SIGTERM/SIGINT, reports ready.<rank>, then waits for the others.
COMMON = (
    "record_signals(signal.SIGTERM, signal.SIGINT)\n"
    "put('pid.%d' % RANK, str(os.getpid()))\n"
    "put('ready.%d' % RANK)\n")


def fail_prog(launcher, nranks, failing_rank, how, sleep=120):
    return launcher.prog(
        COMMON +
        "if RANK == %d:\n"
        "    wait_count('ready.', %d)\n"
        "    put('failed_at', repr(time.time()))\n"
        "    %s\n"
        "sleep_for(%d)\n" % (failing_rank, nranks, how, sleep))


@pytest.mark.parametrize("code", [9, 1, 255])
def test_fail_fast_exit_code(launcher, code):
    prog = fail_prog(launcher, 4, 2, "os._exit(%d)" % code)
    res = launcher.run(["-np", "4", "-H", "localhost:4", PY, prog, launcher.marker])
    t_exit = time.time()
    assert res.rc == code, str(res)
    assert res.elapsed < 60, "took %.1f s: not fail-fast (ranks sleep 120 s)" % res.elapsed
    failed_at = float(launcher.read("failed_at"))
    assert t_exit - failed_at < 15, "%.1f s from the failure to the end" % (t_exit - failed_at)
    m = summary(res)
    assert m.group(1) == "2" and m.group(4) == str(code), str(res)
    assert m.group(3) == launcher.read("pid.2").decode(), "pid in summary is not rank 2's"
    # every other rank was sent SIGTERM
    for r in (0, 1, 3):
        got = launcher.files("signal.%d." % r)
        assert got, "rank %d got no SIGTERM\n%s" % (r, res)
        assert launcher.read(got[0]) == b"%d" % signal.SIGTERM
    assert launcher.wait_gone(3) == {}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_rank_killed_by_signal(launcher, sig):
    how = ("import resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
           + ("" if sig == signal.SIGKILL else "signal.signal(%d, signal.SIG_DFL); " % sig)
           + "os.kill(os.getpid(), %d); time.sleep(10)" % sig)
    prog = fail_prog(launcher, 3, 1, how)
    res = launcher.run(["-np", "3", "-H", "localhost:3", PY, prog, launcher.marker])
    assert res.rc == 128 + sig, str(res)
    assert res.elapsed < 60, str(res)
    m = summary(res)
    assert m.group(1) == "1", str(res)
    assert m.group(5) == str(int(sig)) and m.group(6) == sig.name, str(res)
    assert m.group(3) == launcher.read("pid.1").decode()
    assert launcher.wait_gone(3) == {}


@pytest.mark.parametrize("grace", [2, None])
def test_kill_grace(launcher, grace):
    """Rank 0 ignores SIGTERM; it gets SIGKILL after --kill-grace (default 5 s)."""
    prog = launcher.prog(
        "put('ready.%d' % RANK)\n"
        "if RANK == 0:\n"
        "    ignore_signals(signal.SIGTERM)\n"
        "    put('ignoring')\n"
        "    sleep_for(120)\n"
        "wait_count('ignoring', 1)\n"
        "put('failed_at', repr(time.time()))\n"
        "os._exit(4)\n")
    args = ["-np", "2", "-H", "localhost:2"]
    if grace is not None:
        args += ["--kill-grace", str(grace)]
    res = launcher.run([*args, PY, prog, launcher.marker], timeout=TIMEOUT * 2)
    t_exit = time.time()
    assert res.rc == 4, str(res)
    waited = t_exit - float(launcher.read("failed_at"))
    expected = 5 if grace is None else grace
    assert waited >= expected - 0.5, "SIGKILL came after %.2f s, grace is %d s" % (waited, expected)
    assert waited < expected + 15, "perseusrun ended %.2f s after the failure" % waited
    assert launcher.files("ignored.0."), "rank 0 never got SIGTERM"
    assert launcher.wait_gone(3) == {}
    assert summary(res).group(1) == "1"


def _children_map():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    return children


def _state(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return b"gone"
    return data[data.rindex(b")") + 2:data.rindex(b")") + 3]


def test_lowest_failing_rank_reported(launcher):
    """Ranks 3 and 1 fail on their own at the same moment: rank 1 is reported and its code is
    perseusrun's. To make "the same moment" exact, the test freezes perseusrun and its helper
    processes (everything in its process tree except the ranks) with SIGSTOP, lets both ranks
    exit, waits until both are zombies, then lets perseusrun continue."""
    prog = launcher.prog(
        "put('pid.%d' % RANK, str(os.getpid()))\n"
        "put('ready.%d' % RANK)\n"
        "if RANK in (1, 3):\n"
        "    wait_count('go', 1)\n"
        "    os._exit({1: 7, 3: 5}[RANK])\n"
        "sleep_for(120)\n")
    p = launcher.start(["-np", "4", "-H", "localhost:4", "--kill-grace", "2", PY, prog,
                        launcher.marker])
    launcher.wait_files("ready.", 4, proc=p)
    ranks = {int(launcher.read("pid.%d" % r)) for r in range(4)}
    children = _children_map()
    machinery, todo = [], [p.pid]
    while todo:
        pid = todo.pop()
        if pid in ranks:
            continue
        machinery.append(pid)
        todo.extend(children.get(pid, []))
    failing = [int(launcher.read("pid.%d" % r)) for r in (1, 3)]
    stopped = []
    try:
        for pid in machinery:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        launcher.out.joinpath("go").write_text("")
        end = time.monotonic() + TIMEOUT
        while not all(_state(pid) in (b"Z", b"gone") for pid in failing):
            assert time.monotonic() < end, "ranks 1 and 3 did not exit"
            time.sleep(0.02)
    finally:
        for pid in reversed(stopped):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    res = launcher.finish(p)
    m = summary(res)
    assert (m.group(1), res.rc) == ("1", 7), str(res)


def test_successful_rank_does_not_end_job(launcher):
    prog = launcher.prog(
        "if RANK == 1:\n"
        "    time.sleep(1.5)\n"
        "    put('done')\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog])
    assert res.rc == 0, str(res)
    assert launcher.files("done") == ["done"], "rank 1 was ended when rank 0 exited 0\n%s" % res
    assert not [m for m in res.own_messages() if "ending the job" in m], str(res)


SPAWN_ALL = (
    "spawn_child()\n"
    "spawn_setsid()\n"
    "spawn_daemon()\n"
    "wait_count('alive.', 3)\n")


def test_no_process_left_after_normal_end(launcher):
    """Ranks exit 0 leaving a child, a setsid'd grandchild and a double-forked daemon behind
    (the daemon even keeps the rank's stdout open)."""
    prog = launcher.prog("if RANK == 0:\n" + "".join("    " + l + "\n" for l in
                                                     SPAWN_ALL.splitlines()) +
                         "print('rank %d done' % RANK, flush=True)\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog, launcher.marker])
    assert res.rc == 0, str(res)
    assert len(launcher.files("alive.")) == 3, launcher.files("")
    left = launcher.wait_gone(3)
    assert left == {}, "processes of the job left after perseusrun exited: %s" % left


def test_no_process_left_after_failure(launcher):
    prog = launcher.prog(
        "record_signals(signal.SIGTERM)\n"
        "if RANK == 0:\n" + "".join("    " + l + "\n" for l in SPAWN_ALL.splitlines()) +
        "    put('spawned')\n"
        "    sleep_for(120)\n"
        "wait_count('spawned', 1)\n"
        "os._exit(3)\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog, launcher.marker])
    assert res.rc == 3, str(res)
    assert len(launcher.files("alive.")) == 3, launcher.files("")
    left = launcher.wait_gone(3)
    assert left == {}, "processes of the job left after perseusrun exited: %s" % left


def test_timeout(launcher):
    prog = launcher.prog(
        "if RANK == 0:\n" + "".join("    " + l + "\n" for l in SPAWN_ALL.splitlines()) +
        "sleep_for(120)\n")
    res = launcher.run(["--timeout", "3", "-np", "2", "-H", "localhost:2", PY, prog,
                        launcher.marker])
    assert res.rc == 124, str(res)
    assert "--timeout" in res.err, str(res)
    assert 2.5 <= res.elapsed < 3 + 25, "ended after %.1f s with --timeout 3" % res.elapsed
    assert launcher.wait_gone(3) == {}
