"""Bad input: exit 2 (usage), 127 (program not found), 126 (not executable); nothing started."""

import socket

import pytest

from conftest import expect_usage_error, has_gpu, nproc


@pytest.mark.parametrize("flag", ["--bogus-flag", "-bogus", "--npx"])
def test_unknown_flag(launcher, flag):
    expect_usage_error(launcher, [flag, "-np", "1", "-H", "localhost:1"], flag)


@pytest.mark.parametrize("args,word,dash,fix", [
    (["\u2013np", "2", "\u2013npernode", "2"], "\u2013np", "an en dash (U+2013)", "-np"),
    (["-np", "2", "\u2014npernode", "2"], "\u2014npernode", "an em dash (U+2014)", "-npernode"),
])
def test_option_with_a_dash_like_character(launcher, args, word, dash, fix):
    """The seed's "mpirun \u2013np 32 \u2013npernode 8" as pasted from a document: a usage error
    naming the word, the character and the option meant, not "cannot run '\u2013np'"."""
    res = expect_usage_error(launcher, args + ["-H", "localhost:2"])
    assert ("perseusrun: error: '%s' starts with %s, not '-': did you mean %s?" % (word, dash, fix)
            in res.err), str(res)


def test_unknown_word_with_a_dash_like_character(launcher):
    res = expect_usage_error(launcher, ["-np", "1", "\u2013frobnicate"], "a dash-like character")
    assert "did you mean" not in res.err, str(res)


def test_unknown_flag_after_valid_ones(launcher):
    expect_usage_error(launcher, ["-np", "1", "--no-such-option", "3"], "--no-such-option")


def test_missing_program(launcher):
    expect_usage_error(launcher, ["-np", "2", "-H", "localhost:2"], with_prog=False)


def test_no_arguments(launcher):
    expect_usage_error(launcher, [], with_prog=False)


def test_option_missing_its_value(launcher):
    expect_usage_error(launcher, ["-np"], with_prog=False)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2x", ""])
def test_bad_np(launcher, value):
    expect_usage_error(launcher, ["-np", value, "-H", "localhost:2"], value)


def test_np_above_slots(launcher):
    expect_usage_error(launcher, ["-np", "5", "-H", "localhost:3"], "5", "3", "--oversubscribe")


def test_np_above_slots_hostfile(launcher):
    hostfile = launcher.tmp / "hf"
    hostfile.write_text("localhost slots=2\n")
    expect_usage_error(launcher, ["-np", "7", "-hostfile", str(hostfile)], "7", "2",
                       "--oversubscribe")


@pytest.mark.skipif(has_gpu(), reason="default slots are GPUs on a machine with GPUs")
def test_np_above_default_slots(launcher):
    n = nproc()
    expect_usage_error(launcher, ["-np", str(n + 1)], str(n + 1), str(n), "--oversubscribe")


@pytest.mark.parametrize("value", ["localhost:abc", "localhost:0", "localhost:-3",
                                   "localhost:2x"])
def test_bad_host_value(launcher, value):
    expect_usage_error(launcher, ["-H", value], value)


@pytest.mark.parametrize("value", ["bogus", "node,slot"])
def test_bad_map_by(launcher, value):
    expect_usage_error(launcher, ["--map-by", value, "-np", "1", "-H", "localhost:1"], value)


@pytest.mark.parametrize("value", ["bogus", "all"])
def test_bad_gpu_bind(launcher, value):
    expect_usage_error(launcher, ["--gpu-bind", value, "-np", "1", "-H", "localhost:1"], value)


def test_host_and_hostfile_together(launcher):
    hostfile = launcher.tmp / "hf"
    hostfile.write_text("localhost slots=2\n")
    res = expect_usage_error(launcher, ["-H", "localhost:2", "-hostfile", str(hostfile)])
    assert "hostfile" in res.err.lower(), str(res)


@pytest.mark.parametrize("path", ["does/not/exist.txt", "a directory"])
def test_unreadable_hostfile(launcher, path):
    full = launcher.tmp / path
    if path == "a directory":
        full.mkdir()
    expect_usage_error(launcher, ["-hostfile", str(full)], str(full))


def _local_names():
    return ("localhost", "127.0.0.1", socket.gethostname())


@pytest.mark.parametrize("program", ["no-such-program-bb", "./no-such-program-bb",
                                     "/nonexistent/dir/no-such-program-bb"])
def test_program_not_found(launcher, program):
    res = launcher.run(["-np", "2", "-H", "localhost:2", program, "arg"])
    assert res.rc == 127, str(res)
    assert program in res.err, str(res)
    assert any(n in res.err for n in _local_names()), "the message names no host\n%s" % res
    assert all(l.startswith("perseusrun: ") for l in res.own_messages()), str(res)


def test_program_not_executable(launcher):
    script = launcher.tmp / "not-executable.sh"
    script.write_text("#!/bin/sh\ntouch %s/ran\n" % launcher.out)
    script.chmod(0o644)
    res = launcher.run(["-np", "2", "-H", "localhost:2", str(script)])
    assert res.rc == 126, str(res)
    assert str(script) in res.err or "not-executable.sh" in res.err, str(res)
    assert not (launcher.out / "ran").exists()


def test_program_not_found_via_path(launcher, python_on_path):
    # PATH is searched: with python_on_path first, 'python' is found; without it a
    # made-up name is not.
    env = launcher.env(PATH=str(python_on_path))
    prog = launcher.prog("put('ran.%d' % RANK)")
    ok = launcher.run(["-np", "1", "-H", "localhost:1", "python", prog], env=env)
    assert ok.rc == 0, ok
    assert launcher.files("ran.") == ["ran.0"]
    res = launcher.run(["-np", "1", "-H", "localhost:1", "python-not-here-bb", prog], env=env)
    assert res.rc == 127, str(res)
    assert "python-not-here-bb" in res.err, str(res)
