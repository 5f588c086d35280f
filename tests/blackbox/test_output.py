"""Output forwarding: tags, whole lines, ordering, raw bytes, volume, --output-filename, stdin."""

import os


from conftest import PY, TIMEOUT, lines_of, untag

# Writes a byte string to a file descriptor in chunks whose sizes ignore line boundaries, so that
# perseusrun sees lines split across reads.
WRITER = r'''
import random
def write_chunked(fd, data, seed, max_chunk=8192):
    rnd = random.Random(seed)
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:rnd.randint(1, max_chunk)])
        view = view[n:]
'''


def check_own_messages(res):
    for m in res.own_messages():
        assert m.startswith("perseusrun: "), "untagged stderr line %r\n%s" % (m, res)


def test_every_line_tagged(launcher):
    prog = launcher.prog(
        "for i in range(5):\n"
        "    print('out %d %d' % (RANK, i), flush=True)\n"
        "    print('err %d %d' % (RANK, i), file=sys.stderr, flush=True)\n")
    res = launcher.run(["-np", "3", "-H", "localhost:3", PY, prog])
    assert res.rc == 0, str(res)
    out, other = untag(res.stdout, "stdout")
    assert other == [], "untagged or mis-tagged stdout lines: %r\n%s" % (other, res)
    assert out == {r: [b"out %d %d" % (r, i) for i in range(5)] for r in range(3)}, str(res)
    err, _ = untag(res.stderr, "stderr")
    assert err == {r: [b"err %d %d" % (r, i) for i in range(5)] for r in range(3)}, str(res)
    check_own_messages(res)
    # exact spelling: no space after the colon
    assert b"[1,2]<stdout>:out 2 0\n" in res.stdout
    assert b"[1,0]<stderr>:err 0 4\n" in res.stderr
    assert res.stdout.endswith(b"\n")


def _line(rank, i):
    if i == 1000:
        size = 300 * 1024  # one long line, far beyond any pipe buffer
    else:
        size = (i * 7919 + rank * 31) % 3000
    return b"%d:%d:" % (rank, i) + bytes([97 + (i + rank) % 26]) * size


def test_interleaving_many_ranks(launcher):
    nranks, nlines = 8, 2000
    prog = launcher.prog(WRITER +
        "def line(rank, i):\n"
        "    size = 300 * 1024 if i == 1000 else (i * 7919 + rank * 31) %% 3000\n"
        "    return b'%%d:%%d:' %% (rank, i) + bytes([97 + (i + rank) %% 26]) * size\n"
        "data = b''.join(line(RANK, i) + b'\\n' for i in range(%d))\n"
        "write_chunked(1, data, RANK)\n"
        "write_chunked(2, b'stderr-%%d\\n' %% RANK * 50, RANK + 100, 7)\n" % nlines)
    res = launcher.run(["-np", str(nranks), "-H", "localhost:%d" % nranks, PY, prog],
                       timeout=TIMEOUT * 3)
    assert res.rc == 0, str(res)
    out, other = untag(res.stdout, "stdout")
    assert other == [], "untagged stdout lines (first 3): %r" % [o[:80] for o in other[:3]]
    assert sorted(out) == list(range(nranks))
    for r in range(nranks):
        got = out[r]
        want = [_line(r, i) for i in range(nlines)]
        assert len(got) == len(want), "rank %d: %d lines, expected %d" % (r, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, "rank %d line %d differs: got %r..., expected %r..." % (
                r, i, g[:60], w[:60])
    err, _ = untag(res.stderr, "stderr")
    assert err == {r: [b"stderr-%d" % r] * 50 for r in range(nranks)}
    check_own_messages(res)


def test_large_output_loses_nothing(launcher):
    """2 ranks x 50 MB on stdout while a third writes small lines to stderr."""
    nlines = 52429  # x 1000 bytes = 50 MB per rank
    prog = launcher.prog(
        "if RANK < 2:\n"
        "    fill = b'x' * 988 + b'\\n'\n"
        "    out = sys.stdout.buffer\n"
        "    for start in range(0, %d, 1000):\n"
        "        out.write(b''.join(b'%%d %%08d ' %% (RANK, i) + fill\n"
        "                           for i in range(start, min(start + 1000, %d))))\n"
        "    out.flush()\n"
        "else:\n"
        "    for i in range(200):\n"
        "        sys.stderr.write('small %%d\\n' %% i)\n"
        "        sys.stderr.flush()\n"
        "        if i %% 20 == 0: time.sleep(0.01)\n" % (nlines, nlines))
    res = launcher.run(["-np", "3", "-H", "localhost:3", PY, prog], timeout=max(TIMEOUT * 4, 120))
    assert res.rc == 0, "exit %s\n%s" % (res.rc, res.stderr[-3000:].decode("utf-8", "replace"))
    counts = {0: 0, 1: 0}
    fill = b"x" * 988
    bad = []
    for line in lines_of(res.stdout):
        ok = False
        if line.startswith(b"[1,") and line[3:4] in (b"0", b"1") and \
                line[4:14] == b"]<stdout>:":
            r = int(line[3:4])
            body = line[14:]
            ok = body == b"%d %08d " % (r, counts[r]) + fill
            if ok:
                counts[r] += 1
        if not ok:
            bad.append(line[:80])
            if len(bad) > 5:
                break
    assert not bad, "broken, reordered or foreign lines (first ones): %r" % bad
    assert counts == {0: nlines, 1: nlines}, counts
    err, _ = untag(res.stderr, "stderr")
    assert err.get(2) == [b"small %d" % i for i in range(200)]


def test_non_utf8_bytes_pass_through(launcher):
    prog = launcher.prog(
        "os.write(1, b'\\xff\\xfe\\x80 bad \\xc3\\x28 end\\n')\n"
        "os.write(2, b'\\xed\\xa0\\x80\\xf8\\x88\\x80\\x80\\x80\\n')\n")
    res = launcher.run(["-np", "1", "-H", "localhost:1", PY, prog])
    assert res.rc == 0, str(res)
    assert res.stdout == b"[1,0]<stdout>:\xff\xfe\x80 bad \xc3\x28 end\n", str(res)
    err, _ = untag(res.stderr, "stderr")
    assert err == {0: [b"\xed\xa0\x80\xf8\x88\x80\x80\x80"]}, str(res)


def test_control_bytes_pass_through(launcher):
    prog = launcher.prog("os.write(1, b'carriage\\rreturn\\x00nul\\x1b[31mesc\\x1b[0m\\ttab\\n')")
    res = launcher.run(["-np", "1", "-H", "localhost:1", PY, prog])
    assert res.rc == 0, str(res)
    assert res.stdout == b"[1,0]<stdout>:carriage\rreturn\x00nul\x1b[31mesc\x1b[0m\ttab\n", str(res)


def test_empty_lines(launcher):
    prog = launcher.prog("os.write(1, b'\\n\\nx\\n\\n')")
    res = launcher.run(["-np", "1", "-H", "localhost:1", PY, prog])
    assert res.rc == 0, str(res)
    assert res.stdout == b"[1,0]<stdout>:\n[1,0]<stdout>:\n[1,0]<stdout>:x\n[1,0]<stdout>:\n", str(res)


def test_final_line_without_newline(launcher):
    prog = launcher.prog(
        "if RANK == 0:\n"
        "    os.write(1, b'first\\nno newline at end')\n"
        "    os.write(2, b'err no newline')\n"
        "else:\n"
        "    os.write(1, b'only partial')\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog])
    assert res.rc == 0, str(res)
    assert res.stdout.endswith(b"\n"), str(res)
    out, other = untag(res.stdout, "stdout")
    assert other == [], str(res)
    assert out == {0: [b"first", b"no newline at end"], 1: [b"only partial"]}, str(res)
    err, _ = untag(res.stderr, "stderr")
    assert err == {0: [b"err no newline"]}, str(res)
    assert b"[1,0]<stderr>:err no newline\n" in res.stderr, str(res)


def test_final_line_without_newline_when_killed(launcher):
    # The partial line of a rank that fails must not be lost either.
    prog = launcher.prog("os.write(1, b'partial before exit')\nos._exit(3)\n")
    res = launcher.run(["-np", "1", "-H", "localhost:1", PY, prog])
    assert res.rc == 3, str(res)
    assert res.stdout == b"[1,0]<stdout>:partial before exit\n", str(res)


def test_output_filename(launcher):
    outdir = launcher.tmp / "outputs"
    prog = launcher.prog(
        "for i in range(3):\n"
        "    os.write(1, b'out %d %d\\n' % (RANK, i))\n"
        "    os.write(2, b'err %d %d\\n' % (RANK, i))\n"
        "os.write(1, b'\\xff raw bytes \\x80\\n')\n")
    res = launcher.run(["--output-filename", str(outdir), "-np", "2", "-H", "localhost:2",
                        PY, prog])
    assert res.rc == 0, str(res)
    for r in range(2):
        d = outdir / "1" / ("rank.%d" % r)
        assert d.is_dir(), "missing %s; have %s" % (d, sorted(str(p) for p in outdir.rglob("*")))
        want_out = b"".join(b"out %d %d\n" % (r, i) for i in range(3)) + b"\xff raw bytes \x80\n"
        want_err = b"".join(b"err %d %d\n" % (r, i) for i in range(3))
        assert (d / "stdout").read_bytes() == want_out
        assert (d / "stderr").read_bytes() == want_err
    # ... in addition to the terminal
    out, _ = untag(res.stdout, "stdout")
    assert out == {r: [b"out %d %d" % (r, i) for i in range(3)] + [b"\xff raw bytes \x80"]
                   for r in range(2)}, str(res)
    err, _ = untag(res.stderr, "stderr")
    assert err == {r: [b"err %d %d" % (r, i) for i in range(3)] for r in range(2)}, str(res)


STDIN_PROG = (
    "import stat\n"
    "data = sys.stdin.buffer.read()\n"
    "st, null = os.fstat(0), os.stat('/dev/null')\n"
    "put('stdin.%d' % RANK, data)\n"
    "put('devnull.%d' % RANK, str(stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev))\n")


def test_stdin_goes_to_rank_0(launcher):
    data = os.urandom(2 * 1024 * 1024) + b"\nlast line without newline"
    prog = launcher.prog(STDIN_PROG)
    res = launcher.run(["-np", "3", "-H", "localhost:3", PY, prog], input=data)
    assert res.rc == 0, str(res)
    got = launcher.read("stdin.0")
    assert len(got) == len(data) and got == data, "rank 0 got %d of %d bytes" % (len(got), len(data))
    for r in (1, 2):
        assert launcher.read("stdin.%d" % r) == b""
        assert launcher.read("devnull.%d" % r) == b"True", "rank %d's stdin is not /dev/null" % r


def test_stdin_eof_reaches_rank_0_interactively(launcher):
    prog = launcher.prog(
        "if RANK == 0:\n"
        "    for line in sys.stdin:\n"
        "        print('got: ' + line.rstrip('\\n'), flush=True)\n"
        "    print('EOF', flush=True)\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog], input=b"alpha\nbeta\n")
    assert res.rc == 0, str(res)
    out, _ = untag(res.stdout, "stdout")
    assert out == {0: [b"got: alpha", b"got: beta", b"EOF"]}, str(res)


def test_stdin_devnull(launcher):
    prog = launcher.prog(STDIN_PROG)
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog])  # stdin is /dev/null
    assert res.rc == 0, str(res)
    assert launcher.read("stdin.0") == b""
    assert launcher.read("stdin.1") == b""


def test_busy_rank_does_not_starve_others(launcher):
    """Rank 0 streams 75 MB; rank 1 writes one line in the middle of it (after 25 MB, and rank 0
    goes on only once that line is written). The line must come out while rank 0 is still
    streaming, not after rank 0 is done."""
    prog = launcher.prog(
        "fill = b'y' * 988 + b'\\n'\n"
        "if RANK == 0:\n"
        "    out = sys.stdout.buffer\n"
        "    def stream(a, b):\n"
        "        for start in range(a, b, 1000):\n"
        "            out.write(b''.join(b'0 %08d ' % i + fill for i in range(start, start + 1000)))\n"
        "        out.flush()\n"
        "    stream(0, 25000)\n"
        "    put('streaming')\n"
        "    wait_count('said', 1)\n"
        "    stream(25000, 75000)\n"
        "else:\n"
        "    wait_count('streaming', 1)\n"
        "    os.write(1, b'rank 1 is not starved\\n')\n"
        "    put('said')\n")
    res = launcher.run(["-np", "2", "-H", "localhost:2", PY, prog], timeout=TIMEOUT * 3)
    assert res.rc == 0, "exit %s\n%s" % (res.rc, res.stderr[-3000:].decode("utf-8", "replace"))
    lines = lines_of(res.stdout)
    assert len(lines) == 75001, len(lines)
    where = lines.index(b"[1,1]<stdout>:rank 1 is not starved")
    assert where < 75000, "rank 1's line came out only after rank 0 had finished"
    assert lines[-1].startswith(b"[1,0]<stdout>:0 00074999 "), lines[-1][:40]
