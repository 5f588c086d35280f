"""Output nobody reads never disables control: with perseusrun's stdout in a pipe whose reader
never reads, a SIGKILLed rank, SIGTERM, SIGINT and --timeout still end the job within 10 s,
nothing is left running, and the output that could not be written is reported on stderr.
Also: /dev/full is said, the failing rank's last stderr lines are in the summary, and the
input errors of -np, -wdir and -x."""

import os
import signal
import subprocess
import time

import pytest

from conftest import PY, TIMEOUT

# Every rank writes lines until it is ended; the pipe fills within milliseconds.
CHATTY = (
    "put('ready.%d.%d' % (RANK, os.getpid()))\n"
    "line = ('rank %d ' % RANK) + 'x' * 200\n"
    "while True:\n"
    "    print(line, flush=True)\n")

LOSS = "could not be written to perseusrun's stdout and were dropped"


def start_stalled(launcher, extra=()):
    """perseusrun with 2 chatty ranks, its stdout a pipe nobody reads; returns (proc, read end)."""
    read_end, write_end = os.pipe()
    stdout = os.fdopen(write_end, "wb")
    prog = launcher.prog(CHATTY)
    p = launcher.start(["-np", "2", "-H", "localhost:2", *extra, PY, prog, launcher.marker],
                       stdout=stdout)
    stdout.close()  # perseusrun holds the only write end now
    launcher.wait_files("ready.", 2, proc=p)
    time.sleep(1.5)  # the pipe and every queue behind it fill up
    return p, read_end


def end_stalled(launcher, p, read_end, t0):
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
        pytest.fail("perseusrun did not end with its stdout stalled (killed after %.0f s)"
                    % TIMEOUT)
    elapsed = time.monotonic() - t0
    p.bb_stderr.seek(0)
    err = p.bb_stderr.read().decode("utf-8", "replace")
    os.close(read_end)
    return rc, elapsed, err


def rank_pid(launcher, rank):
    name = launcher.files("ready.%d." % rank)[0]
    return int(name.split(".")[2])


@pytest.mark.parametrize("how,code", [("kill-rank", 137), ("sigterm", 143), ("sigint", 130),
                                      ("timeout", 124)])
def test_stalled_stdout_does_not_stop_control(launcher, how, code):
    p, read_end = start_stalled(launcher, ["--timeout", "3"] if how == "timeout" else [])
    t0 = time.monotonic()
    if how == "kill-rank":
        os.kill(rank_pid(launcher, 1), signal.SIGKILL)
    elif how == "sigterm":
        p.send_signal(signal.SIGTERM)
    elif how == "sigint":
        p.send_signal(signal.SIGINT)
    rc, elapsed, err = end_stalled(launcher, p, read_end, t0)
    assert rc == code, err[-3000:]
    # The goal is 10 s after the failure (--timeout 3 counts from the start, 1.5 s before t0).
    assert elapsed < 10, "took %.1f s\n%s" % (elapsed, err[-3000:])
    assert LOSS in err, err[-3000:]
    assert "rank 0: " in err.split(LOSS)[1], err[-3000:]
    left = launcher.wait_gone(3)
    assert left == {}, "processes of the job left after perseusrun exited: %s" % left


def test_slow_reader_loses_nothing(launcher):
    """Back-pressure, not loss, while the reader is only slow: the ranks wait for it, and
    after the ranks' end perseusrun waits for it as long as it reads."""
    prog = launcher.prog(
        "for i in range(3000):\n"
        "    print('%d %d ' % (RANK, i) + 'y' * 1000, flush=True)\n")
    read_end, write_end = os.pipe()
    stdout = os.fdopen(write_end, "wb")
    p = launcher.start(["-np", "2", "-H", "localhost:2", PY, prog, launcher.marker],
                       stdout=stdout)
    stdout.close()
    time.sleep(1)  # nobody reads for a while: perseusrun holds the ranks back
    data = b""
    # Then slowly: it takes longer than the 2 s perseusrun waits for a stuck reader, but the
    # reader makes progress, so nothing is dropped.
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        data += chunk
        time.sleep(0.002)
    os.close(read_end)
    rc = p.wait(TIMEOUT)
    p.bb_stderr.seek(0)
    err = p.bb_stderr.read().decode("utf-8", "replace")
    assert rc == 0, err
    assert LOSS not in err, err
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 6000
    for r in range(2):
        mine = [l for l in lines if l.startswith(b"[1,%d]<stdout>:" % r)]
        assert [int(l.split(b":")[1].split()[1]) for l in mine] == list(range(3000))


def test_dev_full_is_said_once(launcher):
    prog = launcher.prog("for i in range(100):\n    print('line', i)\n")
    with open("/dev/full", "wb") as full:
        p = launcher.start(["-np", "2", "-H", "localhost:2", PY, prog], stdout=full)
        rc = p.wait(TIMEOUT)
    p.bb_stderr.seek(0)
    err = p.bb_stderr.read().decode("utf-8", "replace")
    assert rc == 0, err
    said = [l for l in err.splitlines() if "No space left on device" in l]
    assert len(said) == 1, err
    assert said[0].startswith("perseusrun: error: ") and "stdout" in said[0], err
    assert LOSS in err, err


def test_failing_rank_traceback_in_summary(launcher, tmp_path):
    prog = launcher.prog(
        "if RANK == 1:\n"
        "    print('some noise', file=sys.stderr)\n"
        "    def epoch_end():\n"
        "        raise RuntimeError('bad batch 17')\n"
        "    epoch_end()\n"
        "sleep_for(30)\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--output-filename",
                        str(tmp_path / "logs"), PY, prog])
    assert res.rc == 1, str(res)
    msgs = res.own_messages()
    head = [i for i, m in enumerate(msgs) if "the last" in m and "lines of its stderr" in m]
    assert head, str(res)
    assert msgs[head[0]].startswith("perseusrun: rank 1 (host localhost, pid "), str(res)
    assert "exited with code 1" in msgs[head[0]], str(res)
    tail = msgs[head[0] + 1:]
    assert "perseusrun: | Traceback (most recent call last):" in tail, str(res)
    assert "perseusrun: | RuntimeError: bad batch 17" in tail, str(res)
    assert any("in epoch_end" in m for m in tail), str(res)


def test_np_above_the_cap(launcher):
    res = launcher.run(["-np", "1000000", "--oversubscribe", "-H", "localhost:1", "true"])
    assert res.rc == 2, str(res)
    assert "perseusrun: error: -np 1000000 is more than the 65536 ranks" in res.err, str(res)
    assert res.elapsed < 10, str(res)


def test_wdir_that_does_not_exist(launcher):
    prog = launcher.prog("put('ran')")
    res = launcher.run(["-np", "2", "-H", "localhost:2", "-wdir", "/nonexistent/dir", PY, prog])
    assert res.rc == 2, str(res)
    assert ("the working directory of the ranks, /nonexistent/dir, does not exist on host "
            "localhost") in res.err, str(res)
    assert "cannot run" not in res.err, str(res)
    assert launcher.started() == [], "a rank started"


@pytest.mark.parametrize("value", ["A B=1", "1X=2", "A-B"])
def test_x_with_a_bad_name(launcher, value):
    prog = launcher.prog("put('ran')")
    res = launcher.run(["-np", "1", "-x", value, PY, prog])
    assert res.rc == 2, str(res)
    assert "perseusrun: error: -x '%s'" % value in res.err, str(res)
    assert "not a valid environment variable name" in res.err, str(res)
    assert launcher.started() == [], "a rank started"
