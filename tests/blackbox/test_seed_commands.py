"""The seed commands, as written, plus the command line itself: spellings of every option,
where options stop, compatibility flags, --help and --version."""

import os
import re
import socket

import pytest

from conftest import (ENV_PROG, PY, TIMEOUT, check_single_host_envs, has_gpu, nproc,
                      own_addresses, run_env_job, untag)


# ---- the seed commands ----------------------------------------------------------------------

@pytest.mark.parametrize("hosts", ["hostfile", "-H"])
def test_seed_command_nccl_debug(launcher, hosts):
    """perseusrun -allow-run-as-root -bind-to none -np 8 -npernode 8 -x NCCL_DEBUG=INFO -x PATH
    -hostfile HOSTFILE prog   (and the same with -H localhost:8)."""
    hostfile = launcher.tmp / "hostfile"
    hostfile.write_text("localhost slots=8\n")
    prog = launcher.prog(ENV_PROG, name="prog")  # an executable script, run directly
    host_args = ["-hostfile", str(hostfile)] if hosts == "hostfile" else ["-H", "localhost:8"]
    env = launcher.env()
    res = launcher.run(["-allow-run-as-root", "-bind-to", "none", "-np", "8", "-npernode", "8",
                        "-x", "NCCL_DEBUG=INFO", "-x", "PATH", *host_args, prog], env=env,
                       timeout=TIMEOUT * 2)
    assert res.rc == 0, str(res)
    by_rank = launcher.envs_by_rank()
    check_single_host_envs(by_rank, 8, {"NCCL_DEBUG": "INFO", "PATH": env["PATH"]})
    out, other = untag(res.stdout, "stdout")
    assert other == [], str(res)
    assert out == {r: [b"hello from rank %d" % r] for r in range(8)}, str(res)


def test_seed_command_python_train_py(launcher, python_on_path):
    """perseusrun -np 8 -H localhost:8 python train.py  ('python' found on PATH, train.py
    relative to the current directory)."""
    launcher.prog(ENV_PROG, name="train.py")
    env = launcher.env(PATH=str(python_on_path) + os.pathsep + os.environ.get("PATH", ""))
    res = launcher.run(["-np", "8", "-H", "localhost:8", "python", "train.py"], env=env,
                       cwd=str(launcher.tmp), timeout=TIMEOUT * 2)
    assert res.rc == 0, str(res)
    check_single_host_envs(launcher.envs_by_rank(), 8)
    out, other = untag(res.stdout, "stdout")
    assert out == {r: [b"hello from rank %d" % r] for r in range(8)}, str(res)
    assert other == [], str(res)


# ---- option spellings -----------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["-np", "--np", "-n", "-c"])
def test_np_spellings(launcher, flag):
    run_env_job(launcher, [flag, "3", "-H", "localhost:4"], 3)


@pytest.mark.parametrize("flag", ["-H", "--host", "-host"])
def test_host_spellings_and_default_np(launcher, flag):
    # No -np: the number of ranks is the total number of slots.
    run_env_job(launcher, [flag, "localhost:3"], 3)


@pytest.mark.parametrize("flag", ["-hostfile", "--hostfile", "-machinefile", "--machinefile"])
def test_hostfile_spellings(launcher, flag):
    hostfile = launcher.tmp / "hosts.txt"
    hostfile.write_text("localhost slots=3\n")
    run_env_job(launcher, [flag, str(hostfile)], 3)


@pytest.mark.parametrize("flag", ["-npernode", "--npernode", "-N"])
def test_npernode_spellings(launcher, flag):
    # npernode overrides the slots: 2 per host on a 4-slot host, np defaults to 2.
    run_env_job(launcher, [flag, "2", "-H", "localhost:4"], 2)


def test_npernode_above_slots(launcher):
    # "-npernode 3" on a 1-slot host runs 3 (npernode overrides slots).
    run_env_job(launcher, ["-npernode", "3", "-H", "localhost:1"], 3)


@pytest.mark.parametrize("flag", ["-mca", "--mca"])
def test_mca_spellings(launcher, flag):
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", flag, "btl_tcp_if_include", "lo",
                           flag, "pml", "ob1"], 2,
                extra={"OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_pml": "ob1"})


@pytest.mark.parametrize("flag", ["-wdir", "--wdir"])
def test_wdir_spellings(launcher, flag):
    wdir = launcher.tmp / "work dir"
    wdir.mkdir()
    prog = launcher.prog("put('cwd.%d' % RANK, os.getcwd())")
    res = launcher.run(["-np", "2", "-H", "localhost:2", flag, str(wdir), PY, prog])
    assert res.rc == 0, str(res)
    for r in range(2):
        assert os.path.samefile(launcher.read("cwd.%d" % r).decode(), wdir), str(res)


def test_default_wdir_is_current_directory(launcher):
    here = launcher.tmp / "elsewhere"
    here.mkdir()
    prog = launcher.prog("put('cwd.%d' % RANK, os.getcwd())")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog], cwd=str(here))
    assert res.rc == 0, str(res)
    for r in range(2):
        assert os.path.samefile(launcher.read("cwd.%d" % r).decode(), here), str(res)


def test_repeated_host_option_adds_slots(launcher):
    run_env_job(launcher, ["-H", "localhost:2", "-H", "localhost:1"], 3)


def test_bare_host_is_one_slot(launcher):
    run_env_job(launcher, ["-H", "localhost"], 1)


def test_bare_host_mentioned_twice(launcher):
    run_env_job(launcher, ["-H", "localhost,localhost"], 2)


@pytest.mark.parametrize("alias", ["127.0.0.1", "hostname", "[::1]", "own-ipv4", "own-ipv6"])
def test_local_host_aliases(launcher, alias):
    if alias == "hostname":
        host = socket.gethostname()
    elif alias.startswith("own-"):
        want_v6 = alias == "own-ipv6"
        addrs = [a for a in own_addresses() if (":" in a) == want_v6]
        if not addrs:
            pytest.skip("this machine has no non-loopback %s address" % alias[4:])
        host = "[%s]" % addrs[0] if want_v6 else addrs[0]
    else:
        host = alias
    # MASTER_ADDR stays 127.0.0.1: the job is on the local host only.
    run_env_job(launcher, ["-H", "%s:2" % host], 2)


def test_map_by_node_single_host(launcher):
    run_env_job(launcher, ["--map-by", "node", "-np", "3", "-H", "localhost:4"], 3)


def test_map_by_slot_single_host(launcher):
    run_env_job(launcher, ["--map-by", "slot", "-np", "3", "-H", "localhost:4"], 3)


def test_oversubscribe(launcher):
    run_env_job(launcher, ["--oversubscribe", "-np", "5", "-H", "localhost:2"], 5)


@pytest.mark.skipif(has_gpu(), reason="default slots are GPUs on a machine with GPUs")
def test_default_hosts_one_slot_per_core(launcher):
    # No hosts and no -np: localhost with one slot per CPU core (no GPU here).
    run_env_job(launcher, [], nproc(), timeout=TIMEOUT * 2)


def test_default_hosts_with_np(launcher):
    run_env_job(launcher, ["-np", "1"], 1)


def test_master_port_option(launcher):
    from conftest import free_port
    port = free_port()
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", "--master-port", str(port)], 2,
                extra={"MASTER_PORT": str(port)})


# ---- where options stop ---------------------------------------------------------------------

ARGV_PROG = "put('argv.%d' % RANK, repr([os.fsencode(a) for a in sys.argv[1:]]))"


def test_options_stop_at_program(launcher):
    prog = launcher.prog(ARGV_PROG)
    words = ["-np", "5", "--bogus", "-H", "nonexistent-host:9", "--version", "--help", "--",
             "-x", "A=B"]
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog, *words])
    assert res.rc == 0, str(res)
    assert len(launcher.started()) == 2, str(res)
    want = repr([w.encode() for w in words]).encode()
    for r in range(2):
        assert launcher.read("argv.%d" % r) == want
    assert "perseusrun 0.1.0" not in res.out


def test_double_dash_separator(launcher):
    prog = launcher.prog(ARGV_PROG)
    res = launcher.run(["-np", "2", "-H", "localhost:2", "--", PY, prog, "--", "-np", "7"])
    assert res.rc == 0, str(res)
    want = repr([b"--", b"-np", b"7"]).encode()
    for r in range(2):
        assert launcher.read("argv.%d" % r) == want


def test_single_dash_and_double_dash_equivalent(launcher):
    prog = launcher.prog(ENV_PROG)
    hostfile = launcher.tmp / "hf"
    hostfile.write_text("localhost slots=4\n")
    a = launcher.run(["-np", "3", "-hostfile", str(hostfile), PY, prog])
    assert a.rc == 0, a
    first = launcher.envs_by_rank()
    for f in launcher.files("env."):
        os.unlink(launcher.out / f)
    b = launcher.run(["--np", "3", "--hostfile", str(hostfile), PY, prog])
    assert b.rc == 0, b
    second = launcher.envs_by_rank()
    assert sorted(first) == sorted(second) == [0, 1, 2]
    for r in range(3):
        for k in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
            assert first[r][k] == second[r][k], k
    # two jobs: two job ids
    assert first[0]["PERSEUS_JOB_ID"] != second[0]["PERSEUS_JOB_ID"]


# ---- accepted for compatibility -------------------------------------------------------------

@pytest.mark.parametrize("flags", [["-allow-run-as-root"], ["--allow-run-as-root"],
                                   ["-bind-to", "none"], ["--bind-to", "none"],
                                   ["--tag-output"]])
def test_compatibility_flags_ignored(launcher, flags):
    res, _ = run_env_job(launcher, [*flags, "-np", "2", "-H", "localhost:2"], 2)
    assert res.own_messages() == [], str(res)


@pytest.mark.parametrize("flag", ["-bind-to", "--bind-to"])
def test_bind_to_other_value_warns(launcher, flag):
    res, _ = run_env_job(launcher, [flag, "core", "-np", "2", "-H", "localhost:2"], 2)
    msgs = res.own_messages()
    assert msgs, str(res)
    assert all(m.startswith("perseusrun: ") for m in msgs), str(res)
    assert any("bind" in m for m in msgs), str(res)


@pytest.mark.parametrize("flag", ["-v", "--verbose"])
def test_verbose_messages_are_prefixed(launcher, flag):
    res, _ = run_env_job(launcher, [flag, "-np", "2", "-H", "localhost:2"], 2)
    for m in res.own_messages():
        assert m.startswith("perseusrun: "), str(res)


def test_display_map(launcher):
    prog = launcher.prog("sys.stderr.write('rank %d says hi\\n' % RANK)")
    res = launcher.run(["--display-map", "-np", "2", "-H", "localhost:2", PY, prog])
    assert res.rc == 0, str(res)
    lines = res.stderr.split(b"\n")
    tagged = [i for i, l in enumerate(lines) if l.startswith(b"[1,")]
    untagged = [i for i, l in enumerate(lines) if l and not l.startswith(b"[1,")]
    assert len(tagged) == 2, str(res)
    assert untagged, "--display-map printed nothing\n%s" % res
    assert untagged[0] < tagged[0], "the map must come before the ranks start\n%s" % res


# ---- --help and --version -------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(launcher, flag):
    res = launcher.run([flag])
    assert res.rc == 0, str(res)
    assert "perseusrun -np 8 -H localhost:8 python train.py" in res.out, str(res)
    assert "-hostfile" in res.out, str(res)
    assert launcher.started() == []


def test_version(launcher):
    res = launcher.run(["--version"])
    assert res.rc == 0, str(res)
    lines = res.out.splitlines()
    assert lines and lines[0] == "perseusrun 0.1.0", str(res)
    assert len(lines) == 4, str(res)
    for line, lib in zip(lines[1:], ["CUDA: ", "NCCL: ", "libssh2: "]):
        assert line.startswith(lib), str(res)
    assert "loads libnccl.so.2 at run time" in lines[2], str(res)
    assert re.fullmatch(r"libssh2: \d+(\.\d+)+", lines[3]), str(res)
