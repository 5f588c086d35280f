"""Horovod's elastic API in place (issue 20): under perseusrun's elastic mode, a script written with
hvd.elastic.run / TorchState (elastic_train.py) keeps its processes when a rank fails or a host is
lost: the survivors roll back to their last commit and join a new world in the same process
(with new processes in the free slots of the hosts still usable), and processes on hosts the
discovery script adds join the running job at its next commit, without a rollback.

Local jobs run here; lost and added hosts on the SSH test hosts (testhosts.py)."""

import json
import os
import re
import signal
import time

import pytest

from conftest import PY, TIMEOUT
from test_elastic import discovery
from test_restarts import lose_host
from test_ssh import ssh_env, wait_hosts_clean
from test_ssh_faults import hosts, job_processes_on  # noqa: F401 - hosts: the fixture

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "elastic_train.py")

pytestmark = [
    pytest.mark.skipif(os.environ.get("PERSEUS_TESTS_SANITIZED") == "1",
                       reason="a sanitizer build: Python cannot load a libperseus built with "
                              "AddressSanitizer"),
]


@pytest.fixture(autouse=True)
def _torch():
    pytest.importorskip("torch")


def events(report):
    """{pid: [event, ...]} from elastic_train.py's DIR/events.<pid>."""
    found = {}
    for name in os.listdir(report):
        if name.startswith("events."):
            with open(os.path.join(report, name)) as f:
                found[int(name.split(".")[1])] = [json.loads(l) for l in f if l.strip()]
    return found


def finals(report):
    return {pid: [e for e in evs if e["what"] == "final"][-1]
            for pid, evs in events(report).items() if any(e["what"] == "final" for e in evs)}


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_step(report, world, step, p, launcher):
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(os.path.join(report, "step.%d.%d" % (world, step))):
        assert p.poll() is None and time.monotonic() < deadline, str(launcher._result(p))
        time.sleep(0.05)


def worlds_said(res):
    """perseusrun's lines that announce a world made in place."""
    return [l for l in res.own_messages() if re.search(r"; world \d+ of \d+ ranks", l)]


def train_args(report, steps, step_seconds=0.2, commit_every=2):
    return [PY, TRAIN, "--steps", str(steps), "--step-seconds", str(step_seconds),
            "--commit-every", str(commit_every), "--report", str(report)]


def check_finished_together(report, size, steps, res):
    done = finals(report)
    # A message, not a repr: pytest shows it whole (perseusrun's output says what failed).
    assert len(done) == size, "%d processes finished, not %d: %s\n%s" % (len(done), size, done, res)
    assert {f["size"] for f in done.values()} == {size}, done
    assert {f["step"] for f in done.values()} == {steps}, done
    assert sorted(f["rank"] for f in done.values()) == list(range(size)), done
    assert len({f["checksum"] for f in done.values()}) == 1, "parameters differ: %s" % done
    assert all(f["equal"] for f in done.values()), done
    return done


def test_a_failed_rank_is_replaced_in_place(launcher):
    """4 ranks on one host; rank 1 is SIGKILLed mid-training: the 3 others roll back to their
    last commit and, with a new process in the freed slot, finish the steps in world 1; nobody
    else is restarted."""
    report = launcher.tmp / "report"
    report.mkdir()
    script, _ = discovery(launcher, "localhost:4\n")
    p = launcher.start(["--host-discovery-script", script] + train_args(report, 40))
    wait_step(report, 0, 6, p, launcher)
    first = {pid: evs[0] for pid, evs in events(report).items()}
    assert sorted(e["rank"] for e in first.values()) == [0, 1, 2, 3], first
    victim = next(pid for pid, e in first.items() if e["rank"] == 1)
    os.kill(victim, signal.SIGKILL)
    res = launcher.finish(p, timeout=120)
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 4, 40, res)
    survivors = set(first) - {victim}
    assert survivors < set(done), "a survivor did not finish in place: %s" % done
    new = set(done) - survivors
    assert len(new) == 1 and victim not in done, done
    for pid in survivors:
        kinds = [e["what"] for e in events(report)[pid]]
        assert kinds.count("reset") == 1 and kinds.count("joined") == 2, kinds
        assert done[pid]["world"] == 1
    # The new process joined world 1 with the state synced from rank 0 (a step > 0).
    joined = [e for e in events(report)[next(iter(new))] if e["what"] == "joined"]
    assert len(joined) == 1 and joined[0]["world"] == 1 and joined[0]["step"] > 0, joined
    said = worlds_said(res)
    assert len(said) == 1 and "world 1 of 4 ranks (1 new)" in said[0], str(res)
    assert "killed by signal 9" in said[0] and "last commit" in said[0], str(res)
    assert any(re.search(r"world 1 \(4 ranks\).*every rank joined it [0-9.]+ s later", l)
               for l in res.own_messages()), str(res)
    assert not any("restarting every rank" in l for l in res.own_messages()), str(res)
    assert launcher.wait_gone(5, ("cmdline", "environ")) == {}, str(res)


def test_too_few_ranks_left_end_after_the_elastic_timeout(launcher):
    """The script now lists one slot and a rank dies: one rank is fewer than --min-np 2, so the
    job cannot go on in place; it waits --elastic-timeout for hosts, then ends with the failure's
    exit code and says why."""
    report = launcher.tmp / "report"
    report.mkdir()
    script, write = discovery(launcher, "localhost:2\n")
    p = launcher.start(["--host-discovery-script", script, "--min-np", "2", "--elastic-timeout",
                        "2"] + train_args(report, 40, 0.1, 1) + ["--die-at", "6", "--die-rank",
                                                                   "1"])
    wait_step(report, 0, 3, p, launcher)
    write("localhost:1\n")
    time.sleep(1.5)  # the script's next reading
    res = launcher.finish(p, timeout=60)
    assert res.rc == 3, str(res)
    said = res.own_messages()
    assert any("fewer than --min-np 2: the job cannot go on in place" in l for l in said), str(res)
    assert any("after --elastic-timeout 2 s, fewer than --min-np 2" in l for l in said), str(res)
    assert not worlds_said(res), str(res)
    assert launcher.wait_gone(5, ("cmdline", "environ")) == {}, str(res)


def test_reset_limit_counts_the_worlds_made_in_place(launcher):
    """--reset-limit 1: rank 1 dies at step 5, and in world 1 (rolled back to step 4) the new
    rank 1 dies there again: no second world is made, and no restart either; the job ends with
    the failure's code."""
    report = launcher.tmp / "report"
    report.mkdir()
    script, _ = discovery(launcher, "localhost:3\n")
    res = launcher.run(["--host-discovery-script", script, "--reset-limit", "1"] +
                       train_args(report, 20, 0.05, 4) + ["--die-at", "5", "--die-rank", "1"],
                       timeout=120)
    assert res.rc == 3, str(res)
    said = res.own_messages()
    assert len(worlds_said(res)) == 1, str(res)
    assert any("--reset-limit 1 reached: no new world is made in place" in l for l in said), \
        str(res)
    assert any("--reset-limit 1 reached; the job ends" in l for l in said), str(res)
    assert not any("restarting every rank" in l for l in said), str(res)
    assert launcher.wait_gone(5, ("cmdline", "environ")) == {}, str(res)


def test_a_plain_script_in_elastic_mode_is_restarted_whole(launcher):
    """A script that does not use hvd.elastic never said it can join in place: a failure ends
    and restarts every rank, as before (test_elastic.py has the rest)."""
    script, _ = discovery(launcher, "localhost:2\n")
    body = ("import perseus.torch as hvd\nhvd.init()\n"
            "n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
            "put('round.%d.rank.%d' % (n, RANK), 'x')\n"
            "if RANK == 1 and n == 0:\n    sys.exit(5)\n"
            "sleep_for(0.5)\n")
    res = launcher.run(["--host-discovery-script", script, PY, launcher.prog(body)])
    assert res.rc == 0, str(res)
    assert any("restarting every rank" in l for l in res.own_messages()), str(res)
    assert not worlds_said(res), str(res)


def test_hvd_elastic_outside_elastic_mode_just_trains(launcher):
    """Without --host-discovery-script the same script trains as a plain job (no new world)."""
    report = launcher.tmp / "report"
    report.mkdir()
    res = launcher.run(["-np", "3", "-H", "localhost:3"] + train_args(report, 10, 0, 3))
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 3, 10, res)
    assert {f["world"] for f in done.values()} == {-1}, done


# ---- lost and added hosts (SSH test hosts) ----------------------------------------------------

@pytest.mark.parametrize("loss", ["killed", "link down"])
def test_a_lost_host_leaves_four_ranks_in_place(launcher, hosts, loss):
    """3 hosts x 2 ranks; mid-training the third host's processes are SIGKILLed (its agent too),
    or its link goes down: the 4 ranks on the other hosts roll back to their last commit and go
    on in world 1, in the same processes, finishing every step with equal parameters; the lost
    host stays out (blacklisted) though the script still lists it."""
    a = hosts.addresses
    report = launcher.tmp / "report"
    report.mkdir()
    script, _ = discovery(launcher, "".join("%s:2\n" % h for h in a))
    p = launcher.start(["--host-discovery-script", script, "--min-np", "4",
                        "--heartbeat-timeout", "2"] + train_args(report, 40) + [launcher.marker],
                       env=ssh_env(launcher, hosts.home))
    wait_step(report, 0, 6, p, launcher)
    first = {pid: evs[0] for pid, evs in events(report).items()}
    assert len(first) == 6, first
    started = time.monotonic()
    res = lose_host(launcher, hosts, p, 2, loss, timeout=120)
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 4, 40, res)
    assert set(done) <= set(first), "a process was started again: %s" % done
    assert {first[pid]["rank"] for pid in done} == {0, 1, 2, 3}, (first, done)
    said = worlds_said(res)
    # Killed: when the host's ranks are seen to die a moment before its agent, the first world
    # refills their slots there, and the agent's loss makes the next one, of 4.
    assert said and "of 4 ranks" in said[-1] and a[2] in said[-1], str(res)
    assert len(said) == 1 or loss == "killed", str(res)
    last = int(re.search(r"world (\d+) of", said[-1]).group(1))
    assert all(f["world"] == last for f in done.values()), done
    joined = [l for l in res.own_messages() if "every rank joined it" in l]
    assert joined, str(res)
    seconds = float(re.search(r"joined it ([0-9.]+) s later", joined[0]).group(1))
    print("%s: world 1 joined %.2f s after perseusrun made it; %.1f s from the loss to the end"
          % (loss, seconds, time.monotonic() - started))
    assert wait_hosts_clean(hosts, 15) == {}


def test_a_host_failing_twice_is_blacklisted_in_place(launcher, hosts):
    """2 hosts x 2 ranks; rank 3 (on the second host) dies at step 5, and so does the process
    that replaces it: the second host has failed twice and is blacklisted, its last process is
    ended, and the 2 ranks of the first host finish in world 2, in their own processes."""
    a = hosts.addresses
    report = launcher.tmp / "report"
    report.mkdir()
    script, _ = discovery(launcher, "%s:2\n%s:2\n" % (a[0], a[1]))
    p = launcher.start(["--host-discovery-script", script, "--min-np", "2"] +
                       train_args(report, 20, 0.1, 2) + ["--die-at", "5", "--die-rank", "3",
                                                         launcher.marker],
                       env=ssh_env(launcher, hosts.home))
    res = launcher.finish(p, timeout=120)
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 2, 20, res)
    assert all(f["world"] == 2 for f in done.values()), done
    dead = [e for evs in events(report).values() for e in evs if e["what"] == "dies"]
    assert sorted(e["world"] for e in dead) == [0, 1], dead
    said = res.own_messages()
    assert any("host %s failed twice: blacklisted" % a[1] in l for l in said), str(res)
    worlds = worlds_said(res)
    assert len(worlds) == 2 and "world 1 of 4 ranks (1 new)" in worlds[0], str(res)
    assert "world 2 of 2 ranks" in worlds[1], str(res)
    assert wait_hosts_clean(hosts, 15) == {}


def test_a_host_lost_while_its_new_processes_join_ends_in_the_next_world(launcher, hosts):
    """The third host's ranks are killed together (gathered into one failure; the agent lives,
    so world 1 refills its slots with 2 new processes there), then its agent too, before those
    join: the survivors leave world 1's join and finish in a later world of 4 ranks, well within
    PERSEUS_INIT_TIMEOUT (20 here): their store waits end with the world, Gloo's connections get
    10 s, and a rank whose join fails ends that world for all."""
    a = hosts.addresses
    report = launcher.tmp / "report"
    report.mkdir()
    script, _ = discovery(launcher, "".join("%s:2\n" % h for h in a))
    p = launcher.start(["--host-discovery-script", script, "--min-np", "4", "-x",
                        "PERSEUS_INIT_TIMEOUT=20"] + train_args(report, 40, 0.2, 2) +
                       [launcher.marker], env=ssh_env(launcher, hosts.home))
    wait_step(report, 0, 6, p, launcher)
    on_host = job_processes_on(hosts, 2)
    agents = [pid for pid, cmd in on_host.items() if "--agent" in cmd]
    assert agents, on_host
    for pid in on_host:
        if pid not in agents and "elastic_train.py" in on_host[pid]:
            kill(pid)
    deadline = time.monotonic() + 20
    while not worlds_said(launcher._result(p)):  # world 1, refilling the third host
        assert p.poll() is None and time.monotonic() < deadline, str(launcher._result(p))
        time.sleep(0.05)
    for pid in agents:
        kill(pid)
    started = time.monotonic()
    res = launcher.finish(p, timeout=120)
    took = time.monotonic() - started
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 4, 40, res)
    said = worlds_said(res)
    assert len(said) >= 2 and "world 1 of 6 ranks (2 new)" in said[0], str(res)
    assert "world 2 of 4 ranks" in said[1] and a[2] in said[1], str(res)
    assert all("of 4 ranks" in l for l in said[1:]), str(res)
    last = int(re.search(r"world (\d+) of", said[-1]).group(1))
    assert all(f["world"] == last for f in done.values()), done
    assert took < 40, "the survivors waited %.1f s for processes that never came\n%s" % (took, res)
    print("a host lost while its new processes joined: %.1f s to the job's end" % took)
    assert wait_hosts_clean(hosts, 15) == {}


def test_an_added_host_joins_at_the_next_commit(launcher, hosts):
    """2 hosts x 2 ranks; the script then lists a third: its 2 new processes join the running
    job in world 1 at the next commit, with the state synced from rank 0, and the 4 first ones go
    on without a rollback (no HorovodInternalError: they join at a commit)."""
    a = hosts.addresses
    report = launcher.tmp / "report"
    report.mkdir()
    script, write = discovery(launcher, "%s:2\n%s:2\n" % (a[0], a[1]))
    p = launcher.start(["--host-discovery-script", script] + train_args(report, 40) +
                       [launcher.marker], env=ssh_env(launcher, hosts.home))
    wait_step(report, 0, 4, p, launcher)
    first = set(events(report))
    assert len(first) == 4, events(report)
    write("%s:2\n%s:2\n%s:2\n" % (a[0], a[1], a[2]))
    res = launcher.finish(p, timeout=120)
    assert res.rc == 0, str(res)
    done = check_finished_together(report, 6, 40, res)
    assert first < set(done), done
    for pid in set(done) - first:
        joined = [e for e in events(report)[pid] if e["what"] == "joined"]
        assert len(joined) == 1 and joined[0]["world"] == 1 and joined[0]["step"] > 0, joined
    said = worlds_said(res)
    assert len(said) == 1 and "world 1 of 6 ranks (2 new), at the ranks' next commit" in said[0], \
        str(res)
    assert wait_hosts_clean(hosts, 15) == {}
