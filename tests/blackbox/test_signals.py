"""Signals sent to perseusrun: SIGTERM / SIGINT end the job (143 / 130) and leave nothing behind;
after SIGKILL of perseusrun its ranks and their children are gone within 10 s."""

import signal
import time

import pytest

from conftest import PY

SPAWN_ALL = (
    "    spawn_child()\n"
    "    spawn_setsid()\n"
    "    spawn_daemon()\n")


def start_sleeping_job(launcher, body_rank0, nranks=2, handlers=True, extra_args=()):
    prog = launcher.prog(
        ("record_signals(signal.SIGTERM, signal.SIGINT)\n" if handlers else "") +
        "if RANK == 0:\n" + body_rank0 +
        "put('ready.%d' % RANK)\n"
        "sleep_for(120)\n")
    p = launcher.start(["-np", str(nranks), "-H", "localhost:%d" % nranks, *extra_args,
                        PY, prog, launcher.marker])
    launcher.wait_files("ready.", nranks, proc=p)
    return p


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_perseusrun_ends_job(launcher, sig, code):
    p = start_sleeping_job(launcher, SPAWN_ALL + "    wait_count('alive.', 3)\n", nranks=3)
    launcher.wait_files("alive.", 3, proc=p)
    assert len(launcher.marked()) >= 6, launcher.marked()  # sanity: the scan sees the job
    t0 = time.monotonic()
    p.send_signal(sig)
    res = launcher.finish(p)
    assert res.rc == code, str(res)
    assert time.monotonic() - t0 < 20, "took %.1f s to end the job" % (time.monotonic() - t0)
    for r in range(3):
        got = launcher.files("signal.%d." % r)
        assert got, "rank %d got no signal\n%s" % (r, res)
        assert int(launcher.read(got[0])) in (signal.SIGTERM, sig), got
    left = launcher.wait_gone(3)
    assert left == {}, "processes of the job left after perseusrun exited: %s" % left


def test_sigterm_with_rank_ignoring_sigterm(launcher):
    p = start_sleeping_job(launcher, "    ignore_signals(signal.SIGTERM, signal.SIGINT)\n",
                           handlers=False, extra_args=["--kill-grace", "1"])
    p.send_signal(signal.SIGTERM)
    res = launcher.finish(p)
    assert res.rc == 143, str(res)
    left = launcher.wait_gone(3)
    assert left == {}, "processes of the job left after perseusrun exited: %s" % left


def test_sigkill_of_perseusrun_ranks_gone(launcher):
    p = start_sleeping_job(launcher, "    spawn_child()\n    wait_count('alive.', 1)\n",
                           handlers=False)
    launcher.wait_files("alive.", 1, proc=p)
    before = launcher.marked()
    assert len(before) >= 3, before  # two ranks and the child
    p.kill()
    p.wait(10)
    left = launcher.wait_gone(10)
    assert left == {}, "10 s after SIGKILL of perseusrun these are still alive: %s" % left


SPAWN_NEW_GROUP = ("    subprocess.Popen([sys.executable, '-c', SLEEPER, OUT, MARK, 'pgid'],\n"
                   "                     process_group=0, stdin=subprocess.DEVNULL)\n")


def test_sigkill_of_perseusrun_detached_children_gone(launcher):
    """Same, with a setsid'd grandchild, a double-forked daemon and a child in a process group
    of its own."""
    p = start_sleeping_job(launcher, SPAWN_ALL + SPAWN_NEW_GROUP + "    wait_count('alive.', 4)\n",
                           handlers=False)
    launcher.wait_files("alive.", 4, proc=p)
    p.kill()
    p.wait(10)
    left = launcher.wait_gone(10)
    assert left == {}, "10 s after SIGKILL of perseusrun these are still alive: %s" % left
