"""The one ctypes binding of libperseus (include/perseus/perseus.h), shared by every shim.

Framework-neutral: it takes raw addresses, element counts and dtype codes, and knows nothing of
torch or mxnet. The library is loaded at first use, not at import, so that `import perseus`
works (and only warns where it matters) on a machine without it.

Where the library comes from, first found wins:
1. PERSEUS_LIBRARY, the path of the .so;
2. perseus/lib/libperseus.so next to this package (an installed copy);
3. <repo>/build/lib/comm/libperseus.so, the build tree this package sits in;
4. ctypes.util.find_library("perseus") (the system's library path).
"""
import array
import atexit
import ctypes
import ctypes.util
import os
import re
import struct
import sys
import threading

from perseus import _contract

# perseus_result_t
SUCCESS = 0
ERROR_INVALID_ARGUMENT = -1
ERROR_NOT_INITIALIZED = -2
ERROR_RENDEZVOUS = -3
ERROR_COMMUNICATION = -4
ERROR_TIMEOUT = -5
ERROR_INTERNAL = -6

ERROR_NAMES = {
    ERROR_INVALID_ARGUMENT: "PERSEUS_ERROR_INVALID_ARGUMENT",
    ERROR_NOT_INITIALIZED: "PERSEUS_ERROR_NOT_INITIALIZED",
    ERROR_RENDEZVOUS: "PERSEUS_ERROR_RENDEZVOUS",
    ERROR_COMMUNICATION: "PERSEUS_ERROR_COMMUNICATION",
    ERROR_TIMEOUT: "PERSEUS_ERROR_TIMEOUT",
    ERROR_INTERNAL: "PERSEUS_ERROR_INTERNAL",
}

# perseus_dtype_t, keyed by numpy's dtype names (torch's names are the same).
DTYPES = {
    "uint8": 0, "int8": 1, "int32": 2, "int64": 3,
    "float16": 4, "bfloat16": 5, "float32": 6, "float64": 7, "int16": 8,
}
DTYPE_NAMES = {code: name for name, code in DTYPES.items()}
ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8, 8: 2}

# perseus_op_t
SUM, AVERAGE, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4
OP_NAMES = {SUM: "sum", AVERAGE: "average", MIN: "min", MAX: "max", PRODUCT: "product"}

DEVICE_CPU = -1

# PERSEUS_GLOBAL_PROCESS_SET: every rank.
GLOBAL_PROCESS_SET = 0


class PerseusError(RuntimeError):
    """A libperseus call failed. .code is the PERSEUS_ERROR_* value (negative), .detail what
    perseus_last_error() said."""

    def __init__(self, message, code=ERROR_INTERNAL, detail=""):
        super().__init__(message)
        self.code = code
        self.detail = detail


class InvalidArgumentError(PerseusError, ValueError):
    """A call's argument is refused before anything is submitted (PERSEUS_ERROR_INVALID_ARGUMENT);
    also a ValueError, as Horovod raises for such arguments."""

    def __init__(self, message):
        super().__init__(message, ERROR_INVALID_ARGUMENT)


class HorovodInternalError(PerseusError):
    """A collective failed because the job's world broke: a peer was lost, or perseusrun ended
    the world (elastic jobs). Horovod's exception of that name; hvd.elastic.run rolls the state
    back to its last commit and joins the next world."""


class DuplicateNameError(PerseusError, ValueError):
    """An operation was submitted under a name that is still in flight on this rank (Horovod
    raises ValueError there): nothing was submitted, the job goes on."""


class NonFiniteError(PerseusError):
    """PERSEUS_ALLREDUCE_NANCHECK=1 found a NaN or Inf in an all-reduce's result. .tensor names
    it (the tensor's name, a parameter's name, or a DDP bucket and its parameters);
    .input_nonfinite says whether this rank's own input already had one."""

    def __init__(self, message, tensor="", input_nonfinite=None):
        super().__init__(message, ERROR_INVALID_ARGUMENT)
        self.tensor = tensor
        self.input_nonfinite = input_nonfinite


def dtype_code(name):
    """The perseus_dtype_t of a numpy/torch dtype name ("float32", "torch.float32", ...)."""
    key = str(name).rsplit(".", 1)[-1]
    if key not in DTYPES:
        raise PerseusError("libperseus has no element type for %s (supported: %s)"
                           % (name, ", ".join(DTYPES)), ERROR_INVALID_ARGUMENT)
    return DTYPES[key]


def _package_version():
    """This package's version: the one its build wrote (perseus/_version.py, installed with the
    package) or, for the package in the source tree, the CMake project's (CMakeLists.txt)."""
    try:
        from perseus._version import VERSION
        return VERSION
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(here))), "CMakeLists.txt")
    try:
        with open(top) as f:
            found = re.search(r"project\(perseus VERSION ([0-9.]+)", f.read())
    except OSError:
        found = None
    return found.group(1) if found else "0.0.0+unknown"


PACKAGE_VERSION = _package_version()
# The C ABI this package speaks: libperseus's soname major (libperseus.so.N), its version's first
# part. A library of another ABI is refused, not called.
ABI_VERSION = int(PACKAGE_VERSION.split(".")[0])


def _abi_mismatch(path, loaded):
    """Why the library at `path` cannot serve this package, or "" when its ABI is this one's."""
    try:
        call = loaded.perseus_version
    except AttributeError:
        return "%s has no perseus_version (not a libperseus?)" % path
    call.argtypes, call.restype = [], ctypes.c_int
    code = call()
    if code // 10000 == ABI_VERSION:
        return ""
    return ("%s is libperseus %d.%d.%d (C ABI %d), but this perseus package is %s (C ABI %d, "
            "from %s): install the package and the library from one build, or point "
            "PERSEUS_LIBRARY at a libperseus.so.%d"
            % (path, code // 10000, code // 100 % 100, code % 100, code // 10000,
               PACKAGE_VERSION, ABI_VERSION, os.path.dirname(os.path.abspath(__file__)),
               ABI_VERSION))


_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get(_contract.LIBRARY)
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    packaged = os.path.join(os.path.dirname(here), _contract.PACKAGED_LIBRARY)
    if os.path.exists(packaged):
        found.append(packaged)
    # <repo>/lib/framework_shims/perseus -> <repo>/build/lib/comm/libperseus.so
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    built = os.path.join(repo, "build", _contract.BUILD_TREE_LIBRARY)
    if os.path.exists(built):
        found.append(built)
    system = ctypes.util.find_library("perseus")
    if system:
        found.append(system)
    return found


def library_path():
    """The path of the loaded (or to be loaded) libperseus, or None when none is found."""
    if _lib_path:
        return _lib_path
    c = _candidates()
    return c[0] if c else None


def _declare(lib):
    c_int, c_size, c_void, c_char, c_double = (ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                                              ctypes.c_char_p, ctypes.c_double)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    req_pp = ctypes.POINTER(ctypes.c_void_p)
    table = {
        "perseus_version": ([], c_int),
        "perseus_gloo_built": ([], c_int),
        "perseus_nccl_built": ([], c_int),
        "perseus_nccl_version": ([], c_int),
        "perseus_init": ([], c_int),
        "perseus_finalize": ([], c_int),
        "perseus_rank": ([], c_int),
        "perseus_size": ([], c_int),
        "perseus_local_rank": ([], c_int),
        "perseus_local_size": ([], c_int),
        "perseus_cross_rank": ([], c_int),
        "perseus_cross_size": ([], c_int),
        "perseus_elastic_world": ([], c_int),
        "perseus_elastic_declare": ([], c_int),
        "perseus_elastic_hosts_updated": ([ctypes.POINTER(ctypes.c_longlong)], c_int),
        "perseus_allreduce": ([c_void, c_void, c_size, c_int, c_int, c_char], c_int),
        "perseus_broadcast": ([c_void, c_size, c_int, c_int, c_char], c_int),
        "perseus_allgather": ([c_void, c_void, c_size, c_int, c_char], c_int),
        "perseus_barrier": ([], c_int),
        "perseus_last_error": ([], c_char),
        "perseus_allreduce_async": ([c_void, c_void, c_size, c_int, c_int, c_double, c_double,
                                     c_char, c_int, c_void, req_pp], c_int),
        "perseus_broadcast_async": ([c_void, c_size, c_int, c_int, c_char, c_int, c_void,
                                     req_pp], c_int),
        "perseus_allgatherv_async": ([c_void, c_size, c_int, c_char, c_int, c_void, req_pp],
                                     c_int),
        "perseus_alltoall_async": ([c_void, size_p, c_int, c_char, c_int, c_void, req_pp], c_int),
        "perseus_reducescatter_async": ([c_void, c_void, size_p, c_int, c_int, c_double, c_double,
                                         c_char, c_int, c_void, req_pp], c_int),
        "perseus_next_shape": ([ctypes.POINTER(ctypes.c_int64), c_int], c_int),
        "perseus_poll": ([c_void], c_int),
        "perseus_wait": ([c_void], c_int),
        "perseus_output_counts": ([c_void, size_p], c_int),
        "perseus_output_copy": ([c_void, c_void], c_int),
        "perseus_release": ([c_void], None),
        "perseus_wait_release": ([c_void], c_int),
        "perseus_join": ([c_int, ctypes.POINTER(c_int)], c_int),
        "perseus_add_process_set": ([ctypes.POINTER(c_int), c_int, ctypes.POINTER(c_int)],
                                    c_int),
        "perseus_comm_world": ([req_pp], c_int),
        "perseus_comm_create": ([ctypes.POINTER(c_int), c_int, req_pp], c_int),
        "perseus_comm_process_set": ([c_void, ctypes.POINTER(c_int)], c_int),
        "perseus_comm_allreduce_async": ([c_void, c_void, c_void, c_size, c_int, c_int,
                                          c_double, c_double, c_char, c_int, c_void, req_pp],
                                         c_int),
        "perseus_comm_allreduce_submit": ([c_void, c_char, c_char, req_pp], c_int),
        "perseus_comm_allreduce": ([c_void, c_void, c_void, c_size, c_int, c_int, c_double,
                                    c_double, c_char, c_int, c_void], c_int),
        "perseus_comm_broadcast_async": ([c_void, c_void, c_size, c_int, c_int, c_char, c_int,
                                          c_void, req_pp], c_int),
        "perseus_comm_allgatherv_async": ([c_void, c_void, c_size, c_int, c_char, c_int, c_void,
                                           req_pp], c_int),
        "perseus_comm_alltoall_async": ([c_void, c_void, size_p, c_int, c_char, c_int, c_void,
                                         req_pp], c_int),
        "perseus_comm_reducescatter_async": ([c_void, c_void, c_void, size_p, c_int, c_int,
                                              c_double, c_double, c_char, c_int, c_void,
                                              req_pp], c_int),
        "perseus_comm_allreduce_many_async": ([c_void, c_int, ctypes.POINTER(c_void),
                                               ctypes.POINTER(c_void), size_p,
                                               ctypes.POINTER(c_int), c_int, c_double, c_double,
                                               ctypes.POINTER(c_char), ctypes.POINTER(c_int),
                                               ctypes.POINTER(ctypes.c_int64), c_int, c_void,
                                               ctypes.POINTER(c_void)], c_int),
        "perseus_comm_barrier": ([c_void], c_int),
        "perseus_host_pack": ([c_void, c_int, c_void, c_void], c_int),
        "perseus_host_unpack": ([c_void, c_int, c_void, c_void], c_int),
        "perseus_serve_rendezvous": ([c_char, c_void, c_size, ctypes.POINTER(c_int), c_void],
                                     c_int),
        "perseus_init_with": ([c_int, c_int, c_int, c_int, c_int, c_int, c_char, c_int, c_void],
                              c_int),
    }
    missing = []
    for name, (args, res) in table.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.argtypes = args
        fn.restype = res
    return missing


def lib():
    """The loaded library (ctypes.CDLL); raises PerseusError when none can be loaded."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        candidates = _candidates()
        if not candidates:
            raise PerseusError(
                "libperseus.so not found: set PERSEUS_LIBRARY to its path (build/lib/comm/"
                "libperseus.so after scripts/setup.sh), or run under perseusrun",
                ERROR_NOT_INITIALIZED)
        errors = []
        for path in candidates:
            try:
                loaded = ctypes.CDLL(path)
            except OSError as e:
                errors.append("%s: %s" % (path, e))
                continue
            mismatch = _abi_mismatch(path, loaded)
            if mismatch:
                errors.append(mismatch)
                continue
            missing = _declare(loaded)
            if missing:
                errors.append("%s lacks %s (a libperseus older than this package: rebuild it)"
                              % (path, ", ".join(missing)))
                continue
            _lib_path = path
            _lib = loaded
            return _lib
        raise PerseusError("could not load libperseus: " + "; ".join(errors),
                           ERROR_NOT_INITIALIZED)


def last_error():
    text = lib().perseus_last_error()
    return text.decode("utf-8", "replace") if text else ""


# What libperseus says of a name already in flight (engine.cc, Engine::submit).
_IN_FLIGHT = "is already in flight on this rank"


def error(code, what):
    """A PerseusError for a failed call: `what` (the call and the tensor), the code, and
    libperseus's own message."""
    detail = last_error()
    name = ERROR_NAMES.get(code, str(code))
    message = "%s failed (%s)" % (what, name)
    if detail:
        message += ": " + detail
    if code == ERROR_INVALID_ARGUMENT and _IN_FLIGHT in detail:
        return DuplicateNameError(message, code, detail)
    if code == ERROR_COMMUNICATION:
        return HorovodInternalError(message, code, detail)
    return PerseusError(message, code, detail)


def check(code, what):
    if code < 0:
        raise error(code, what)
    return code


def _name(name):
    """A name's UTF-8 bytes (None for none): the recent str names' kept in _ENCODED (a training
    loop all-reduces the same names every step; the hot paths look there first themselves)."""
    if name is None:
        return None
    try:
        return _ENCODED[name]
    except (KeyError, TypeError):  # not seen lately, or not a str
        pass
    if not isinstance(name, str):
        return bytes(name)
    encoded = name.encode("utf-8")
    if len(_ENCODED) >= _NAMES_KEPT:
        _ENCODED.clear()
    _ENCODED[name] = encoded
    return encoded


# The UTF-8 bytes of the str names seen lately: a lookup instead of an encoding. Emptied when it
# grows past _NAMES_KEPT.
_ENCODED = {}
_NAMES_KEPT = 4096


# ---- the process --------------------------------------------------------------------------

def version():
    return lib().perseus_version()


def gloo_built():
    return bool(lib().perseus_gloo_built())


def nccl_built():
    return bool(lib().perseus_nccl_built())


def nccl_version():
    """NCCL's version code (22809 for 2.28.9) when NCCL and a GPU can be used, else 0."""
    return lib().perseus_nccl_version()


_atexit_registered = False


def _finalize_at_exit():
    try:
        if is_initialized() and lib().perseus_finalize() != 0:
            sys.stderr.write("perseus: warning: at exit: %s\n" % last_error())
        else:
            _release_finished_orphans(everything=True)  # finalize has ended them
    except Exception:  # noqa: BLE001 - nothing to report to at exit
        pass


def init():
    """perseus_init; also finalizes at interpreter exit (before C's exit handlers, so that the
    library's threads stop before the libraries they use are torn down)."""
    global _atexit_registered
    _comms.clear()
    check(lib().perseus_init(), "perseus_init")
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_finalize_at_exit)


def init_through_store(store, rank, size, bind_address):
    """Joins without perseusrun or MPI, as under torchrun: `store` is the framework's own
    key-value store (torch.distributed's default store: set(key, bytes), get(key) waiting for
    it). Rank 0 serves libperseus's rendezvous store on bind_address (the address the other
    ranks reach rank 0 at) and hands its address, port and secret to the others through `store`;
    every rank tells the others its machine, so that local and cross ranks are known. The secret
    is only as safe as `store` is: torch's store has no authentication, like torchrun itself."""
    global _atexit_registered
    L = lib()
    import socket
    # The host name, this kernel and network namespace: containers and namespaces of one
    # machine often share its name, and are hosts of their own (as in launcher_bootstrap.cc).
    machine = socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            machine += "/" + f.read().strip()
        machine += "/" + os.readlink("/proc/self/ns/net")
    except OSError:
        pass
    store.set("perseus/machine/%d" % rank, machine.encode())
    machines = [bytes(store.get("perseus/machine/%d" % r)).decode() for r in range(size)]
    hosts = []  # in order of each host's first rank
    for m in machines:
        if m not in hosts:
            hosts.append(m)
    same_host = [r for r in range(size) if machines[r] == machines[rank]]
    local_rank, local_size = same_host.index(rank), len(same_host)
    peers = [r for r in range(size)  # the ranks with this local rank, one per host
             if [q for q in range(size) if machines[q] == machines[r]].index(r) == local_rank]
    cross_rank, cross_size = peers.index(rank), len(peers)
    if rank == 0:
        address = ctypes.create_string_buffer(128)
        port = ctypes.c_int()
        secret = (ctypes.c_ubyte * 32)()
        check(L.perseus_serve_rendezvous(bind_address.encode(), address, 128, ctypes.byref(port),
                                         secret), "perseus_serve_rendezvous")
        store.set("perseus/rendezvous",
                  b"%s|%d|%s" % (address.value, port.value, bytes(secret).hex().encode()))
    where = bytes(store.get("perseus/rendezvous")).split(b"|")
    secret = (ctypes.c_ubyte * 32)(*bytes.fromhex(where[2].decode()))
    _comms.clear()
    check(L.perseus_init_with(rank, size, local_rank, local_size, cross_rank, cross_size,
                              where[0], int(where[1]), secret), "perseus_init_with")
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_finalize_at_exit)


def finalize():
    _comms.clear()
    check(lib().perseus_finalize(), "perseus_finalize")
    _release_finished_orphans(everything=True)


def is_initialized():
    try:
        return lib().perseus_rank() >= 0
    except PerseusError:
        return False


def _query(fn, what):
    value = fn()
    if value < 0:
        raise error(value, what + " (call init() first)" if value == ERROR_NOT_INITIALIZED
                    else what)
    return value


def rank():
    return _query(lib().perseus_rank, "perseus_rank")


def elastic():
    """Whether this process is part of an elastic job (perseusrun --host-discovery-script)."""
    from perseus import _contract
    return bool(os.environ.get(_contract.ELASTIC_WORKER))


def elastic_world():
    """The elastic world this process joined (-1 outside an elastic job)."""
    value = lib().perseus_elastic_world()
    if value < -1:
        raise error(value, "perseus_elastic_world")
    return value


def elastic_declare():
    """Tells perseusrun this process joins new worlds in place (perseus_elastic_declare)."""
    check(lib().perseus_elastic_declare(), "perseus_elastic_declare")


def elastic_hosts_updated():
    """How many times perseusrun found the discovered hosts changed (0 outside elastic jobs)."""
    count = ctypes.c_longlong()
    check(lib().perseus_elastic_hosts_updated(ctypes.byref(count)),
          "perseus_elastic_hosts_updated")
    return count.value


def size():
    return _query(lib().perseus_size, "perseus_size")


def local_rank():
    return _query(lib().perseus_local_rank, "perseus_local_rank")


def local_size():
    return _query(lib().perseus_local_size, "perseus_local_size")


def cross_rank():
    return _query(lib().perseus_cross_rank, "perseus_cross_rank")


def cross_size():
    return _query(lib().perseus_cross_size, "perseus_cross_size")


def barrier(process_set=GLOBAL_PROCESS_SET):
    """Returns once every rank (every member of process_set; only members call it) has called
    it."""
    what = "barrier" if not process_set else "barrier of process set %d" % process_set
    check(lib().perseus_comm_barrier(_comm(process_set, what)), "perseus_comm_barrier (%s)" % what)


def _check_piece_arrays(addresses, sizes):
    if addresses.typecode != "Q" or sizes.typecode != "Q":
        raise InvalidArgumentError("addresses and sizes are array.array('Q'), not '%s' and '%s'"
                                   % (addresses.typecode, sizes.typecode))
    if len(addresses) != len(sizes):
        raise InvalidArgumentError("%d addresses and %d sizes: give one size a buffer"
                                   % (len(addresses), len(sizes)))


def host_pack(dst, addresses, sizes):
    """Copies the host buffers at `addresses` (array.array("Q")), sizes[i] bytes each
    (array.array("Q") of as many), one after the other into the buffer at dst: one library call
    (perseus_host_pack) instead of a framework's copy per tensor. The caller keeps the buffers
    alive and sized as said."""
    _check_piece_arrays(addresses, sizes)
    check(lib().perseus_host_pack(dst, len(addresses), addresses.buffer_info()[0],
                                  sizes.buffer_info()[0]), "perseus_host_pack")


def host_unpack(src, addresses, sizes):
    """host_pack's reverse: the buffer at src, piece after piece, into the buffers at addresses
    (perseus_host_unpack)."""
    _check_piece_arrays(addresses, sizes)
    check(lib().perseus_host_unpack(src, len(addresses), addresses.buffer_info()[0],
                                    sizes.buffer_info()[0]), "perseus_host_unpack")


# ---- requests ------------------------------------------------------------------------------

def _wait_failure(result, what, detail):
    """The error a failed operation raises when it is waited for (result: its code)."""
    name = ERROR_NAMES.get(result, str(result))
    kind = HorovodInternalError if result == ERROR_COMMUNICATION else PerseusError
    return kind("%s failed (%s): %s" % (what, name, detail), result, detail)


class Request:
    """One asynchronous operation. poll() -> bool, wait() raises PerseusError on failure,
    counts()/copy_output() for allgatherv and alltoall. Released by release() or when
    collected (after waiting for it: its buffers are in use until it is done). `keep` holds
    whatever must outlive the operation (the buffers' owners, the counts arrays). `what` is
    what errors call the operation: a string, or an object whose str() makes one."""

    __slots__ = ("_handle", "what", "_keep", "_key", "_result", "_detail", "_output")

    def __init__(self, handle, what, keep=(), key=None, output=None):
        self._handle = handle  # the perseus_request_t, as an int
        self.what = what
        self._keep = keep
        self._key = key  # (process set, name) of a named operation, else None
        self._result = None
        self._detail = ""
        self._output = output  # what synchronize() returns
        if key is not None:
            _taken.add(key)

    def poll(self):
        if self._handle is None:
            return True
        rc = lib().perseus_poll(self._handle)
        if rc < 0:
            raise error(rc, "perseus_poll on %s" % self.what)
        return rc == 1

    def wait(self):
        if self._result is None:
            if self._handle is None:
                raise PerseusError("%s: the request was released" % self.what,
                                   ERROR_INVALID_ARGUMENT)
            self._result = _lib.perseus_wait(self._handle)  # loaded: it made this request
            if self._result < 0:
                self._detail = last_error()
            if self._key is not None:
                self._key = _free_name(self._key)
        if self._result < 0:
            raise _wait_failure(self._result, self.what, self._detail)

    def counts(self, n):
        out = (ctypes.c_size_t * n)()
        check(lib().perseus_output_counts(self._handle, out), "perseus_output_counts on %s"
              % self.what)
        return list(out)

    def copy_output(self, dst):
        check(lib().perseus_output_copy(self._handle, ctypes.c_void_p(dst)),
              "perseus_output_copy on %s" % self.what)

    def release(self):
        handle, self._handle = self._handle, None
        if handle is not None and _lib is not None:
            _lib.perseus_release(handle)
        self._keep = ()
        if self._key is not None:
            self._key = _free_name(self._key)

    def synchronize(self):
        """wait() then release(): what a framework's synchronize(handle) does with a handle that
        is one request (the output given at submission, returned). Called again, it returns the
        output again, or raises the same error."""
        handle = self._handle
        if handle is not None and self._result is None:
            # wait() and release() written out (every async all-reduce's path); wait() below
            # raises the failure.
            self._handle = None
            self._result = result = _lib.perseus_wait_release(handle)
            if result < 0:
                self._detail = last_error()
            self._keep = ()
            if self._key is not None:
                self._key = _free_name(self._key)
            if result >= 0:
                return self._output
        self.wait()  # raises a failure, or that the request was released unwaited
        return self._output

    def __del__(self):
        if self._handle is None and self._key is None:
            return  # synchronized (or released): nothing left to free
        try:
            if self._handle is not None and _lib is not None and self._result is None:
                # Dropped before anyone waited for it (an async call whose handle was never
                # synchronized): releasing a running request would block this thread until the
                # other ranks submit it too, maybe never. Its buffers stay alive with it, and
                # its name stays taken, until a later submission finds it done.
                with _orphans_lock:
                    _orphans.append((self._handle, self._keep, self._key))
                self._handle, self._keep, self._key = None, (), None
                return
            self.release()
        except Exception:  # interpreter shutdown
            pass


class RequestGroup:
    """The requests of one allreduce_many_async, which a grouped all-reduce's handle waits for
    and releases together (its result, the outputs, needs nothing from them one by one): a
    list of handles instead of a Request a tensor. poll() and synchronize() as a Request's;
    synchronize() waits for and frees every request, then raises the first failure (named after
    its tensor), again at every later call."""

    __slots__ = ("_handles", "_whats", "_keep", "_keys", "_named", "_failure")

    def __init__(self, handles, whats, keep, keys, named):
        self._handles = handles  # the perseus_request_t of each, as ints
        self._whats = whats
        self._keep = keep
        self._keys = keys  # each one's (process set, name), None for an unnamed one
        self._named = named  # the keys that are not None
        self._failure = None
        _taken.update(named)

    def poll(self):
        handles = self._handles
        if handles is None:
            return True
        poll = lib().perseus_poll
        for handle, what in zip(handles, self._whats):
            rc = poll(handle)
            if rc < 0:
                raise error(rc, "perseus_poll on %s" % what)
            if rc == 0:
                return False
        return True

    def synchronize(self):
        handles = self._handles
        if handles is not None:
            self._handles = None
            wait_release = _lib.perseus_wait_release  # loaded: it made these requests
            failure = None
            for i, handle in enumerate(handles):
                rc = wait_release(handle)
                if rc < 0 and failure is None:
                    failure = _wait_failure(rc, self._whats[i], last_error())
            _taken.difference_update(self._named)
            self._keep, self._keys, self._named, self._failure = (), (), (), failure
        if self._failure is not None:
            raise self._failure

    def __del__(self):
        handles = self._handles
        if handles is None:
            return
        try:
            if _lib is not None:
                # Dropped before anyone waited for them (see Request.__del__): each released,
                # and its name freed, once done.
                with _orphans_lock:
                    _orphans.extend((handle, self._keep, key)
                                    for handle, key in zip(handles, self._keys))
            self._handles = None
        except Exception:  # interpreter shutdown
            pass


# A named operation's name is taken on this rank from its submission until its result is
# collected (wait, which synchronize calls) or its request released: a second submission under
# it raises DuplicateNameError, as Horovod's does while the first is in flight. Horovod frees
# the name when its background thread ends the operation; here the caller's handle decides,
# so the refusal does not depend on how fast the other ranks were (Horovod's own tests submit
# twice right after the other ranks have, and expect the error).
# libperseus itself refuses a name in flight there, so a name is taken by one request at a time
# (two only in a race of threads that submit it together, which libperseus then refuses or
# which the second wins once the first has ended there): a set, whose add, discard and `in`
# are each atomic under the GIL, without a lock on every call.
_taken = set()  # the keys of the requests not collected
# Requests dropped before they were waited for: (handle, buffers, key), released (and their
# names freed) once done, by the next submission under another name or at exit, after
# perseus_finalize has ended them.
_orphans = []
_orphans_lock = threading.Lock()


def _free_name(key):
    if key is not None:
        _taken.discard(key)
    return None


def _release_finished_orphans(everything=False):
    if not _orphans or _lib is None:
        return
    with _orphans_lock:
        done, running = [], []
        for orphan in _orphans:
            (done if everything or _lib.perseus_poll(orphan[0]) != 0 else running).append(orphan)
        _orphans[:] = running
    for handle, _, key in done:
        _lib.perseus_release(handle)
        _free_name(key)


def _refuse_taken_name(key, what):
    if key in _taken:  # one dict lookup, atomic under the GIL: no lock
        detail = ("an operation named '%s' %s (submitted here and not yet synchronized): "
                  "synchronize its handle first, or use another name"
                  % (key[1].decode("utf-8", "replace"), _IN_FLIGHT))
        raise DuplicateNameError("%s failed (PERSEUS_ERROR_INVALID_ARGUMENT): %s" % (
            what, detail), ERROR_INVALID_ARGUMENT, detail)


# ctypes array types of shapes, by number of dimensions (made once: a type is costly to make),
# and (array, its address, dimensions) of the shapes seen last (a training loop submits the same
# few shapes on every step; libperseus only reads them). Emptied when it grows past
# _SHAPES_KEPT; a caller holds the entry while libperseus reads the array.
_SHAPE_TYPES = {}
_SHAPES = {}
_SHAPES_KEPT = 4096


def _shape_entry(shape):
    if not isinstance(shape, tuple):  # torch.Size and numpy's shapes are tuples
        shape = tuple(shape)
    entry = _SHAPES.get(shape)
    if entry is not None:
        return entry
    n = len(shape)
    kind = _SHAPE_TYPES.get(n)
    if kind is None:
        kind = _SHAPE_TYPES[n] = ctypes.c_int64 * max(n, 1)
    if len(_SHAPES) >= _SHAPES_KEPT:
        _SHAPES.clear()
    array = kind(*shape)
    entry = _SHAPES[shape] = (array, ctypes.addressof(array), n)
    return entry


def _shape_array(shape):
    return _shape_entry(shape)[0]


_NO_SHAPE = (None, 0, -1)  # a _shape_entry for "no shape" (perseus_allreduce_args_t's ndims -1)


class _AllreduceArgs(ctypes.Structure):
    """perseus_allreduce_args_t (perseus.h), to check _ALLREDUCE_ARGS's layout against."""
    _fields_ = [("size", ctypes.c_uint32), ("dtype", ctypes.c_int32), ("op", ctypes.c_int32),
                ("device", ctypes.c_int32), ("send", ctypes.c_void_p), ("recv", ctypes.c_void_p),
                ("count", ctypes.c_size_t), ("prescale", ctypes.c_double),
                ("postscale", ctypes.c_double), ("stream", ctypes.c_void_p),
                ("dims", ctypes.c_void_p), ("ndims", ctypes.c_int32)]


# perseus_allreduce_args_t packed in one step (bytes, which ctypes hands to C as a pointer):
# perseus_comm_allreduce_submit's four arguments convert in about a third of the time of the
# fourteen of a call that takes them one by one. "0P" pads the end as C does.
_ALLREDUCE_ARGS = struct.Struct("@IiiiPPNddPPi0P")
_pack_allreduce = _ALLREDUCE_ARGS.pack
_ALLREDUCE_ARGS_SIZE = ctypes.sizeof(_AllreduceArgs)


def _check_allreduce_args():
    values = (_ALLREDUCE_ARGS_SIZE, 2, 3, -4, 5, 6, 7, 8.5, 9.5, 10, 11, -12)
    packed = _pack_allreduce(*values)
    mirror = _AllreduceArgs.from_buffer_copy(packed)
    got = tuple(getattr(mirror, name) for name, _ in _AllreduceArgs._fields_)
    assert len(packed) == _ALLREDUCE_ARGS_SIZE and got == values, (len(packed), got)


_check_allreduce_args()


def _submit(fn, what, keep, *args, shape=None, key=None):
    _before_submit(key, what, shape)
    handle = ctypes.c_void_p()
    rc = fn(*args, ctypes.byref(handle))
    if rc < 0:
        raise error(rc, what)
    return Request(handle.value, what, keep, key)


def _before_submit(key, what, shape):
    """What a submission does before its library call: a name in flight refused, finished
    orphans released, the shape given (perseus_next_shape)."""
    if key is not None:
        _refuse_taken_name(key, what)
    if _orphans:
        _release_finished_orphans()
    if shape is not None:
        _next_shape(shape, what)


def _next_shape(shape, what):
    rc = _lib.perseus_next_shape(_shape_array(shape), len(shape))
    if rc < 0:  # `what` is made into text only here: it costs a microsecond or two
        raise error(rc, "perseus_next_shape for %s" % what)


def _key(name, process_set=GLOBAL_PROCESS_SET):
    """What makes a named operation's name unique on this rank: (process set, name)."""
    return _key_of(_name(name), process_set)


def _key_of(encoded, process_set):
    """_key of a name already encoded (_name)."""
    return None if encoded is None else (int(process_set), encoded)


def _c_array(kind, code, values):
    """A ctypes array of `kind` holding values, made through array.array(code) (whose items
    have kind's size: checked once per pair at import)."""
    return (kind * len(values)).from_buffer(array.array(code, values))


for _kind, _code in ((ctypes.c_void_p, "Q"), (ctypes.c_size_t, "Q"), (ctypes.c_int, "i"),
                     (ctypes.c_int64, "q")):
    assert ctypes.sizeof(_kind) == array.array(_code).itemsize, (_kind, _code)
del _kind, _code


def _size_array(values):
    return (ctypes.c_size_t * len(values))(*values)


# The communicator handle (perseus_comm_t) of each process set number of this perseus_init:
# the world's (0) from perseus_comm_world, a set's from the perseus_comm_create that made it.
# Emptied at every init and finalize: a handle belongs to one init.
_comms = {}


def _comm(process_set, what):
    """The handle every submission goes through. A number no perseus_comm_create of this init
    gave (a set of no ranks, a removed or made-up number) is refused here as libperseus refuses
    a set this rank is not in."""
    number = int(process_set or GLOBAL_PROCESS_SET)
    handle = _comms.get(number)
    if handle is not None:
        return handle
    if number != GLOBAL_PROCESS_SET:
        raise PerseusError("%s: this rank (%d) is not a member of process set %d, or no such set "
                           "exists (add_process_set makes them, on every rank)"
                           % (what, rank(), number), ERROR_INVALID_ARGUMENT)
    out = ctypes.c_void_p()
    check(lib().perseus_comm_world(ctypes.byref(out)), "perseus_comm_world")
    _comms[number] = out.value
    return out.value


def allreduce_async(send, recv, count, dtype, op, prescale=1.0, postscale=1.0, name=None,
                    device=DEVICE_CPU, stream=None, what="allreduce", keep=(),
                    process_set=GLOBAL_PROCESS_SET, shape=None, output=None, kind=Request):
    """shape (optional, every *_async call): the tensor's full shape, which negotiation checks
    against the other ranks' (perseus_next_shape). output: what the request's synchronize()
    returns; kind: the Request class to make (a framework's handle of one request)."""
    # _submit's and _before_submit's work written out (no argument packing, no calls for what
    # is absent): the call a training step makes for every tensor.
    if name is None:
        encoded = key = None
    else:
        try:
            encoded = _ENCODED[name]
        except (KeyError, TypeError):  # not seen lately, or not a str
            encoded = _name(name)
        key = (int(process_set), encoded)
        if key in _taken:
            _refuse_taken_name(key, what)
    comm = _comms.get(process_set) or _comm(process_set, what)
    if _orphans:
        _release_finished_orphans()
    handle = ctypes.c_void_p()
    # The shape in the same call (perseus_next_shape's work); held while libperseus reads it.
    if shape is None:
        dims = _NO_SHAPE
    else:
        try:
            dims = _SHAPES[shape]
        except (KeyError, TypeError):  # not seen lately, or not a tuple (a list)
            dims = _shape_entry(shape)
    rc = _lib.perseus_comm_allreduce_submit(
        comm, _pack_allreduce(_ALLREDUCE_ARGS_SIZE, dtype, op, device, send, recv, count,
                              prescale, postscale, stream or 0, dims[1], dims[2]),
        encoded, ctypes.byref(handle))
    if rc < 0:
        raise error(rc, what)
    return kind(handle.value, what, keep, key, output)


def allreduce(send, recv, count, dtype, op, prescale=1.0, postscale=1.0, name=None,
              device=DEVICE_CPU, stream=None, what="allreduce", process_set=GLOBAL_PROCESS_SET,
              shape=None):
    """allreduce_async, waited for, in one library call (perseus_comm_allreduce): no Request,
    and the name is in flight only during the call. Raises what Request.wait would."""
    encoded = _name(name)
    comm = _comm(process_set, what)
    _before_submit(_key_of(encoded, process_set), what, shape)
    rc = _lib.perseus_comm_allreduce(comm, send, recv, count, dtype, op, float(prescale),
                                     float(postscale), encoded, device, stream)
    if rc < 0:
        raise error(rc, what)


def allreduce_many_async(sends, recvs, counts, dtypes, op, prescale, postscale, names, shapes,
                         whats, keeps, device=DEVICE_CPU, stream=None,
                         process_set=GLOBAL_PROCESS_SET):
    """n all-reduces in one library call (perseus_comm_allreduce_many_async): the same requests,
    names and checks as n allreduce_async calls, in order, as one RequestGroup. sends, recvs:
    buffer addresses; names: str or None each; shapes: each tensor's full shape; whats: what
    each one's errors call it; keeps: what must outlive them. A name already in flight here, or
    twice in the list, is refused before anything is submitted. On a failure in tensor i the
    tensors before it were submitted: they are dropped unwaited (released once done, see
    Request.__del__) and the error raised."""
    n = len(sends)
    number = int(process_set)
    encoded = [_name(name) for name in names]
    keys = [None if e is None else (number, e) for e in encoded]
    named = [key for key in keys if key is not None]
    if len(set(named)) != len(named) or not _taken.isdisjoint(named):
        seen = set()
        for key, what in zip(keys, whats):
            if key is not None:
                if key in seen:
                    detail = "the name '%s' is given twice in one group" % key[1].decode(
                        "utf-8", "replace")
                    raise DuplicateNameError("%s failed (PERSEUS_ERROR_INVALID_ARGUMENT): %s"
                                             % (what, detail), ERROR_INVALID_ARGUMENT, detail)
                seen.add(key)
                _refuse_taken_name(key, what)
    if _orphans:
        _release_finished_orphans()
    comm = _comm(process_set, whats[0] if whats else "allreduce")
    ndims = [len(shape) for shape in shapes]
    dims = [extent for shape in shapes for extent in shape]
    # The arrays through the array module (its conversion of a list runs in C, several times
    # faster than ctypes's element by element), handed over as ctypes arrays on its buffers.
    handles = (ctypes.c_void_p * n)()
    rc = lib().perseus_comm_allreduce_many_async(
        comm, n, _c_array(ctypes.c_void_p, "Q", sends), _c_array(ctypes.c_void_p, "Q", recvs),
        _c_array(ctypes.c_size_t, "Q", counts), _c_array(ctypes.c_int, "i", dtypes), op,
        float(prescale), float(postscale), (ctypes.c_char_p * n)(*encoded),
        _c_array(ctypes.c_int, "i", ndims), _c_array(ctypes.c_int64, "q", dims or [0]), device,
        stream, handles)
    submitted = handles[:]  # ints; None (NULL) from the first tensor a failure left unsubmitted
    if rc < 0:
        k = submitted.index(None) if None in submitted else n
        # Those submitted before the failure, dropped unwaited: released once the other ranks
        # finish them (RequestGroup.__del__).
        RequestGroup(submitted[:k], whats, keeps, keys[:k], [key for key in keys[:k] if key])
        raise error(rc, "grouped allreduce of %d tensors" % n)
    return RequestGroup(submitted, whats, keeps, keys, named)


def broadcast_async(buf, count, dtype, root, name=None, device=DEVICE_CPU, stream=None,
                    what="broadcast", keep=(), process_set=GLOBAL_PROCESS_SET, shape=None):
    """root is a rank of the job (in a process set: one of its members)."""
    return _submit(lib().perseus_comm_broadcast_async, what, keep, _comm(process_set, what), buf,
                   count, dtype, root, _name(name), device, stream, shape=shape,
                   key=_key(name, process_set))


def allgatherv_async(send, count, dtype, name=None, device=DEVICE_CPU, stream=None,
                     what="allgather", keep=(), process_set=GLOBAL_PROCESS_SET, shape=None):
    """In a process set the result holds the members' blocks in rank order: counts(n) with n
    the set's size."""
    return _submit(lib().perseus_comm_allgatherv_async, what, keep, _comm(process_set, what),
                   send, count, dtype, _name(name), device, stream, shape=shape,
                   key=_key(name, process_set))


def alltoall_async(send, send_counts, dtype, name=None, device=DEVICE_CPU, stream=None,
                   what="alltoall", keep=(), shape=None, process_set=GLOBAL_PROCESS_SET):
    """In a process set, send_counts and counts(n) hold one count per member (n: its size)."""
    counts = _size_array(send_counts)
    keep = tuple(keep) + (counts,)
    return _submit(lib().perseus_comm_alltoall_async, what, keep, _comm(process_set, what), send,
                   counts, dtype, _name(name), device, stream, shape=shape,
                   key=_key(name, process_set))


def reducescatter_async(send, recv, recv_counts, dtype, op, prescale=1.0, postscale=1.0,
                        name=None, device=DEVICE_CPU, stream=None, what="reducescatter",
                        keep=(), shape=None, process_set=GLOBAL_PROCESS_SET):
    """In a process set, recv_counts holds one count per member."""
    counts = _size_array(recv_counts)
    keep = tuple(keep) + (counts,)
    return _submit(lib().perseus_comm_reducescatter_async, what, keep, _comm(process_set, what),
                   send, recv, counts, dtype, op, float(prescale), float(postscale), _name(name),
                   device, stream, shape=shape, key=_key(name, process_set))


def join(device=DEVICE_CPU):
    """Blocks until every rank has joined; returns the last rank to join."""
    last = ctypes.c_int(-1)
    check(lib().perseus_join(device, ctypes.byref(last)), "perseus_join")
    return last.value


# ---- process sets --------------------------------------------------------------------------

def add_process_set(ranks):
    """perseus_comm_create: collective over EVERY rank (members or not, the same calls in the
    same order everywhere). ranks: distinct ranks of the job, any order. Returns the set's
    number (the same on every rank); its handle is kept for the submissions."""
    members = [int(r) for r in ranks]
    arr = (ctypes.c_int * max(len(members), 1))(*members)
    handle = ctypes.c_void_p()
    check(lib().perseus_comm_create(arr, len(members), ctypes.byref(handle)),
          "perseus_comm_create of ranks %s" % (members,))
    number = ctypes.c_int(-1)
    check(lib().perseus_comm_process_set(handle, ctypes.byref(number)),
          "perseus_comm_process_set")
    _comms[number.value] = handle.value
    return number.value


def hosts_of_ranks(places):
    """Each rank's host number from every rank's place: places[r] = (local_rank, local_size,
    cross_rank) of rank r as libperseus gives them. Hosts are numbered by their local rank 0's
    cross rank (every host has one); a rank with local rank l and cross rank c is on the c-th
    host, in that order, of those with more than l ranks (cross rank counts the hosts that have
    a rank with this local rank, in host order, under perseusrun and under mpirun alike).
    Raises PerseusError when the places do not fit together."""
    sizes = {c: n for l, n, c in places if l == 0}  # host number -> ranks on it
    hosts = []
    for r, (l, n, c) in enumerate(places):
        having = [h for h in sorted(sizes) if sizes[h] > l]
        if not 0 <= c < len(having) or sizes[having[c]] != n:
            raise PerseusError(
                "rank %d's place (local rank %d of %d, cross rank %d) fits no host of the job's "
                "places %s: the launcher's local and cross ranks disagree; run under perseusrun "
                "or mpirun, or pass consistent places to perseus_init_with" % (r, l, n, c, places))
        hosts.append(having[c])
    return hosts


def host_process_sets(node_of_rank):
    """Makes one process set per host, collectively: node_of_rank[r] is rank r's host index
    (the same list on every rank, e.g. hosts_of_ranks of the all-gathered places). Every rank creates
    every host's set in increasing host order. Returns {host index: (set number, ranks)}."""
    hosts = {}
    for r, node in enumerate(node_of_rank):
        hosts.setdefault(int(node), []).append(r)
    return {node: (add_process_set(hosts[node]), hosts[node]) for node in sorted(hosts)}
