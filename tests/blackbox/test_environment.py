"""The environment every rank gets: rank variables, -x, -mca, --gpu-bind, MASTER_PORT."""

import os
import socket

import pytest

from conftest import PY, run_env_job


def test_exact_rank_environment_np4(launcher):
    run_env_job(launcher, ["-np", "4", "-H", "localhost:4"], 4)


def test_exact_rank_environment_from_hostfile_map_by_node(launcher):
    hostfile = launcher.tmp / "hf"
    hostfile.write_text("# one host\n\nlocalhost slots=6\n")
    run_env_job(launcher, ["--map-by", "node", "-np", "5", "-hostfile", str(hostfile)], 5)


def test_exact_rank_environment_npernode_hostfile(launcher):
    hostfile = launcher.tmp / "hf"
    hostfile.write_text("localhost slots=2\n")
    run_env_job(launcher, ["-npernode", "4", "-hostfile", str(hostfile)], 4)


def test_whole_environment_inherited(launcher):
    env = launcher.env(BLACKBOX_INHERITED="inherited value with spaces",
                       BLACKBOX_EMPTY="")
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2"], 2, env=env,
                extra={"BLACKBOX_INHERITED": "inherited value with spaces",
                       "BLACKBOX_EMPTY": ""})


WEIRD_VALUES = {
    "BB_QUOTES": "it's \"quoted\" 'twice'",
    "BB_DOLLAR": "$HOME ${PATH} $(id) $$ $",
    "BB_BACKTICK": "`id` `echo pwned`",
    "BB_NEWLINES": "line1\nline2\n\nline4\n",
    "BB_SPACES": "  leading and trailing  ",
    "BB_MIXED": "a=b;c|d&e>f<g\\h\t*?[x]~!#%^(){}",
    "BB_UNICODE": "caf\u00e9 \u2603 \U0001f600",
    "BB_EQUALS": "x=y=z",
    "BB_EMPTY": "",
}


def test_x_values_byte_exact(launcher):
    args = ["-np", "2", "-H", "localhost:2"]
    for k, v in WEIRD_VALUES.items():
        args += ["-x", "%s=%s" % (k, v)]
    run_env_job(launcher, args, 2, extra=WEIRD_VALUES)


def test_x_value_overrides_inherited(launcher):
    env = launcher.env(BB_OVERRIDE="from the environment")
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", "-x", "BB_OVERRIDE=from -x"], 2,
                env=env, extra={"BB_OVERRIDE": "from -x"})


def test_x_passes_variable(launcher):
    env = launcher.env(BB_PASSED="passed $value `x`\nline2")
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", "-x", "BB_PASSED"], 2, env=env,
                extra={"BB_PASSED": "passed $value `x`\nline2"})


def test_x_unset_variable_warns_and_continues(launcher):
    res, by_rank = run_env_job(launcher, ["-np", "2", "-H", "localhost:2",
                                          "-x", "BB_NOT_SET_ANYWHERE", "-x", "BB_SET=1"], 2,
                               extra={"BB_SET": "1"})
    msgs = res.own_messages()
    assert any(m.startswith("perseusrun: ") and "BB_NOT_SET_ANYWHERE" in m for m in msgs), str(res)
    for env in by_rank.values():
        assert "BB_NOT_SET_ANYWHERE" not in env


def test_mca_sets_ompi_mca(launcher):
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", "-mca", "btl", "^openib",
                           "--mca", "plm_rsh_args", "-p 2222"], 2,
                extra={"OMPI_MCA_btl": "^openib", "OMPI_MCA_plm_rsh_args": "-p 2222"})


def test_job_id_differs_between_jobs(launcher):
    prog = launcher.prog("put('job.%d.%d' % (RANK, os.getpid()), os.environ['PERSEUS_JOB_ID'])")
    ids = []
    for _ in range(2):
        res = launcher.run(["-np", "1", "-H", "localhost:1", PY, prog])
        assert res.rc == 0, str(res)
    ids = {launcher.read(n) for n in launcher.files("job.")}
    assert len(launcher.files("job.")) == 2
    assert len(ids) == 2, "two jobs got the same PERSEUS_JOB_ID %s" % ids


def test_master_port_is_free(launcher):
    # Rank 0 binds MASTER_PORT the way torch.distributed's TCPStore does.
    prog = launcher.prog(
        "import socket\n"
        "port = int(os.environ['MASTER_PORT'])\n"
        "if RANK == 0:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind((os.environ['MASTER_ADDR'], port))\n"
        "    s.listen(8)\n"
        "    put('bound', str(port))\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog])
    assert res.rc == 0, str(res)
    assert launcher.files("bound") == ["bound"]


def test_master_port_option_sets_port(launcher):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2", "--master-port", str(port)], 2,
                extra={"MASTER_PORT": str(port)})


# ---- --gpu-bind -----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["--gpu-bind", "list"]])
def test_gpu_bind_list_default(launcher, args):
    run_env_job(launcher, [*args, "-np", "3", "-H", "localhost:3"], 3,
                extra={"CUDA_VISIBLE_DEVICES": "0,1,2"})


def test_gpu_bind_list_from_host_cuda_visible_devices(launcher):
    env = launcher.env(CUDA_VISIBLE_DEVICES="3,5")
    run_env_job(launcher, ["-np", "2", "-H", "localhost:2"], 2, env=env,
                extra={"CUDA_VISIBLE_DEVICES": "3,5"})


def test_gpu_bind_isolate(launcher):
    run_env_job(launcher, ["--gpu-bind", "isolate", "-np", "3", "-H", "localhost:3"], 3,
                extra={"CUDA_VISIBLE_DEVICES": lambda r: str(r)})


def test_gpu_bind_isolate_from_host_cuda_visible_devices(launcher):
    env = launcher.env(CUDA_VISIBLE_DEVICES="3,5")
    run_env_job(launcher, ["--gpu-bind", "isolate", "-np", "2", "-H", "localhost:2"], 2,
                env=env, extra={"CUDA_VISIBLE_DEVICES": lambda r: ["3", "5"][r]})


def test_gpu_bind_none_unset(launcher):
    run_env_job(launcher, ["--gpu-bind", "none", "-np", "2", "-H", "localhost:2"], 2,
                extra={"CUDA_VISIBLE_DEVICES": None})


def test_gpu_bind_none_inherited(launcher):
    env = launcher.env(CUDA_VISIBLE_DEVICES="3,5")
    run_env_job(launcher, ["--gpu-bind", "none", "-np", "2", "-H", "localhost:2"], 2, env=env,
                extra={"CUDA_VISIBLE_DEVICES": "3,5"})


# ---- argv -----------------------------------------------------------------------------------

WEIRD_ARGS = [
    b"", b"plain", b"two words", b"  padded  ", b"it's", b'"double"', b"$HOME", b"${PATH}",
    b"$(id)", b"`id`", b"line1\nline2", b"\n", b"tab\there", b"back\\slash", b"*", b"?",
    b"[a-z]", b"~", b";", b"&&", b"|", b">out", b"<in", b"#not a comment", b"!", b"%s%n",
    b"-np", b"--", b"-x", b"A=B", b"\xff\xfe not utf-8 \x80", b"caf\xc3\xa9", b"", b"last",
]


def test_argv_byte_for_byte(launcher):
    prog = launcher.prog("put('argv.%d' % RANK, repr([os.fsencode(a) for a in sys.argv[1:]]))")
    res = launcher.run(["-np", "3", "-H", "localhost:3", PY, prog, *WEIRD_ARGS])
    assert res.rc == 0, str(res)
    want = repr(WEIRD_ARGS).encode()
    for r in range(3):
        got = launcher.read("argv.%d" % r)
        assert got == want, "rank %d got argv %s\nexpected %s" % (r, got, want)


def test_argv_of_executable_found_directly(launcher):
    # The program itself (not an interpreter) is run with the arguments as given.
    prog = launcher.prog("put('argv0.%d' % RANK, repr([os.fsencode(a) for a in sys.argv]))")
    res = launcher.run(["-np", "1", "-H", "localhost:1", prog, "a b", "", "$x"])
    assert res.rc == 0, str(res)
    got = eval(launcher.read("argv0.0"))
    assert got[1:] == [b"a b", b"", b"$x"], got
    assert os.path.basename(got[0]) == os.path.basename(prog).encode(), got


def test_ranks_find_libperseus_and_the_perseus_package(launcher):
    """perseusrun tells ranks where its libperseus and the `perseus` package are, so that
    `import perseus` needs no set-up; the user's PERSEUS_LIBRARY wins, PYTHONPATH is kept."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shims = os.path.join(root, "lib", "framework_shims")
    env = launcher.env(PYTHONPATH="/opt/user/path")
    env.pop("PERSEUS_LIBRARY", None)
    _, by_rank = run_env_job(launcher, ["-np", "2", "-H", "localhost:2"], 2, env=env)
    for rank, e in by_rank.items():
        assert e["PYTHONPATH"] == shims + ":/opt/user/path", e["PYTHONPATH"]
        assert e["PERSEUS_LIBRARY"].endswith("/lib/comm/libperseus.so"), e["PERSEUS_LIBRARY"]
        assert os.path.exists(e["PERSEUS_LIBRARY"])
    env = launcher.env(PERSEUS_LIBRARY="/opt/mine/libperseus.so")
    res = launcher.run(["-np", "1", "-H", "localhost:1", "sh", "-c", "echo $PERSEUS_LIBRARY"],
                       env=env)
    assert res.rc == 0 and res.stdout == b"[1,0]<stdout>:/opt/mine/libperseus.so\n", str(res)
