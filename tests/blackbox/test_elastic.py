"""perseusrun's elastic mode (issue 20, horovodrun's spelling): hosts come from
--host-discovery-script, read again every second; when they change, every rank is ended and the
job starts again on the new set of hosts (at most --max-np ranks); a failure restarts it too,
and a host that fails twice is blacklisted; with too few hosts for --min-np the job ends after
--elastic-timeout. (Horovod's in-process elastic API, hvd.elastic, is not built yet: scripts
resume from their own checkpoints, as under torchrun.)"""

import json
import os
import signal
import time

import pytest

from conftest import PY
from test_restarts import finish_with_link_down, restart_summary, rounds
from test_ssh import ssh_env, wait_hosts_clean
from test_ssh_faults import hosts  # noqa: F401 - the fixture

# Each round's ranks record their place; rank 0 of round 0 waits for the test's signal (a file)
# so that the round outlives the discovery change.
RECORD = ("n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
          "put('round.%d.rank.%d' % (n, RANK), json.dumps({'WORLD_SIZE': os.environ['WORLD_SIZE'],"
          " 'NODE_RANK': os.environ['PERSEUS_NODE_RANK'],"
          " 'ns': os.readlink('/proc/self/ns/net')}))\n")


def discovery(launcher, text):
    """A discovery script that prints the file `hosts` (written with `text`); returns
    (script path, function to rewrite the file)."""
    hosts = launcher.tmp / "hosts"
    hosts.write_text(text)
    script = launcher.tmp / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)

    def write(new):
        tmp = launcher.tmp / "hosts.tmp"
        tmp.write_text(new)
        os.replace(tmp, hosts)

    return str(script), write


def test_more_slots_restart_the_job_on_them(launcher):
    script, write = discovery(launcher, "localhost:2\n")
    p = launcher.start(["--host-discovery-script", script, PY, launcher.prog(
        RECORD + "sleep_for(60 if n == 0 else 0.5)\n")])
    launcher.wait_files("round.0.", 2, proc=p)
    write("localhost:3\n")
    res = launcher.finish(p, timeout=60)
    assert res.rc == 0, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0, 1], str(res)
    assert {v["WORLD_SIZE"] for v in seen[0].values()} == {"2"}
    assert sorted(seen[1]) == [0, 1, 2] and {v["WORLD_SIZE"] for v in seen[1].values()} == {"3"}
    summary = restart_summary(res)
    assert len(summary) == 1 and "lists 3 slots, the job runs 2 ranks" in summary[0], str(res)


def test_max_np_caps_the_growth(launcher):
    script, write = discovery(launcher, "localhost:2\n")
    p = launcher.start(["--host-discovery-script", script, "--max-np", "2", PY,
                        launcher.prog(RECORD + "sleep_for(3)\n")])
    launcher.wait_files("round.0.", 2, proc=p)
    write("localhost:4\n")
    res = launcher.finish(p, timeout=60)
    assert res.rc == 0, str(res)
    assert sorted(rounds(launcher)) == [0], "the job grew past --max-np 2\n%s" % res


def test_a_failure_restarts_and_reset_limit_ends_it(launcher):
    script, _ = discovery(launcher, "localhost:2\n")
    res = launcher.run(["--host-discovery-script", script, "--reset-limit", "1", PY,
                        launcher.prog(RECORD + "sleep_for(1)\nsys.exit(6 if RANK == 1 else 0)\n")])
    assert res.rc == 6, str(res)
    assert sorted(rounds(launcher)) == [0, 1], str(res)
    assert any("--reset-limit 1 reached" in l for l in res.own_messages()), str(res)


def test_a_host_failing_twice_is_blacklisted_for_the_cool_down(launcher):
    # Rank 1 fails in the first two rounds: localhost is blacklisted for 2 s (MIN of the range),
    # the job waits for it, and the third round succeeds.
    script, _ = discovery(launcher, "localhost:2\n")
    t0 = time.monotonic()
    res = launcher.run(["--host-discovery-script", script, "--blacklist-cooldown-range", "2", "30",
                        PY, launcher.prog(RECORD + "sleep_for(1)\n"
                                          "sys.exit(6 if RANK == 1 and n < 2 else 0)\n")])
    took = time.monotonic() - t0
    assert res.rc == 0, str(res)
    assert sorted(rounds(launcher)) == [0, 1, 2], str(res)
    assert any("host localhost failed twice: blacklisted for 2 s" in l
               for l in res.own_messages()), str(res)
    assert took >= 2, took


def test_no_hosts_left_after_failures_end_with_the_failures_code(launcher):
    # Rank 1 fails twice: localhost is blacklisted for good, no host is left, and after
    # --elastic-timeout the job ends with the failure's exit code.
    script, _ = discovery(launcher, "localhost:2\n")
    res = launcher.run(["--host-discovery-script", script, "--elastic-timeout", "1", PY,
                        launcher.prog(RECORD + "sleep_for(1)\nsys.exit(7 if RANK == 1 else 0)\n")])
    assert res.rc == 7, str(res)
    assert sorted(rounds(launcher)) == [0, 1], str(res)
    said = res.own_messages()
    assert any("blacklisted for the rest of the job" in l for l in said), str(res)
    assert any("--elastic-timeout 1" in l for l in said), str(res)


def test_a_slow_discovery_script_does_not_hold_up_the_job(launcher):
    # The script takes 3 s, the heartbeats are due every 0.2 s (--heartbeat-timeout 1): it runs
    # beside the launcher's loop, so no host is taken for lost while it runs.
    hosts = launcher.tmp / "hosts"
    hosts.write_text("localhost:2\n")
    script = launcher.tmp / "slow.sh"
    script.write_text("#!/bin/sh\nsleep 3\ncat %s\n" % hosts)
    script.chmod(0o755)
    res = launcher.run(["--host-discovery-script", str(script), "--heartbeat-timeout", "1", PY,
                        launcher.prog(RECORD + "sleep_for(5)\n")], timeout=60)
    assert res.rc == 0, str(res)
    assert sorted(rounds(launcher)) == [0], str(res)
    assert not any("lost" in l for l in res.own_messages()), str(res)


def test_too_few_hosts_end_the_job_after_the_elastic_timeout(launcher):
    script, _ = discovery(launcher, "localhost:1\n")
    t0 = time.monotonic()
    res = launcher.run(["--host-discovery-script", script, "--min-np", "2",
                        "--elastic-timeout", "2", PY, launcher.prog("pass")])
    took = time.monotonic() - t0
    assert res.rc == 1, str(res)
    assert 1.5 < took < 10, took
    assert any("fewer than --min-np 2" in l and "--elastic-timeout 2" in l
               for l in res.own_messages()), str(res)
    assert launcher.started() == [], str(res)


def test_the_job_waits_for_hosts_to_come(launcher):
    script, write = discovery(launcher, "")
    p = launcher.start(["--host-discovery-script", script, "-np", "2", PY,
                        launcher.prog(RECORD)])
    time.sleep(2)
    assert p.poll() is None and launcher.files("round.") == []
    write("localhost:2\n")
    res = launcher.finish(p, timeout=30)
    assert res.rc == 0, str(res)
    assert sorted(rounds(launcher)[0]) == [0, 1], str(res)


def test_a_signal_while_waiting_for_hosts_ends_the_job(launcher):
    script, _ = discovery(launcher, "")
    p = launcher.start(["--host-discovery-script", script, "-np", "2", PY, launcher.prog("pass")])
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    res = launcher.finish(p, timeout=15)
    assert res.rc == 128 + signal.SIGTERM, str(res)
    assert any("got SIGTERM while waiting for hosts" in l for l in res.own_messages()), str(res)


def test_a_discovery_script_that_fails_is_named(launcher):
    script = launcher.tmp / "broken.sh"
    script.write_text("#!/bin/sh\necho 'no inventory service' >&2\nexit 3\n")
    script.chmod(0o755)
    res = launcher.run(["--host-discovery-script", str(script), "--elastic-timeout", "1", PY,
                        launcher.prog("pass")])
    assert res.rc == 1, str(res)
    warning = [l for l in res.own_messages() if "warning" in l]
    assert warning and "exited with code 3 (no inventory service)" in warning[0], str(res)


def test_a_bad_line_of_the_script_is_named(launcher):
    script, _ = discovery(launcher, "localhost:2\nnode 7\n")
    res = launcher.run(["--host-discovery-script", script, "--elastic-timeout", "1", PY,
                        launcher.prog("pass")])
    assert res.rc == 1, str(res)
    assert any("line 2 of its output" in l for l in res.own_messages()), str(res)


@pytest.mark.parametrize("args, message", [
    (["--max-np", "4"], "--max-np 4: an elastic-mode option; give --host-discovery-script too"),
    (["--reset-limit", "1"], "--reset-limit 1: an elastic-mode option"),
    (["--host-discovery-script", "x", "-H", "localhost"], "both name hosts"),
    (["--host-discovery-script", "x", "-np", "4", "--max-np", "2"], "-np 4 is more than --max-np 2"),
    (["--host-discovery-script", "x", "--min-np", "3", "--max-np", "2"],
     "--min-np 3 is more than --max-np 2"),
    (["--host-discovery-script", "x", "--blacklist-cooldown-range", "9", "3"],
     "--blacklist-cooldown-range '9 3': expected MIN MAX"),
    (["--host-discovery-script", "x", "--elastic-timeout", "soon"], "--elastic-timeout 'soon'"),
])
def test_bad_elastic_options(launcher, args, message):
    res = launcher.run([*args, PY, launcher.prog("pass")])
    assert res.rc == 2, str(res)
    assert message in res.err, str(res)


# ---- across the SSH test hosts -----------------------------------------------------------

def test_a_host_added_joins_and_a_host_failing_twice_is_blacklisted(launcher, hosts):
    """Two hosts listed, then the third added: the job restarts on 3 x 2 ranks. There the ranks
    of the third host (node 2) fail in two rounds in a row: it is blacklisted and the job ends
    on the other two."""
    a = hosts.addresses
    script, write = discovery(launcher, "%s:2\n%s:2\n" % (a[0], a[1]))
    body = (RECORD +
            "if n == 0:\n    sleep_for(60)\n"
            "if os.environ['PERSEUS_NODE_RANK'] == '2':\n    sleep_for(1.5)\n    sys.exit(9)\n"
            "sleep_for(1)\n")
    p = launcher.start(["--host-discovery-script", script, "--heartbeat-timeout", "3", PY,
                        launcher.prog(body), launcher.marker], env=ssh_env(launcher, hosts.home))
    launcher.wait_files("round.0.", 4, proc=p)
    write("%s:2\n%s:2\n%s:2\n" % (a[0], a[1], a[2]))
    res = launcher.finish(p, timeout=120)
    assert res.rc == 0, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0, 1, 2, 3], str(res)
    assert [len(seen[n]) for n in range(4)] == [4, 6, 6, 4], str(res)
    said = res.own_messages()
    assert any("hosts added by --host-discovery-script: %s" % a[2] in l for l in said), str(res)
    assert any("host %s failed twice: blacklisted" % a[2] in l for l in said), str(res)
    last = {v["ns"] for v in seen[3].values()}
    assert not last & {v["ns"] for v in seen[1].values() if v["NODE_RANK"] == "2"}
    assert wait_hosts_clean(hosts, 15) == {}


def test_a_listed_host_that_cannot_be_reached_is_named(launcher, hosts):
    a = hosts.addresses
    script, _ = discovery(launcher, "".join("%s:1\n" % h for h in a))
    hosts.set_link(2, False)
    try:
        res = launcher.run(["--host-discovery-script", script, "--ssh-connect-timeout", "2", PY,
                            launcher.prog("pass"), launcher.marker],
                           env=ssh_env(launcher, hosts.home), timeout=60)
    finally:
        hosts.set_link(2, True)
    assert res.rc == 1, str(res)
    assert any(a[2] in l for l in res.own_messages() if "error" in l), str(res)
    assert launcher.started() == [], str(res)


def test_a_lost_host_is_left_out_while_the_script_still_lists_it(launcher, hosts):
    a = hosts.addresses
    script, _ = discovery(launcher, "".join("%s:2\n" % h for h in a))
    body = RECORD + "sleep_for(60 if n == 0 else 1)\n"
    p = launcher.start(["--host-discovery-script", script, "--heartbeat-timeout", "2", PY,
                        launcher.prog(body), launcher.marker], env=ssh_env(launcher, hosts.home))
    launcher.wait_files("round.0.", 6, proc=p)
    res = finish_with_link_down(launcher, hosts, p, 1, timeout=90)
    assert res.rc == 0, str(res)
    seen = rounds(launcher)
    assert sorted(seen) == [0, 1] and len(seen[1]) == 4, str(res)
    assert any("was lost: blacklisted" in l for l in res.own_messages()), str(res)
    assert wait_hosts_clean(hosts, 15) == {}
