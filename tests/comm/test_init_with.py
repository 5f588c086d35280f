"""perseus_serve_rendezvous + perseus_init_with: ranks started without perseusrun or MPI (as
under torchrun) meet through a store one of them serves, its address, port and secret handed
over by the caller's own means (here a multiprocessing queue, in the shims torch's store)."""

import ctypes
import multiprocessing as mp
import os

import pytest

LIBPERSEUS = os.environ.get("LIBPERSEUS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../build/lib/comm/libperseus.so")
FLOAT64, SUM = 7, 0


def _sanitized():
    """Python cannot load a libperseus built with AddressSanitizer (scripts/test.sh's second
    build): the C programs of this folder cover that build."""
    try:
        with open(LIBPERSEUS, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(_sanitized(), reason="libperseus is built with AddressSanitizer")


def _lib():
    lib = ctypes.CDLL(LIBPERSEUS)
    lib.perseus_last_error.restype = ctypes.c_char_p
    return lib


def _rank(rank, size, queue, results):
    # No perseusrun variables: this is a plain process.
    for key in [k for k in os.environ if k.startswith("PERSEUS_")]:
        del os.environ[key]
    lib = _lib()
    if rank == 0:
        address, port = ctypes.create_string_buffer(64), ctypes.c_int()
        secret = (ctypes.c_ubyte * 32)()
        rc = lib.perseus_serve_rendezvous(b"127.0.0.1", address, 64, ctypes.byref(port), secret)
        if rc != 0:
            results.put((rank, "serve: %s" % lib.perseus_last_error()))
            return
        for _ in range(size - 1):
            queue.put((address.value, port.value, bytes(secret)))
        where = (address.value, port.value, bytes(secret))
    else:
        where = queue.get(timeout=60)
    secret = (ctypes.c_ubyte * 32)(*where[2])
    rc = lib.perseus_init_with(rank, size, rank, size, 0, 1, where[0], where[1], secret)
    if rc != 0:
        results.put((rank, "init_with: %s" % lib.perseus_last_error()))
        return
    x = (ctypes.c_double * 5)(*[rank + 1.0] * 5)
    rc = lib.perseus_allreduce(x, x, 5, FLOAT64, SUM, b"x")
    lib.perseus_finalize()
    results.put((rank, "ok" if rc == 0 and list(x) == [size * (size + 1) / 2.0] * 5
                 else "allreduce: rc %d, %s" % (rc, list(x))))


def test_ranks_meet_without_a_launcher():
    size = 3
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, size, queue, results)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=120) for _ in range(size))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert got == {r: "ok" for r in range(size)}, got


def test_bad_places_and_secrets_are_refused():
    lib = _lib()
    secret = (ctypes.c_ubyte * 32)()
    rc = lib.perseus_init_with(3, 2, 0, 1, 0, 1, b"127.0.0.1", 1, secret)
    assert rc == -1 and b"rank 3 is not below its size 2" in lib.perseus_last_error()
    rc = lib.perseus_init_with(0, 1, 0, 1, 0, 1, b"127.0.0.1", 0, secret)
    assert rc == -1 and b"not a port" in lib.perseus_last_error()
    address, port = ctypes.create_string_buffer(4), ctypes.c_int()
    rc = lib.perseus_serve_rendezvous(b"127.0.0.1", address, 4, ctypes.byref(port), secret)
    assert rc == -1 and b"too small" in lib.perseus_last_error()
    rc = lib.perseus_serve_rendezvous(b"0.0.0.0x", ctypes.create_string_buffer(64), 64,
                                      ctypes.byref(port), secret)
    assert rc == -3, lib.perseus_last_error()
