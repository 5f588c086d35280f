"""perseusrun --max-restarts (issue 20, torchrun's model): when a rank fails or a host is lost,
every rank of the job is ended and the job starts again, on the hosts still alive, with
TORCHELASTIC_RESTART_COUNT counting the restarts; a plain DDP script that resumes from its own
checkpoint finishes its training. Without the flag nothing changes (fail-fast).

Local jobs run here; the lost-host cases on the SSH test hosts (testhosts.py)."""

import json
import os
import re
import signal
import time

import pytest

from conftest import PY, TIMEOUT
from test_ssh import ssh_env, wait_hosts_clean
from test_ssh_faults import hosts, job_processes_on  # noqa: F401 - hosts: the fixture

HERE = os.path.dirname(os.path.abspath(__file__))

# Each round's ranks record their place and restart count; rank 1 fails with code 3 in the
# first FAILS rounds.
FLAKY = ("n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
         "put('round.%d.rank.%d' % (n, RANK), json.dumps({k: os.environ[k] for k in ("
         "'WORLD_SIZE', 'TORCHELASTIC_MAX_RESTARTS', 'MASTER_PORT', 'PERSEUS_RENDEZVOUS_PORT')}))\n"
         "if RANK == 1 and n < FAILS:\n"
         "    sleep_for(1)\n"
         "    print('rank 1 fails in round %d' % n, file=sys.stderr)\n"
         "    sys.exit(3)\n"
         "sleep_for(0.5)\n")


def flaky(launcher, fails):
    return launcher.prog("FAILS = %d\n" % fails + FLAKY)


def rounds(launcher):
    """{restart count: {rank: recorded variables}}."""
    found = {}
    for name in launcher.files("round."):
        _, n, _, rank = name.split(".")
        found.setdefault(int(n), {})[int(rank)] = json.loads(launcher.read(name))
    return found


def restart_summary(res):
    return [l for l in res.own_messages() if re.match(r"perseusrun:\s+\d+\. at ", l)]


def test_a_failing_rank_restarts_every_rank(launcher):
    res = launcher.run(["-np", "3", "-H", "localhost:3", "--max-restarts", "2", PY,
                        flaky(launcher, 2)])
    assert res.rc == 0, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0, 1, 2], str(res)
    for n, ranks in seen.items():
        assert sorted(ranks) == [0, 1, 2], (n, ranks)
        assert {v["WORLD_SIZE"] for v in ranks.values()} == {"3"}
        assert {v["TORCHELASTIC_MAX_RESTARTS"] for v in ranks.values()} == {"2"}
    # Each round has a rendezvous of its own (a new store, a new secret).
    ports = {n: {v["PERSEUS_RENDEZVOUS_PORT"] for v in ranks.values()} for n, ranks in seen.items()}
    assert all(len(p) == 1 for p in ports.values()), ports
    assert len({next(iter(p)) for p in ports.values()}) == 3, ports
    said = res.own_messages()
    assert any("restarting every rank (restart 1 of 2)" in l and "exited with code 3" in l
               for l in said), str(res)
    summary = restart_summary(res)
    assert len(summary) == 2 and all("rank 1" in l and "stopped" in l for l in summary), str(res)
    assert launcher.wait_gone(5, ("cmdline", "environ")) == {}, str(res)


def test_restarts_used_up_end_with_the_last_failure(launcher):
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--max-restarts", "1", PY,
                        flaky(launcher, 5)])
    assert res.rc == 3, str(res)
    assert sorted(rounds(launcher)) == [0, 1], str(res)
    assert len(restart_summary(res)) == 1, str(res)
    assert "rank 1 fails in round 1" in res.err, str(res)


def test_without_the_flag_the_first_failure_ends_the_job(launcher):
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, flaky(launcher, 1)])
    assert res.rc == 3, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0], str(res)
    assert {v["TORCHELASTIC_MAX_RESTARTS"] for v in seen[0].values()} == {"0"}
    assert not any("restart" in l for l in res.own_messages()), str(res)


def test_a_signal_to_perseusrun_is_not_restarted(launcher):
    p = launcher.start(["-np", "2", "-H", "localhost:2", "--max-restarts", "3", PY,
                        launcher.prog("sleep_for(60)\n")])
    launcher.wait_files("started.", 2, proc=p)
    p.send_signal(signal.SIGTERM)
    res = launcher.finish(p, timeout=30)
    assert res.rc == 128 + signal.SIGTERM, str(res)
    assert not any("restarting" in l for l in res.own_messages()), str(res)
    assert launcher.wait_gone(5, ("cmdline", "environ")) == {}, str(res)


def test_a_launch_error_is_not_restarted(launcher):
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--max-restarts", "3",
                        str(launcher.tmp / "no-such-program")])
    assert res.rc == 127, str(res)
    assert not any("restart" in l for l in res.own_messages()), str(res)


def test_timeout_counts_over_every_round(launcher):
    # Every round fails after about a second; --timeout 3 ends the job during a later round.
    body = "sleep_for(1)\nsys.exit(4)\n"
    t0 = time.monotonic()
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--max-restarts", "50", "--timeout", "3",
                        PY, launcher.prog(body)], timeout=60)
    took = time.monotonic() - t0
    assert res.rc == 124, str(res)
    assert took < 15, "took %.1f s\n%s" % (took, res)


def test_output_files_keep_every_round(launcher):
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--max-restarts", "1",
                        "--output-filename", str(launcher.tmp / "logs"), PY,
                        launcher.prog("n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                                      "print('round', n, flush=True)\nsleep_for(0.3 if RANK else 1)\n"
                                      "sys.exit(5 if n == '0' and RANK == 0 else 0)\n")])
    assert res.rc == 0, str(res)
    text = (launcher.tmp / "logs" / "1" / "rank.1" / "stdout").read_text()
    assert text.splitlines() == ["round 0", "round 1"], text


@pytest.mark.parametrize("args, message", [
    (["--max-restarts", "-1"], "--max-restarts '-1': expected a number of restarts"),
    (["--max-restarts", "x"], "--max-restarts 'x': expected a number of restarts"),
    (["--max-restarts", "10001"], "--max-restarts '10001': expected a number of restarts"),
    (["-np", "2", "--min-np", "3"], "--min-np 3 is more than -np 2"),
    (["--min-np", "0"], "--min-np '0': expected a number of ranks of at least 1"),
])
def test_bad_restart_options(launcher, args, message):
    res = launcher.run([*args, "-H", "localhost:2", PY, launcher.prog("pass")])
    assert res.rc == 2, str(res)
    assert message in res.err, str(res)


# ---- lost hosts (SSH test hosts) ---------------------------------------------------------

def finish_with_link_down(launcher, hosts, p, i, timeout):
    """Takes host i's link down and waits for perseusrun; the link is up again afterwards."""
    hosts.set_link(i, False)
    try:
        return launcher.finish(p, timeout=timeout)
    finally:
        hosts.set_link(i, True)


def lose_host(launcher, hosts, p, i, loss, timeout):
    """Host i is lost: its processes SIGKILLed, its agent too ("killed"), or its link taken down
    ("link down"); waits for perseusrun."""
    if loss == "link down":
        return finish_with_link_down(launcher, hosts, p, i, timeout)
    for pid in job_processes_on(hosts, i):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return launcher.finish(p, timeout=timeout)


def restart_seconds(res):
    """The 'stopped N s' of the first restart in perseusrun's summary."""
    summary = restart_summary(res)
    assert summary, str(res)
    return float(re.search(r"stopped ([0-9.]+) s", summary[0]).group(1))


def test_lost_host_restarts_on_the_hosts_left(launcher, hosts):
    """Three hosts x 2 ranks; the third host's link goes down: the job goes on with 4 ranks on
    the first two hosts, whose ranks see WORLD_SIZE 4 and the restart count 1."""
    body = ("n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
            "put('round.%d.rank.%d' % (n, RANK), json.dumps({'WORLD_SIZE': os.environ['WORLD_SIZE'],"
            " 'host': os.uname().nodename, 'ns': os.readlink('/proc/self/ns/net')}))\n"
            "sleep_for(60 if n == 0 else 1)\n")
    p = launcher.start(["--max-restarts", "2", "--heartbeat-timeout", "2",
                        "-H", ",".join(a + ":2" for a in hosts.addresses), PY,
                        launcher.prog(body), launcher.marker], env=ssh_env(launcher, hosts.home))
    launcher.wait_files("round.0.", 6, proc=p)
    res = finish_with_link_down(launcher, hosts, p, 2, timeout=90)
    assert res.rc == 0, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0, 1], str(res)
    assert sorted(seen[1]) == [0, 1, 2, 3], str(res)
    assert {v["WORLD_SIZE"] for v in seen[1].values()} == {"4"}, seen[1]
    lost_ns = {v["ns"] for r, v in seen[0].items() if r in (4, 5)}
    assert not lost_ns & {v["ns"] for v in seen[1].values()}, "a rank ran on the lost host"
    assert any("lost host %s" % hosts.addresses[2] in l for l in res.own_messages()), str(res)
    summary = restart_summary(res)
    assert len(summary) == 1 and hosts.addresses[2] in summary[0], str(res)
    print("lost host: the job was stopped %.1f s (heartbeat timeout 2 s)" % restart_seconds(res))
    assert wait_hosts_clean(hosts, 15) == {}


@pytest.mark.parametrize("loss", ["killed", "link down"])
def test_ddp_script_resumes_from_its_checkpoint_after_a_lost_host(launcher, hosts, loss):
    """A plain DDP script with `import perseus` that checkpoints each epoch (ddp_resume.py):
    mid-training the third host's processes are SIGKILLed, or its link goes down; the job
    restarts with 4 ranks, resumes from the last checkpoint, does every epoch asked, and ends
    with the same parameters on every rank."""
    pytest.importorskip("torch")
    if os.environ.get("PERSEUS_TESTS_SANITIZED"):
        pytest.skip("a sanitizer build: Python cannot load a libperseus built with "
                    "AddressSanitizer")
    checkpoint = launcher.tmp / "ckpt.pt"
    report = launcher.tmp / "report"
    report.mkdir()
    p = launcher.start(["--max-restarts", "2", "--heartbeat-timeout", "2",
                        "-H", ",".join(a + ":2" for a in hosts.addresses), PY,
                        os.path.join(HERE, "ddp_resume.py"), "--epochs", "6",
                        "--epoch-seconds", "1", "--checkpoint", str(checkpoint),
                        "--report", str(report), launcher.marker],
                       env=ssh_env(launcher, hosts.home))
    deadline = time.monotonic() + TIMEOUT
    while not (report / "epoch.2").exists():  # two epochs checkpointed
        assert p.poll() is None and time.monotonic() < deadline, str(launcher._result(p))
        time.sleep(0.1)
    res = lose_host(launcher, hosts, p, 2, loss, timeout=120)
    assert res.rc == 0, str(res)
    finals = [json.loads((report / n).read_text()) for n in sorted(os.listdir(report))
              if n.startswith("final.")]
    assert len(finals) == 4, (os.listdir(report), str(res))
    assert {f["world_size"] for f in finals} == {4}, finals
    assert {f["restart"] for f in finals} == {1}, finals
    assert {f["epochs_done"] for f in finals} == {6}, finals
    assert all(f["resumed_from"] >= 2 for f in finals), finals
    assert len({f["checksum"] for f in finals}) == 1, "parameters differ between ranks: %s" % finals
    assert all(f["through_perseus"] for f in finals), finals
    print("DDP after a lost host: stopped %.1f s" % restart_seconds(res))
    assert wait_hosts_clean(hosts, 15) == {}
