"""libperseus's asynchronous engine end to end: perseus_async_test and perseus_stall_test (C rank
programs of this folder) under the built perseusrun, on one host and across two SSH test hosts.

CTest sets PERSEUSRUN, PERSEUS_ASYNC_TEST and PERSEUS_STALL_TEST; run by hand they default to
the paths in <repo>/build (test_comm.py's helpers).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_comm import BUILD, PERSEUSRUN, TIMEOUT, clean_env, run, show  # noqa: E402

ASYNC = os.environ.get("PERSEUS_ASYNC_TEST") or str(BUILD / "tests/comm/perseus_async_test")
STALL = os.environ.get("PERSEUS_STALL_TEST") or str(BUILD / "tests/comm/perseus_stall_test")
PROCESS_SET = (os.environ.get("PERSEUS_PROCESS_SET_TEST")
               or str(BUILD / "tests/comm/perseus_process_set_test"))
BLACKBOX = Path(__file__).resolve().parents[1] / "blackbox"


def tagged(stream, rank, kind="stdout"):
    """The lines rank `rank` wrote to `kind`, untagged."""
    prefix = "[1,%d]<%s>:" % (rank, kind)
    return [line[len(prefix):] for line in stream.splitlines() if line.startswith(prefix)]


def assert_every_rank_ok(proc, n):
    assert proc.returncode == 0, show(proc)
    ok = {int(m.group(1)) for m in re.finditer(r"^\[1,(\d+)\]<stdout>:ok \(\d+ checks\)$",
                                                proc.stdout, re.M)}
    assert ok == set(range(n)), show(proc)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_dtype_size_in_random_orders(n):
    proc, elapsed = run(["-np", str(n), "-H", "localhost:%d" % n, ASYNC])
    assert_every_rank_ok(proc, n)
    print("np %d: %.1f s" % (n, elapsed))


def test_every_op_over_gloo_with_shared_memory_off():
    # PERSEUS_SHM=0: the host reductions (all-reduce, the reduce-scatter's ring) go over Gloo's
    # TCP even though every rank is on this host.
    proc, _ = run(["-np", "3", "-H", "localhost:3", ASYNC], env=clean_env(PERSEUS_SHM="0"))
    assert_every_rank_ok(proc, 3)


def test_small_fusion_buffer_and_shortest_cycle():
    # Fusion buffers of 4 KiB: the agreed all-reduces are split into many groups, some fused,
    # some alone; cycles as short as they go.
    env = clean_env(PERSEUS_FUSION_THRESHOLD="4096", PERSEUS_CYCLE_TIME="0")
    proc, _ = run(["-np", "2", "-H", "localhost:2", ASYNC], env=env)
    assert_every_rank_ok(proc, 2)


def test_count_zero_with_null_buffers_fused_with_others():
    proc, _ = run(["-np", "3", "-H", "localhost:3", ASYNC, "nullzero"])
    assert_every_rank_ok(proc, 3)
    assert "runtime error" not in proc.stderr, show(proc)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_many_allreduces_in_one_call_match_one_call_each(n):
    # perseus_comm_allreduce_many_async on even ranks, a call a tensor on odd ones, same names
    # and shapes: exact sums (5 dtypes and shapes, count 0 among them), twice; a shape that
    # differs on the last rank fails that tensor alone on every rank; an invalid dtype in
    # tensor 1 fails the call naming it, after tensor 0 was submitted (and completes).
    proc, _ = run(["-np", str(n), "-H", "localhost:%d" % n, ASYNC, "many"])
    assert_every_rank_ok(proc, n)


def test_stall_is_named_and_given_up():
    # Rank 1 never submits 'lonely' (it sleeps 7 s); ranks 0 and 2 do and wait. Rank 1 does
    # not wait for anything, so this is no deadlock, even with the shortest deadlock check.
    env = clean_env(PERSEUS_STALL_CHECK_SECONDS="2", PERSEUS_STALL_SHUTDOWN_SECONDS="4",
                    PERSEUS_DEADLOCK_SECONDS="1")
    proc, elapsed = run(["-np", "3", "-H", "localhost:3", STALL, "7"], env=env, timeout=120)
    assert proc.returncode == 0, show(proc)
    warnings = [l for l in tagged(proc.stderr, 0, "stderr") if "stall" in l]
    assert any("'lonely'" in l and re.search(r"waited \d+ s for ranks 1 \(submitted by ranks "
                                             r"0, 2\)", l) for l in warnings), show(proc)
    # Only rank 0 reports stalls.
    for rank in (1, 2):
        assert not any("stall" in l for l in tagged(proc.stderr, rank, "stderr")), show(proc)
    for rank in (0, 2):
        lines = [l for l in tagged(proc.stdout, rank) if "lonely: wait returned" in l]
        assert len(lines) == 1, show(proc)
        assert "wait returned -5:" in lines[0], show(proc)  # PERSEUS_ERROR_TIMEOUT
        assert "'lonely'" in lines[0] and "ranks 1 never submitted it" in lines[0], show(proc)
    for rank in range(3):
        assert "rank %d: after: ok" % rank in tagged(proc.stdout, rank), show(proc)
    assert elapsed < 60, show(proc)


def test_stall_reports_come_on_time():
    # Rank 0 looks every second: an operation is reported once it has waited
    # PERSEUS_STALL_CHECK_SECONDS (3), again every 3 s, and given up on at
    # PERSEUS_STALL_SHUTDOWN_SECONDS (7), not at the next multiple of the check (the first
    # report used to come at up to twice the check, 119 s by default).
    env = clean_env(PERSEUS_STALL_CHECK_SECONDS="3", PERSEUS_STALL_SHUTDOWN_SECONDS="7")
    proc, _ = run(["-np", "3", "-H", "localhost:3", STALL, "10"], env=env, timeout=120)
    assert proc.returncode == 0, show(proc)
    waited = [int(m.group(1)) for l in tagged(proc.stderr, 0, "stderr") if "'lonely'" in l
              for m in [re.search(r"has waited (\d+) s for ranks 1 ", l)] if m]
    assert len(waited) == 2, show(proc)
    assert 3 <= waited[0] <= 5 and 6 <= waited[1] <= 8, show(proc)  # slack for ASan builds
    for rank in (0, 2):
        lines = [l for l in tagged(proc.stdout, rank) if "lonely: wait returned -5:" in l]
        assert len(lines) == 1 and re.search(r"given up after [789] s", lines[0]), show(proc)


@pytest.mark.parametrize("check", [None, "2"])
def test_a_deadlock_fails_on_every_rank_naming_both_sides(check):
    # Ranks 0 and 2 wait for 'lonely', rank 1 in a barrier the others never enter: without a
    # check this hangs for ever (as it does in Horovod). Every rank waits and nothing is
    # submitted, so after PERSEUS_DEADLOCK_SECONDS (10 by default) both fail on every rank,
    # saying who submitted what, and the job goes on (unnamed barriers match again).
    env = clean_env(PERSEUS_DEADLOCK_SECONDS=check) if check else clean_env()
    started = time.monotonic()
    proc, _ = run(["-np", "3", "-H", "localhost:3", STALL, "0", "deadlock"], env=env, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, show(proc)
    expected = [r"barrier 'barrier\.noname\.0' \(submitted by ranks 1, never by ranks 0, 2\)",
                r"allreduce 'lonely' \(submitted by ranks 0, 2, never by ranks 1\)"]
    for rank in range(3):
        what = "barrier" if rank == 1 else "lonely: wait"
        lines = [l for l in tagged(proc.stdout, rank) if what + " returned" in l]
        assert len(lines) == 1, show(proc)
        assert "returned -5:" in lines[0] and "deadlock: every rank waits" in lines[0], show(proc)
        for pattern in expected:
            assert re.search(pattern, lines[0]), show(proc)
        assert "rank %d: after: ok" % rank in tagged(proc.stdout, rank), show(proc)
    assert any("deadlock" in l for l in tagged(proc.stderr, 0, "stderr")), show(proc)
    assert elapsed < (40 if check is None else 25), show(proc)


def test_mismatched_counts_fail_everywhere_and_the_job_goes_on():
    proc, _ = run(["-np", "3", "-H", "localhost:3", ASYNC, "mismatch"])
    assert proc.returncode == 0, show(proc)
    for rank in range(3):
        out = tagged(proc.stdout, rank)
        lines = [l for l in out if l.startswith("mismatch: wait returned")]
        assert len(lines) == 1, show(proc)
        line = lines[0]
        assert "wait returned -1:" in line, show(proc)  # PERSEUS_ERROR_INVALID_ARGUMENT
        assert "'mismatched'" in line and "count" in line, show(proc)
        assert "rank 0 gave 10" in line and "rank 1 11" in line and "rank 2 12" in line, \
            show(proc)
        assert "after: ok" in out, show(proc)


def test_join_lets_a_rank_with_fewer_steps_finish():
    # Rank 0 runs 3 allreduces, rank 1 runs 5; the last two sum rank 1's values with zeros.
    proc, _ = run(["-np", "2", "-H", "localhost:2", ASYNC, "join"])
    assert_every_rank_ok(proc, 2)
    for rank in range(2):
        assert "join: last_rank=1" in tagged(proc.stdout, rank), show(proc)


def test_timeline_is_a_json_trace(tmp_path):
    path = tmp_path / "timeline.json"
    proc, _ = run(["-np", "2", "-H", "localhost:2", ASYNC, "timeline"],
                  env=clean_env(PERSEUS_TIMELINE=str(path)))
    assert_every_rank_ok(proc, 2)
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list) and events, path.read_text()[:2000]
    names = {e.get("name") for e in events}
    assert "NEGOTIATE_ALLREDUCE" in names, sorted(names)
    assert "ALLREDUCE" in names, sorted(names)
    tensors = {e["args"]["name"] for e in events
               if e.get("name") == "process_name" and "args" in e}
    assert {"timeline.alpha", "timeline.beta", "timeline.gamma"} <= tensors, sorted(tensors)


def test_timeline_negotiate_phase_is_named_as_horovod_does(tmp_path):
    path = tmp_path / "timeline.json"
    proc, _ = run(["-np", "2", "-H", "localhost:2", ASYNC, "timeline"],
                  env=clean_env(PERSEUS_TIMELINE=str(path)))
    assert_every_rank_ok(proc, 2)
    with open(path) as f:
        names = {e.get("name") for e in json.load(f)}
    assert "NEGOTIATE_ALLREDUCE" in names, sorted(names)


# ---- across two SSH test hosts (tests/blackbox/testhosts.py) --------------------------------

def test_two_ssh_hosts_two_ranks_each(tmp_path):
    sys.path.insert(0, str(BLACKBOX))
    try:
        import testhosts
    finally:
        sys.path.remove(str(BLACKBOX))
    reason = testhosts.unavailable_reason()
    if reason:
        pytest.skip("test hosts unavailable: " + reason)
    with testhosts.TestHosts(2) as hosts:  # skips when it cannot make them; always cleans up
        env = clean_env(HOME=str(hosts.home))
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("SSH_AGENT_PID", None)
        args = [PERSEUSRUN, "-H", ",".join(a + ":2" for a in hosts.addresses), ASYNC]
        out, err = tmp_path / "stdout", tmp_path / "stderr"
        with open(out, "w+") as fo, open(err, "w+") as fe:
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, env=env,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=TIMEOUT)
            finally:
                if p.poll() is None:  # timed out or interrupted: end the job we started
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
                hosts.kill_leftovers()
        proc = subprocess.CompletedProcess(args, rc, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
        assert_every_rank_ok(proc, 4)
        # Nothing of the job is left on either host (only their sshd), bounded.
        end = time.monotonic() + 5
        while hosts.leftovers() and time.monotonic() < end:
            time.sleep(0.05)
        assert hosts.leftovers() == [], hosts.leftovers()


@pytest.mark.parametrize("n", [3, 4])
def test_process_sets(n):
    # Even ranks, odd ranks and every rank but 0 as process sets, with set-0 operations in
    # between; members only take part; outsiders and unknown sets are refused.
    proc, _ = run(["-np", str(n), "-H", "localhost:%d" % n, PROCESS_SET])
    assert_every_rank_ok(proc, n)
