"""Open MPI hostfiles: comments, blank lines, slots, max_slots, repeated hosts, bare lines,
local-host aliases, and the error format of a malformed file."""

import os
import re
import socket

import pytest

from conftest import expect_usage_error, has_gpu, run_env_job


def hostfile(launcher, text, name="hostfile"):
    path = launcher.tmp / name
    path.write_text(text)
    return str(path)


def test_comments_and_blank_lines(launcher):
    hf = hostfile(launcher, "# cluster\n\n   \n# another comment\nlocalhost slots=3   # fast one\n\n")
    run_env_job(launcher, ["-hostfile", hf], 3)


def test_repeated_host_adds_slots(launcher):
    hf = hostfile(launcher, "localhost slots=2\nlocalhost slots=3\n")
    run_env_job(launcher, ["-hostfile", hf], 5)


def test_tab_separated(launcher):
    hf = hostfile(launcher, "localhost\tslots=2\n")
    run_env_job(launcher, ["-hostfile", hf], 2)


@pytest.mark.skipif(has_gpu(), reason="a bare line is the GPU count on a machine with GPUs")
def test_bare_line_without_gpus_is_one_slot(launcher):
    hf = hostfile(launcher, "localhost\n")
    run_env_job(launcher, ["-hostfile", hf], 1)


def test_npernode_overrides_hostfile_slots(launcher):
    hf = hostfile(launcher, "localhost slots=1\n")
    run_env_job(launcher, ["-npernode", "3", "-hostfile", hf], 3)


def test_np_below_slots(launcher):
    hf = hostfile(launcher, "localhost slots=8\n")
    run_env_job(launcher, ["-np", "3", "-hostfile", hf], 3)


def test_max_slots_allows_oversubscribe_up_to_it(launcher):
    hf = hostfile(launcher, "localhost slots=2 max_slots=4\n")
    run_env_job(launcher, ["-np", "4", "--oversubscribe", "-hostfile", hf], 4)


def test_max_slots_limits_oversubscribe(launcher):
    hf = hostfile(launcher, "localhost slots=2 max_slots=4\n")
    expect_usage_error(launcher, ["-np", "5", "--oversubscribe", "-hostfile", hf], "5")


def test_slots_without_oversubscribe(launcher):
    hf = hostfile(launcher, "localhost slots=2 max_slots=4\n")
    expect_usage_error(launcher, ["-np", "3", "-hostfile", hf], "3", "2", "--oversubscribe")


@pytest.mark.parametrize("alias", ["127.0.0.1", "::1", "hostname"])
def test_local_aliases(launcher, alias):
    host = socket.gethostname() if alias == "hostname" else alias
    hf = hostfile(launcher, "%s slots=2\n" % host)
    run_env_job(launcher, ["-hostfile", hf], 2)


def clear_out(launcher):
    """Forgets what the last job's ranks left, for a second job in the same test."""
    for name in os.listdir(launcher.out):
        os.remove(launcher.out / name)


def test_names_of_this_machine_are_one_host(launcher):
    """-H localhost:1,127.0.0.1:2 is one host with 3 slots, as under mpirun: one node, local
    ranks 0..2 across both names (PERSEUS_LOCAL_RANK, LOCAL_SIZE 3, NODE_RANK 0 and the rest
    of the single-host variables), and CUDA_VISIBLE_DEVICES follows the local ranks."""
    res, by_rank = run_env_job(launcher, ["-H", "localhost:1,127.0.0.1:2"], 3)
    assert [by_rank[r]["PERSEUS_LOCAL_RANK"] for r in range(3)] == ["0", "1", "2"], str(res)
    assert {by_rank[r]["PERSEUS_LOCAL_SIZE"] for r in range(3)} == {"3"}, str(res)
    assert {by_rank[r]["PERSEUS_NODE_RANK"] for r in range(3)} == {"0"}, str(res)
    clear_out(launcher)
    _, isolated = run_env_job(launcher, ["--gpu-bind", "isolate", "-H", "localhost:1,127.0.0.1:2"],
                              3, extra={"CUDA_VISIBLE_DEVICES": str})
    assert [isolated[r]["CUDA_VISIBLE_DEVICES"] for r in range(3)] == ["0", "1", "2"]


def test_usage_hostfile_example_is_one_host(launcher):
    """The hostfile of docs/USAGE.md without its remote line: localhost, 127.0.0.1 and ::1 are
    one host of 12 slots (max_slots 16 holds for the sum); --display-map shows one node."""
    hf = hostfile(launcher, "# comments start with '#', also after an entry\n"
                            "localhost slots=8 max_slots=16      # slots and an upper limit\n"
                            "127.0.0.1 slots=2\n"
                            "::1 slots=2                         # IPv6 as written\n")
    res, _ = run_env_job(launcher, ["--display-map", "-np", "4", "-hostfile", hf], 4)
    assert "localhost" in res.err and "127.0.0.1" not in res.err and "::1" not in res.err, str(res)
    clear_out(launcher)
    expect_usage_error(launcher, ["-np", "17", "--oversubscribe", "-hostfile", hf], "16")


def test_no_entries(launcher):
    hf = hostfile(launcher, "# nothing here\n\n")
    expect_usage_error(launcher, ["-hostfile", hf], hf)


# (file text, line number of the bad line, its text, first and last acceptable column)
MALFORMED = [
    ("# comment\n\nlocalhost slots=abc\n", 3, "localhost slots=abc", 11, 17),
    ("localhost slots=2\nlocalhost slots=0\n", 2, "localhost slots=0", 11, 17),
    ("localhost slots=\n", 1, "localhost slots=", 11, 17),
    ("localhost slots=-2\n", 1, "localhost slots=-2", 11, 18),
    ("localhost slots=2 max_slots=1\n", 1, "localhost slots=2 max_slots=1", 11, 29),
    ("localhost frobnicate=3\n", 1, "localhost frobnicate=3", 11, 22),
    ("# a\nlocalhost slots=4 extra\n", 2, "localhost slots=4 extra", 19, 23),
    ("localhost slots=99999999999999999999\n", 1, "localhost slots=99999999999999999999",
     11, 17),
]


@pytest.mark.parametrize("text,lineno,line,col_lo,col_hi", MALFORMED,
                         ids=[m[2] for m in MALFORMED])
def test_malformed_hostfile(launcher, text, lineno, line, col_lo, col_hi):
    hf = hostfile(launcher, text)
    res = expect_usage_error(launcher, ["-hostfile", hf], hf)
    lines = res.err.split("\n")
    loc = re.compile(re.escape(hf) + r":(\d+):(\d+):")
    where = [i for i, l in enumerate(lines) if loc.search(l)]
    assert where, "no '%s:line:column:' in the message\n%s" % (hf, res)
    i = where[0]
    m = loc.search(lines[i])
    assert lines[i].startswith("perseusrun: error: "), str(res)
    assert int(m.group(1)) == lineno, "wrong line number\n%s" % res
    col = int(m.group(2))
    assert col_lo <= col <= col_hi, "column %d is not at the bad spot of %r\n%s" % (col, line, res)
    assert i + 2 < len(lines), "no echoed line and caret line\n%s" % res
    assert lines[i + 1] == line, "line not echoed as written\n%s" % res
    assert lines[i + 2].rstrip() == " " * (col - 1) + "^", "caret not under column %d\n%s" % (
        col, res)
