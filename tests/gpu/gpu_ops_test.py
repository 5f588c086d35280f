#!/usr/bin/env python3
"""libperseus's C ABI on CUDA device memory, one rank, torch CUDA tensors (issue 6).

    perseusrun -np 1 -H localhost:1 python3 tests/gpu/gpu_ops_test.py [--cpu] [--quick]

Calls libperseus.so directly through ctypes (PERSEUS_LIBRARY, else build/lib/comm/libperseus.so),
as a framework shim would, on buffers of torch CUDA tensors, with device = tensor.device.index
and stream = the torch stream's cudaStream_t. Groups:

  built      perseus_nccl_built() == 1 (and init, rank, size)
  ops        allreduce sum/avg/min/max/product (out of place, and sum in place), broadcast,
             allgatherv (perseus_output_counts + perseus_output_copy into a CUDA tensor),
             alltoall, reducescatter x uint8, int8, int32, int64, float16, bfloat16, float32,
             float64 x 0, 1, 1001 elements and 4 MB; with one rank every op is the identity, so
             the result must equal the input bit for bit
  ordering   a long kernel (torch.cuda._sleep) then x.fill_(v) queued on the caller's stream, the
             all-reduce submitted at once without synchronising: the stream must still be busy
             at submission and the result must be v (the op waited for the caller's event); on
             the legacy default stream and on a side stream, in and out of place
  fusion     100 small tensors submitted asynchronously, then waited for; each must be intact,
             and the timeline (PERSEUS_TIMELINE) tells how many NCCL calls carried them
  errors     a host pointer with device 0 (pageable and pinned) -> INVALID_ARGUMENT naming the
             buffer; prescale/postscale != 1 on device -> INVALID_ARGUMENT
  fp16       a float32 tensor cast to float16 (and bfloat16) with torch, all-reduced as
             PERSEUS_FLOAT16 (BFLOAT16), cast back: equals the torch casts' round trip
  mixed      host (Gloo) and device (NCCL) operations in the same rank, interleaved

Compression through the API and NaN naming are the torch shim's (tested there).
--cpu runs the groups that make sense on host memory (device PERSEUS_DEVICE_CPU, Gloo), to
check this script on a machine without a GPU. Prints one summary line per group and exits 1 on
any failure.
"""
import argparse
import atexit
import ctypes
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUCCESS, INVALID_ARGUMENT = 0, -1
DEVICE_CPU = -1
DTYPES = ["uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
DTYPE_CODE = {name: code for code, name in enumerate(DTYPES)}
OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "product": 4}


def load_library():
    path = os.environ.get("PERSEUS_LIBRARY") or os.path.join(ROOT, "build/lib/comm/libperseus.so")
    lib = ctypes.CDLL(path)
    P, S, I, D, C = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
    R = ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "perseus_version": ([], I),
        "perseus_nccl_built": ([], I),
        "perseus_gloo_built": ([], I),
        "perseus_init": ([], I),
        "perseus_finalize": ([], I),
        "perseus_rank": ([], I),
        "perseus_size": ([], I),
        "perseus_allreduce_async": ([P, P, S, I, I, D, D, C, I, P, R], I),
        "perseus_broadcast_async": ([P, S, I, I, C, I, P, R], I),
        "perseus_allgatherv_async": ([P, S, I, C, I, P, R], I),
        "perseus_alltoall_async": ([P, ctypes.POINTER(S), I, C, I, P, R], I),
        "perseus_reducescatter_async": ([P, P, ctypes.POINTER(S), I, I, D, D, C, I, P, R], I),
        "perseus_allreduce": ([P, P, S, I, I, C], I),
        "perseus_poll": ([P], I),
        "perseus_wait": ([P], I),
        "perseus_output_counts": ([P, ctypes.POINTER(S)], I),
        "perseus_output_copy": ([P, P], I),
        "perseus_release": ([P], None),
        "perseus_last_error": ([], C),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib, path


class Failure(Exception):
    pass


class Suite:
    def __init__(self, lib, torch, device):
        self.lib, self.torch, self.dev = lib, torch, device
        self.cuda = device.type == "cuda"
        self.groups = []
        self.failed = False
        self.counter = 0

    # ---- helpers -------------------------------------------------------------------------

    def last_error(self):
        return (self.lib.perseus_last_error() or b"").decode(errors="replace")

    def ordinal(self, t):
        return t.device.index if t.is_cuda else DEVICE_CPU

    def stream_of(self, t, stream=None):
        if not t.is_cuda:
            return None
        s = stream if stream is not None else self.torch.cuda.current_stream(t.device)
        return s.cuda_stream or None

    def name(self, what):
        self.counter += 1
        return f"{what}.{self.counter}".encode()

    def check(self, rc, what):
        if rc != SUCCESS:
            raise Failure(f"{what}: returned {rc}: {self.last_error()}")

    def finish(self, req, what):
        try:
            self.check(self.lib.perseus_wait(req), f"{what}: perseus_wait")
        finally:
            self.lib.perseus_release(req)

    def ptr(self, t):
        return ctypes.c_void_p(t.data_ptr()) if t.numel() else None

    def allreduce(self, send, recv, op, dtype, name=None, stream=None, prescale=1.0, postscale=1.0,
                  wait=True):
        req = ctypes.c_void_p()
        rc = self.lib.perseus_allreduce_async(
            self.ptr(send), self.ptr(recv), send.numel(), DTYPE_CODE[dtype], OPS[op], prescale,
            postscale, name or self.name("allreduce"), self.ordinal(send),
            self.stream_of(send, stream), ctypes.byref(req))
        if not wait:
            return rc, req
        self.check(rc, f"allreduce {op} {dtype} x{send.numel()}: submit")
        self.finish(req, f"allreduce {op} {dtype} x{send.numel()}")
        return rc, None

    def random(self, dtype, count):
        torch = self.torch
        tdt = getattr(torch, dtype)
        if dtype == "uint8":
            return torch.randint(0, 256, (count,), dtype=tdt, device=self.dev)
        if dtype == "int8":
            return torch.randint(-128, 128, (count,), dtype=tdt, device=self.dev)
        if dtype in ("int32", "int64"):
            lo, hi = (-2**31, 2**31 - 1) if dtype == "int32" else (-2**62, 2**62)
            return torch.randint(lo, hi, (count,), dtype=tdt, device=self.dev)
        return (torch.randn(count, dtype=torch.float32, device=self.dev) * 100).to(tdt)

    def same(self, got, want, what):
        if got.shape != want.shape:
            raise Failure(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        # Bit for bit (float16/bfloat16 included): one rank's reductions are the identity.
        g = got.view(self.torch.uint8) if got.numel() else got
        w = want.view(self.torch.uint8) if want.numel() else want
        if not self.torch.equal(g, w):
            bad = (got != want).nonzero()
            i = int(bad[0]) if bad.numel() else -1
            raise Failure(f"{what}: {bad.numel()} of {got.numel()} elements differ, first at {i}: "
                          f"{got[i].item() if i >= 0 else '?'} != {want[i].item() if i >= 0 else '?'}")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def group(self, title, fn):
        start = time.time()
        passed, failures = fn()
        self.failed |= bool(failures)
        status = "PASS" if not failures else "FAIL"
        print(f"[{status}] {title}: {passed} passed, {len(failures)} failed "
              f"({time.time() - start:.1f} s)", flush=True)
        for f in failures[:20]:
            print(f"    FAILED {f}", flush=True)
        if len(failures) > 20:
            print(f"    ... and {len(failures) - 20} more", flush=True)
        self.groups.append(dict(group=title, passed=passed, failed=len(failures),
                                failures=failures[:20]))

    def run_cases(self, cases):
        passed, failures = 0, []
        for what, case in cases:
            try:
                case()
                passed += 1
            except Failure as e:
                failures.append(str(e))
            except Exception as e:  # a crash in a case is a failure of that case
                failures.append(f"{what}: {type(e).__name__}: {e}\n"
                                + "".join(traceback.format_exc().splitlines(True)[-4:]))
        return passed, failures

    # ---- groups --------------------------------------------------------------------------

    def g_built(self):
        lib = self.lib
        out = []
        if self.cuda and lib.perseus_nccl_built() != 1:
            out.append(f"perseus_nccl_built() = {lib.perseus_nccl_built()}, expected 1")
        if lib.perseus_rank() != 0 or lib.perseus_size() != 1:
            out.append(f"rank {lib.perseus_rank()} size {lib.perseus_size()}, expected 0 and 1")
        return 2 - len(out), out

    def g_ops(self, sizes):
        torch = self.torch
        cases = []
        for dtype in DTYPES:
            unit = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
            for count in sizes:
                if count == "4MB":
                    count = (4 << 20) // unit
                cases += self.op_cases(dtype, count)
        return self.run_cases(cases)

    def op_cases(self, dtype, count):
        torch, lib = self.torch, self.lib
        code = DTYPE_CODE[dtype]
        tag = f"{dtype} x{count}"
        cases = []

        def sentinel_like(x):
            return torch.full_like(x, 7) if x.numel() else x.clone()

        for op in OPS:
            def out_of_place(op=op):
                x = self.random(dtype, count)
                want = x.clone()
                y = sentinel_like(x)
                self.allreduce(x, y, op, dtype)
                self.same(y, want, f"allreduce {op} {tag} (recv)")
                self.same(x, want, f"allreduce {op} {tag} (send untouched)")
            cases.append((f"allreduce {op} {tag}", out_of_place))

        def in_place():
            x = self.random(dtype, count)
            want = x.clone()
            self.allreduce(x, x, "sum", dtype)
            self.same(x, want, f"allreduce sum in place {tag}")
        cases.append((f"allreduce sum in place {tag}", in_place))

        def broadcast():
            x = self.random(dtype, count)
            want = x.clone()
            req = ctypes.c_void_p()
            self.check(lib.perseus_broadcast_async(self.ptr(x), count, code, 0, self.name("bcast"),
                                                   self.ordinal(x), self.stream_of(x),
                                                   ctypes.byref(req)), f"broadcast {tag}: submit")
            self.finish(req, f"broadcast {tag}")
            self.same(x, want, f"broadcast {tag}")
        cases.append((f"broadcast {tag}", broadcast))

        def held_output(submit, what, x):
            req = ctypes.c_void_p()
            self.check(submit(req), f"{what} {tag}: submit")
            try:
                self.check(lib.perseus_wait(req), f"{what} {tag}: wait")
                counts = (ctypes.c_size_t * 1)()
                self.check(lib.perseus_output_counts(req, counts), f"{what} {tag}: output_counts")
                if counts[0] != count:
                    raise Failure(f"{what} {tag}: output_counts [{counts[0]}], expected [{count}]")
                out = sentinel_like(x)
                self.check(lib.perseus_output_copy(req, self.ptr(out)),
                           f"{what} {tag}: output_copy")
                return out
            finally:
                lib.perseus_release(req)

        def allgatherv():
            x = self.random(dtype, count)
            want = x.clone()
            out = held_output(lambda req: lib.perseus_allgatherv_async(
                self.ptr(x), count, code, self.name("allgatherv"), self.ordinal(x),
                self.stream_of(x), ctypes.byref(req)), "allgatherv", x)
            self.same(out, want, f"allgatherv {tag}")
        cases.append((f"allgatherv {tag}", allgatherv))

        def alltoall():
            x = self.random(dtype, count)
            want = x.clone()
            send_counts = (ctypes.c_size_t * 1)(count)
            out = held_output(lambda req: lib.perseus_alltoall_async(
                self.ptr(x), send_counts, code, self.name("alltoall"), self.ordinal(x),
                self.stream_of(x), ctypes.byref(req)), "alltoall", x)
            self.same(out, want, f"alltoall {tag}")
        cases.append((f"alltoall {tag}", alltoall))

        for op in ("sum", "max"):
            def reducescatter(op=op):
                x = self.random(dtype, count)
                want = x.clone()
                y = sentinel_like(x)
                recv_counts = (ctypes.c_size_t * 1)(count)
                req = ctypes.c_void_p()
                self.check(lib.perseus_reducescatter_async(
                    self.ptr(x), self.ptr(y), recv_counts, code, OPS[op], 1.0, 1.0,
                    self.name("reducescatter"), self.ordinal(x), self.stream_of(x),
                    ctypes.byref(req)), f"reducescatter {op} {tag}: submit")
                self.finish(req, f"reducescatter {op} {tag}")
                self.same(y, want, f"reducescatter {op} {tag}")
            cases.append((f"reducescatter {op} {tag}", reducescatter))
        return cases

    def g_ordering(self):
        torch = self.torch
        cases = []
        count = 1 << 20  # 4 MB of float32

        def case(side_stream, in_place, value):
            def run():
                s = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
                x = torch.zeros(count, dtype=torch.float32, device=self.dev)
                y = x if in_place else torch.full_like(x, -1)
                self.sync()
                with torch.cuda.stream(s):
                    torch.cuda._sleep(200_000_000)  # ~0.1 s on an H200
                    x.fill_(value)
                    rc, req = self.allreduce(x, y, "sum", "float32", stream=s, wait=False)
                    busy = not s.query()  # right after submission, before any wait
                    self.check(rc, "ordering: submit")
                    self.finish(req, "ordering")
                if not busy:
                    raise Failure("ordering: the caller's stream was already idle at submission "
                                  "(the test proves nothing: lengthen the sleep)")
                got = y.float()
                if not bool((got == value).all()):
                    bad = int((got != value).sum())
                    raise Failure(f"ordering ({'side' if side_stream else 'default'} stream, "
                                  f"{'in' if in_place else 'out of'} place): {bad} of {count} "
                                  f"elements are not {value} (first {got[0].item()}): the op did "
                                  "not wait for the caller's stream")
            return run

        for side in (False, True):
            for in_place in (False, True):
                cases.append((f"ordering side={side} in_place={in_place}",
                              case(side, in_place, 3.0 + 2 * side + in_place)))

        def later_work_sees_result():
            # After perseus_wait, work queued on the caller's stream reads the result.
            x = torch.full((count,), 5.0, device=self.dev)
            y = torch.zeros_like(x)
            self.sync()
            torch.cuda._sleep(50_000_000)
            self.allreduce(x, y, "sum", "float32")
            z = y * 2
            if not bool((z == 10.0).all()):
                raise Failure("after wait: the stream's later work read a stale result")
        cases.append(("later work after wait", later_work_sees_result))
        return self.run_cases(cases)

    def g_fusion(self, timeline):
        torch, lib = self.torch, self.lib
        cases = []
        names = []

        def fusion():
            tensors, wants, reqs = [], [], []
            for i in range(100):
                count = 1 + 37 * i % 500
                x = torch.arange(count, dtype=torch.float32, device=self.dev) + 1000 * i
                tensors.append((x, torch.full_like(x, -1)))
                wants.append(x.clone())
            for i, (x, y) in enumerate(tensors):
                n = f"fusion.{i}".encode()
                names.append(n.decode())
                rc, req = self.allreduce(x, y, "sum", "float32", name=n, wait=False)
                self.check(rc, f"fusion: submit {i}")
                reqs.append(req)
            errors = []
            for i, req in enumerate(reqs):
                rc = lib.perseus_wait(req)
                if rc != SUCCESS:
                    errors.append(f"fusion.{i}: wait {rc}: {self.last_error()}")
                lib.perseus_release(req)
            if errors:
                raise Failure("; ".join(errors[:5]))
            for i, ((x, y), want) in enumerate(zip(tensors, wants)):
                self.same(y, want, f"fusion tensor {i} ({x.numel()} elements)")
        cases.append(("fusion of 100", fusion))
        self.fusion_names = names  # counted in the timeline after perseus_finalize closes it
        return self.run_cases(cases)

    def g_errors(self):
        torch, lib = self.torch, self.lib
        cases = []
        dev = self.dev.index

        def expect(rc, words, what):
            msg = self.last_error()
            if rc != INVALID_ARGUMENT:
                raise Failure(f"{what}: returned {rc}, expected PERSEUS_ERROR_INVALID_ARGUMENT (-1)"
                              f"; message: {msg!r}")
            for w in words:
                if w not in msg:
                    raise Failure(f"{what}: the message does not say {w!r}: {msg!r}")
            self.messages.append(f"{what}: {msg}")

        self.messages = []

        def host_pointer(pinned, which):
            def run():
                h = torch.ones(1000, dtype=torch.float32, pin_memory=pinned)
                d = torch.ones(1000, dtype=torch.float32, device=self.dev)
                send, recv = (h, d) if which == "send" else (d, h)
                req = ctypes.c_void_p()
                rc = lib.perseus_allreduce_async(
                    self.ptr(send), self.ptr(recv), 1000, DTYPE_CODE["float32"], 0, 1.0, 1.0,
                    self.name("err"), dev, None, ctypes.byref(req))
                if rc == SUCCESS:
                    lib.perseus_wait(req)
                    lib.perseus_release(req)
                expect(rc, [f"{which} buffer", "host memory"],
                       f"{'pinned' if pinned else 'pageable'} host {which} with device {dev}")
            return run

        for pinned in (False, True):
            for which in ("send", "recv"):
                cases.append((f"host {which} pinned={pinned}", host_pointer(pinned, which)))

        def other_ops_host_pointer():
            h = torch.ones(1000, dtype=torch.float32)
            req = ctypes.c_void_p()
            rc = lib.perseus_broadcast_async(self.ptr(h), 1000, DTYPE_CODE["float32"], 0,
                                             self.name("err"), dev, None, ctypes.byref(req))
            if rc == SUCCESS:
                lib.perseus_wait(req)
                lib.perseus_release(req)
            expect(rc, ["host memory"], f"broadcast of a host buffer with device {dev}")
            rc = lib.perseus_allgatherv_async(self.ptr(h), 1000, DTYPE_CODE["float32"],
                                              self.name("err"), dev, None, ctypes.byref(req))
            if rc == SUCCESS:
                lib.perseus_wait(req)
                lib.perseus_release(req)
            expect(rc, ["host memory"], f"allgatherv of a host buffer with device {dev}")
        cases.append(("broadcast/allgatherv host pointer", other_ops_host_pointer))

        def device_pointer_as_host():
            # A CUDA tensor passed as PERSEUS_DEVICE_CPU must be refused, not read by Gloo.
            d = torch.ones(1000, dtype=torch.float32, device=self.dev)
            req = ctypes.c_void_p()
            rc = lib.perseus_allreduce_async(self.ptr(d), self.ptr(d), 1000,
                                             DTYPE_CODE["float32"], 0, 1.0, 1.0,
                                             self.name("err"), -1, None, ctypes.byref(req))
            if rc == SUCCESS:
                lib.perseus_wait(req)
                lib.perseus_release(req)
            expect(rc, ["send buffer", "PERSEUS_DEVICE_CPU"],
                   "a device tensor passed as PERSEUS_DEVICE_CPU")
        cases.append(("device pointer as host", device_pointer_as_host))

        def scale(prescale, postscale):
            def run():
                x = torch.ones(1000, dtype=torch.float32, device=self.dev)
                rc, req = self.allreduce(x, x, "sum", "float32", prescale=prescale,
                                         postscale=postscale, wait=False)
                if rc == SUCCESS:
                    lib.perseus_wait(req)
                    lib.perseus_release(req)
                expect(rc, ["prescale"], f"allreduce on device with prescale {prescale} "
                                         f"postscale {postscale}")
                # nothing happened to the tensor
                if not bool((x == 1).all()):
                    raise Failure("a refused allreduce changed its tensor")
            return run
        cases.append(("prescale 2", scale(2.0, 1.0)))
        cases.append(("postscale 0.5", scale(1.0, 0.5)))

        def reducescatter_prescale():
            x = torch.ones(1000, dtype=torch.float32, device=self.dev)
            y = torch.zeros_like(x)
            rc_counts = (ctypes.c_size_t * 1)(1000)
            req = ctypes.c_void_p()
            rc = lib.perseus_reducescatter_async(self.ptr(x), self.ptr(y), rc_counts,
                                                 DTYPE_CODE["float32"], 0, 2.0, 1.0,
                                                 self.name("err"), dev, None, ctypes.byref(req))
            if rc == SUCCESS:
                lib.perseus_wait(req)
                lib.perseus_release(req)
            expect(rc, ["prescale"], "reducescatter on device with prescale 2")
        cases.append(("reducescatter prescale 2", reducescatter_prescale))

        def wrong_ordinal():
            x = torch.ones(1000, dtype=torch.float32, device=self.dev)
            req = ctypes.c_void_p()
            rc = lib.perseus_allreduce_async(self.ptr(x), self.ptr(x), 1000, DTYPE_CODE["float32"],
                                             0, 1.0, 1.0, self.name("err"), dev + 1, None,
                                             ctypes.byref(req))
            if rc == SUCCESS:
                lib.perseus_wait(req)
                lib.perseus_release(req)
            expect(rc, ["device"], f"a tensor of device {dev} given as device {dev + 1}")
        cases.append(("wrong ordinal", wrong_ordinal))

        def still_usable():
            x = self.random("float32", 1001)
            want = x.clone()
            self.allreduce(x, x, "sum", "float32")
            self.same(x, want, "an allreduce after the refused calls")
        cases.append(("usable after errors", still_usable))
        return self.run_cases(cases)

    def g_fp16(self):
        torch = self.torch
        cases = []
        for half, code in (("float16", "float16"), ("bfloat16", "bfloat16")):
            for count in (1, 1001, 1 << 20):
                def run(half=half, code=code, count=count):
                    x = torch.randn(count, dtype=torch.float32, device=self.dev) * 10
                    h = x.to(getattr(torch, half))
                    self.allreduce(h, h, "sum", code)
                    back = h.float()
                    want = x.to(getattr(torch, half)).float()
                    self.same(back, want, f"{half} round trip x{count}")
                    tol = 1e-3 if half == "float16" else 8e-3
                    rel = ((back - x).abs() / x.abs().clamp_min(1e-3)).max().item()
                    if rel > tol:
                        raise Failure(f"{half} round trip x{count}: relative error {rel} > {tol}")
                cases.append((f"{half} round trip x{count}", run))
        return self.run_cases(cases)

    def g_mixed(self):
        torch, lib = self.torch, self.lib
        cases = []

        def mixed():
            # host (Gloo) and device (NCCL) requests in flight together, then a blocking host call
            hx = torch.arange(1000, dtype=torch.float64)
            dx = torch.arange(1000, dtype=torch.float64, device=self.dev)
            hy, dy = torch.zeros_like(hx), torch.zeros_like(dx)
            r1 = self.allreduce(hx, hy, "sum", "float64", wait=False)
            r2 = self.allreduce(dx, dy, "sum", "float64", wait=False)
            for rc, req in (r1, r2):
                self.check(rc, "mixed: submit")
            for rc, req in (r1, r2):
                self.finish(req, "mixed")
            self.same(hy, hx, "mixed: host allreduce")
            self.same(dy, dx, "mixed: device allreduce")
            z = torch.ones(10, dtype=torch.int32)
            self.check(lib.perseus_allreduce(self.ptr(z), self.ptr(z), 10, DTYPE_CODE["int32"], 0,
                                             None), "mixed: blocking host allreduce")
            self.same(z, torch.ones(10, dtype=torch.int32), "mixed: blocking host allreduce")
        cases.append(("host and device together", mixed))
        return self.run_cases(cases)


def count_calls(timeline, names):
    """Distinct NCCL_ALLREDUCE (GLOO_ALLREDUCE on host) spans (by start time) that carried the given tensors."""
    try:
        text = open(timeline).read().rstrip().rstrip(",")
        if not text.endswith("]"):
            text += "]"
        events = json.loads(text)
    except (OSError, ValueError):
        return None
    # Rows are named by tensor (metadata events map pid/tid to names).
    rows = {}
    for e in events:
        if e.get("ph") == "M" and e.get("args", {}).get("name") in names:
            rows[e.get("pid")] = e["args"]["name"]
    starts = set()
    for e in events:
        if e.get("name") in ("NCCL_ALLREDUCE", "GLOO_ALLREDUCE") and e.get("pid") in rows:
            starts.add(e.get("ts"))
    return len(starts) if rows else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="host memory (Gloo): check the script")
    parser.add_argument("--quick", action="store_true", help="sizes 0, 1, 1001 only")
    parser.add_argument("--json", help="write the groups' results here")
    args = parser.parse_args()

    timeline = os.environ.get("PERSEUS_TIMELINE")
    if not timeline:
        scratch = tempfile.mkdtemp(prefix="perseus_gpu_ops_")
        atexit.register(shutil.rmtree, scratch, True)  # the timeline is ours alone
        timeline = os.path.join(scratch, "timeline.json")
        os.environ["PERSEUS_TIMELINE"] = timeline  # read by perseus_init
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    import torch
    lib, path = load_library()
    if args.cpu:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_ops_test: torch sees no CUDA device (use --cpu to check the script)")
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(6)
    v = lib.perseus_version()
    print(f"# gpu_ops_test: libperseus {v // 10000}.{v // 100 % 100}.{v % 100} ({path}), "
          f"nccl_built {lib.perseus_nccl_built()}, gloo_built {lib.perseus_gloo_built()}, "
          f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda})"
             if device.type == "cuda" else ""), flush=True)
    rc = lib.perseus_init()
    if rc != SUCCESS:
        sys.exit(f"gpu_ops_test: perseus_init returned {rc}: {lib.perseus_last_error().decode()}")

    suite = Suite(lib, torch, device)
    sizes = [0, 1, 1001] + ([] if args.quick else ["4MB"])
    suite.group("built", suite.g_built)
    suite.group(f"ops (9 ops x 8 dtypes x sizes {sizes}, 11 cases each)",
                lambda: suite.g_ops(sizes))
    if device.type == "cuda":
        suite.group("ordering with a busy caller stream", suite.g_ordering)
    suite.group("fusion of 100 small tensors", lambda: suite.g_fusion(timeline))
    if device.type == "cuda":
        suite.group("device-memory errors", suite.g_errors)
        for m in suite.messages:
            print(f"    message: {m}")
    suite.group("fp16/bf16 round trip (torch casts)", suite.g_fp16)
    if device.type == "cuda":
        suite.group("host and device ops in one rank", suite.g_mixed)

    rc = lib.perseus_finalize()
    if rc != SUCCESS:
        print(f"[FAIL] finalize: {rc}: {suite.last_error()}")
        suite.failed = True
    calls = None
    if os.path.exists(timeline) and getattr(suite, "fusion_names", None):
        calls = count_calls(timeline, set(suite.fusion_names))
    print(f"# fusion: the 100 tensors went in {calls if calls is not None else '?'} "
          f"all-reduce call(s) (timeline {timeline})")
    total_pass = sum(g["passed"] for g in suite.groups)
    total_fail = sum(g["failed"] for g in suite.groups)
    print(f"# total: {total_pass} passed, {total_fail} failed -> "
          f"{'FAIL' if suite.failed else 'PASS'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(groups=suite.groups, fusion_calls=calls, device=str(device),
                           torch=torch.__version__, failed=suite.failed), f, indent=1)
    sys.exit(1 if suite.failed else 0)


if __name__ == "__main__":
    main()
