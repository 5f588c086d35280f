"""perseus.torch (lib/framework_shims) end to end: the rank scripts in ranks/ run under the
built perseusrun with 2 and 3 ranks on CPU tensors, with the system's torch (/usr/bin/python3).

CTest sets PERSEUSRUN, LIBPERSEUS and PYTHONPATH (to lib/framework_shims); run by hand they
default to <repo>/build and <repo>/lib/framework_shims. SHIMS_PYTHON picks the interpreter.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(BUILD / "apps/perseusrun/perseusrun")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(BUILD / "lib/comm/libperseus.so")
SHIMS = str(REPO / "lib/framework_shims")
PYTHON = os.environ.get("SHIMS_PYTHON") or "/usr/bin/python3"
RANKS = Path(__file__).resolve().parent / "ranks"
TIMEOUT = float(os.environ.get("SHIMS_TIMEOUT", "180"))

_SCRUB = re.compile(r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|SLURM_)")

try:
    subprocess.run([PYTHON, "-c", "import torch"], check=True, capture_output=True, timeout=120)
except (OSError, subprocess.SubprocessError):
    pytest.skip("%s cannot import torch" % PYTHON, allow_module_level=True)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
    env["PYTHONPATH"] = os.pathsep.join(
        [SHIMS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                   if p and p != SHIMS])
    env["PERSEUS_LIBRARY"] = LIBPERSEUS
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_ranks(n, script, *args, env=None):
    cmd = [PERSEUSRUN, "-np", str(n), "-H", "localhost:%d" % n, PYTHON, str(RANKS / script)]
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, errors="replace",
                          timeout=TIMEOUT, env=env or clean_env(), stdin=subprocess.DEVNULL)
    return proc


def show(proc):
    return "exit %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
        proc.returncode, proc.stdout[-6000:], proc.stderr[-6000:])


def passed_per_rank(proc, label):
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r"^\[1,(\d+)\]<stdout>:%s: (\d+) checks passed" % label, proc.stdout, re.M)}


def expect_all_passed(proc, n, label):
    assert proc.returncode == 0, show(proc)
    passed = passed_per_rank(proc, label)
    assert sorted(passed) == list(range(n)), show(proc)
    assert len(set(passed.values())) == 1 and passed[0] > 0, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_horovod_api(n):
    expect_all_passed(run_ranks(n, "api.py"), n, "api")


@pytest.mark.parametrize("n", [3, 4])
def test_process_sets(n):
    # add_process_set, process_set= on allreduce/allgather/broadcast (all forms), global
    # operations in between, an outsider refused. 3 ranks: sets {0, 2} and {1}.
    expect_all_passed(run_ranks(n, "process_sets.py"), n, "process_sets")


@pytest.mark.parametrize("n", [2, 3])
def test_training_matches_one_process(n):
    # DistributedOptimizer (plain, groups, predivide, backward_passes_per_step, fp16, Sum),
    # broadcast_parameters/optimizer_state of a checkpoint only rank 0 loaded, SyncBatchNorm.
    expect_all_passed(run_ranks(n, "train.py"), n, "train")


@pytest.mark.parametrize("bucket_bytes", ["0", "300"])
def test_training_with_other_gradient_buckets(bucket_bytes):
    # PERSEUS_GRADIENT_BUCKET_BYTES=0: one all-reduce per parameter (Horovod's submission);
    # 300: buckets of a few small gradients each, most parameters alone. Same results.
    env = clean_env(PERSEUS_GRADIENT_BUCKET_BYTES=bucket_bytes)
    expect_all_passed(run_ranks(2, "train.py", env=env), 2, "train")


_BUCKET_PLAN = r"""
import torch
from perseus.torch import _buckets, _grad, compression as c
f32 = lambda n: torch.nn.Parameter(torch.zeros(n))
f64 = lambda n: torch.nn.Parameter(torch.zeros(n, dtype=torch.float64))
params = [f32(10), f64(3), f32(30), f32(20), f64(5), f32(100), f32(1)]  # 40, 24, 120, 80 ...
names = {p: "allreduce.p%d" % i for i, p in enumerate(params)}
buckets = _buckets.plan(params, 200, names)
index = {id(p): i for i, p in enumerate(params)}
got = [[index[id(p)] for p in b.params] for b in buckets]
# reversed: p6 p5 (4 + 400 > 200: p6 alone, then p5 alone) p3 p2 (80 + 120 = 200) p0 ...
assert got == [[3, 2], [4, 1]], got
assert [b.name for b in buckets] == ["allreduce.p3+1", "allreduce.p4+1"], buckets
whole = _buckets.plan(params, 1 << 20, names)
assert [[index[id(p)] for p in b.params] for b in whole] == [[6, 5, 3, 2, 0], [4, 1]], whole
# The bucket holding the first-registered parameter (p0) is the one submitted at synchronize();
# at 200 bytes p0 is alone, so no bucket is.
assert [b.last for b in whole] == [True, False] and not any(b.last for b in buckets)
for comp in (c.Compression.none, c.Compression.fp16, c.Compression.bf16,
             c.FP32ToFP16Compressor, c.FP32ToBF16Compressor):
    assert _buckets.elementwise(comp), comp
class Mine(c.FP16Compressor):
    @classmethod
    def compress(cls, tensor):
        return tensor.to(torch.float16), tensor.dtype
assert not _buckets.elementwise(Mine) and not _buckets.elementwise(c.Compressor)
import os
os.environ["PERSEUS_GRADIENT_BUCKET_BYTES"] = "4MB"
try:
    _grad.bucket_bytes()
except Exception as e:
    assert "PERSEUS_GRADIENT_BUCKET_BYTES=4MB" in str(e) and "whole number" in str(e), e
else:
    raise AssertionError("4MB accepted")
print("ok")
"""


_HOST_PACK = r"""
import torch
from perseus.torch import _buckets
shapes = [(3, 5, 7), (1,), (2, 1, 9), (11, 13), (0, 4), (5,)]
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]
for dtype in dtypes:
    params = [torch.zeros(s, dtype=dtype) for s in shapes]
    bucket = _buckets.Bucket(params, "b")
    g = torch.Generator().manual_seed(1)
    grads = [(torch.randn(s, generator=g) * 50).to(dtype) for s in shapes]
    flat = bucket.flatten(grads)
    assert flat is bucket.buffer and flat.dtype == dtype, (dtype, flat)
    assert torch.equal(flat, torch.cat([t.reshape(-1) for t in grads])), dtype
    result = (torch.arange(flat.numel()) % 7).to(dtype)
    bucket.scatter(result, grads)  # another tensor: copied into the buffer, then unpacked
    assert torch.equal(torch.cat([t.reshape(-1) for t in grads]), result), dtype
# What the host path refuses (torch copies instead, with the same results): a None among the
# tensors, a non-contiguous one, another dtype, sizes that do not add up to the buffer.
buffer = torch.zeros(12)
ok = [torch.ones(3, 2), torch.ones(6)]
addresses, sizes = _buckets._host_pieces(buffer, ok)
assert list(sizes) == [24, 24] and list(addresses) == [t.data_ptr() for t in ok], (addresses, sizes)
for bad in ([None, torch.ones(6)], [torch.ones(2, 3).t(), torch.ones(6)],
            [torch.ones(6, dtype=torch.float64), torch.ones(6)], [torch.ones(6), torch.ones(5)]):
    assert _buckets._host_pieces(buffer, bad) is None, bad
params = [torch.zeros(2, 3), torch.zeros(4)]
bucket = _buckets.Bucket(params, "b")
grads = [torch.arange(6.).reshape(3, 2).t(), torch.arange(4.) + 10]  # the first non-contiguous
assert torch.equal(bucket.flatten(grads), torch.tensor([0., 2, 4, 1, 3, 5, 10, 11, 12, 13]))
bucket.scatter(torch.arange(10.) * 2, [grads[0], None])  # None: skipped, as a sparse gradient
assert torch.equal(grads[0], (torch.arange(6.) * 2).reshape(2, 3)) and grads[1][0] == 10, grads
from perseus import _native
import array
try:
    _native.host_pack(buffer.data_ptr(), array.array("Q", [1, 2]), array.array("Q", [4]))
except ValueError as e:
    assert "2 addresses and 1 sizes" in str(e), e
else:
    raise AssertionError("mismatched lengths accepted")
print("ok")
"""


def test_host_bucket_pack():
    # A host bucket is packed and unpacked by libperseus (perseus_host_pack/unpack): every
    # dtype, odd 3-D and empty shapes, in order; a None, non-contiguous, other-dtype or
    # mis-sized tensor goes to torch's copies instead, with the same results.
    proc = subprocess.run([PYTHON, "-c", _HOST_PACK], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert proc.returncode == 0 and "ok" in proc.stdout, show(proc)


def test_gradient_bucket_plan():
    # The plan is a pure function of the parameters' order, dtypes and sizes (the same on every
    # rank); a compressor that is not a cast keeps one all-reduce per parameter; a bad size is
    # refused by name.
    proc = subprocess.run([PYTHON, "-c", _BUCKET_PLAN], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert proc.returncode == 0 and "ok" in proc.stdout, show(proc)


_DEVICE_AVERAGE = r"""
import torch
from perseus.torch import ops
class Cuda:  # what _device_scales reads of a CUDA tensor (no GPU here)
    is_cuda = True
cpu = torch.zeros(1)
asked = []
def members(n):
    return lambda: asked.append(n) or n
# A CUDA Average over 3 ranks: libperseus sums, torch divides by 3 after.
assert ops._device_scales(Cuda, ops.Average, 1.0, 1.0, members(3)) == (ops.Sum, False, 1.0, 3)
# One rank, or host memory: libperseus's own Average, nothing after; members not asked on CPU.
assert ops._device_scales(Cuda, ops.Average, 1.0, 1.0, members(1)) == (ops.Average, False, 1.0, 0)
asked.clear()
assert ops._device_scales(cpu, ops.Average, 1.0, 1.0, members(3)) == (ops.Average, False, 1.0, 0)
assert asked == [], asked
# Scale factors: Horovod's single rounding, the postscale divided by the ranks.
assert ops._device_scales(Cuda, ops.Average, 0.5, 3.0, members(3)) == (ops.Sum, True, 1.0, 0)
assert ops._device_scales(cpu, ops.Sum, 0.5, 3.0, members(3)) == (ops.Sum, False, 3.0, 0)
# The division: a sum that cancels stays exactly 0 (ncclAvg gave 2.98e-08); one rounding;
# integers toward zero.
f = ops._device_average_(torch.tensor([0.0, 7.0, -7.0]), 3)
assert f[0].item() == 0.0 and torch.equal(f, torch.tensor([0.0, 7.0, -7.0]) / 3), f
i = ops._device_average_(torch.tensor([7, -7, 6], dtype=torch.int32), 3)
assert i.tolist() == [2, -2, 2] and i.dtype == torch.int32, i
print("ok")
"""


def test_gpu_average_is_a_sum_that_torch_divides():
    # The decision and the division behind an Average of CUDA tensors, checked here without a
    # GPU; tests/gpu/gpu_conformance_test.py checks the results on CUDA with 1-3 ranks.
    proc = subprocess.run([PYTHON, "-c", _DEVICE_AVERAGE], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert proc.returncode == 0 and "ok" in proc.stdout, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_through_perseus(n):
    expect_all_passed(run_ranks(n, "ddp.py", "on"), n, "ddp")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_grouped_allreduce_in_one_call_equals_one_call_a_tensor(n):
    # grouped_allreduce of host tensors goes to libperseus in one call: every dtype, odd
    # shapes, every op, scale factors, in place, unnamed, in a process set, one rank on the
    # call-a-tensor path, and misuse (a name twice, a shape or dtype differing on one rank, a
    # tensor not contiguous) raised on every rank.
    expect_all_passed(run_ranks(n, "grouped.py"), n, "grouped")


@pytest.mark.parametrize("n", [2, 3])
def test_compression_and_nancheck(n):
    # PERSEUS_ALLREDUCE_DTYPE=fp16|bf16 and Compression.bf16 in DistributedOptimizer and the DDP
    # hook; PERSEUS_ALLREDUCE_NANCHECK=1 naming the tensor, parameter or DDP bucket.
    expect_all_passed(run_ranks(n, "compress.py"), n, "compress")


def test_ddp_off_with_perseus_ddp_0():
    expect_all_passed(run_ranks(2, "ddp.py", "off", env=clean_env(PERSEUS_DDP="0")), 2, "ddp")


def test_import_perseus_does_not_import_torch():
    code = ("import sys, perseus; assert 'torch' not in sys.modules, 'torch imported'; "
            "import torch.nn.parallel as p; "
            "assert p.DistributedDataParallel._perseus_patched; print('ok')")
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=clean_env(),
                          timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_through_perseus_under_torchrun(n):
    # Started by torch's own launcher (python -m torch.distributed.run, i.e. torchrun): no
    # perseusrun variables, so `import perseus` joins through torch.distributed's store
    # (perseus_serve_rendezvous / perseus_init_with) and the buckets still go through Perseus.
    # --redirects/--tee 1: Debian's torch 1.13 launcher fails on Python 3.11 with its default
    # (its Std enum lookup misses 0, "none"); 1 sends stdout through with a [defaultR]: prefix.
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           "--redirects", "1", "--tee", "1", str(RANKS / "ddp.py"), "on"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT,
                          env=clean_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^(?:\[default\d+\]:)?ddp: (\d+) checks passed$", proc.stdout, re.M)
    assert len(passed) == n and len(set(passed)) == 1 and int(passed[0]) > 0, show(proc)
    assert "perseus:" not in proc.stderr, show(proc)  # no "keeps torch's all-reduce" warning


def test_ddp_without_any_launcher_single_process(tmp_path):
    # One process, its own torch.distributed group of one: Perseus joins through its store too.
    script = tmp_path / "one.py"
    script.write_text(
        "import perseus, os, torch, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))\n"
        "m(torch.ones(3, 2)).sum().backward()\n"
        "assert perseus.ddp_stats()['models'] == 1, perseus.ddp_stats()\n"
        "del m\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120,
                          env=clean_env(PORT=str(port)))
    assert proc.returncode == 0 and "ok" in proc.stdout, show(proc)
    assert "perseus:" not in proc.stderr, show(proc)


def alone_env(**extra):
    """clean_env without torchrun's variables either: a process that no launcher started."""
    env = clean_env(**extra)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "TORCHELASTIC_RUN_ID"):
        if name not in extra:
            env.pop(name, None)
    return env


def test_horovod_api_alone_is_a_job_of_one():
    # `python script.py`, no launcher: rank 0 of 1; every op on every dtype and odd shapes gives
    # its input back (on CUDA too where there is a GPU), a process set of [0], join, init again.
    proc = subprocess.run([PYTHON, str(RANKS / "alone.py")], capture_output=True, text=True,
                          errors="replace", timeout=TIMEOUT, env=alone_env(),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, show(proc)
    passed = re.findall(r"^alone: (\d+) checks passed$", proc.stdout, re.M)
    assert len(passed) == 1 and int(passed[0]) > 1000, show(proc)
    assert "perseus:" not in proc.stderr, show(proc)


def run_as_pods(n, script, *args, timeout=None):
    """Kubeflow's PyTorchJob: each "pod" is started with only torch's variables (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no LOCAL_RANK, no launcher). Returns each process's
    (exit status, stdout, stderr)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([PYTHON, str(RANKS / script), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, errors="replace",
                              stdin=subprocess.DEVNULL,
                              env=alone_env(RANK=str(r), WORLD_SIZE=str(n),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(n)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout or TIMEOUT)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.parametrize("script,label,args", [("api.py", "api", ()), ("ddp.py", "ddp", ("on",))])
def test_pytorchjob_pods_join_through_torchs_store(script, label, args):
    # The Horovod API (hvd.init() with no process group) and `import perseus` DDP (after the
    # script's own init_process_group): both meet through a TCPStore at MASTER_ADDR:MASTER_PORT.
    results = run_as_pods(4, script, *args)
    shown = "\n".join("--- rank %d: exit %s\n%s\n%s" % (r, rc, out[-3000:], err[-3000:])
                      for r, (rc, out, err) in enumerate(results))
    assert all(rc == 0 for rc, _, _ in results), shown
    passed = [re.findall(r"^%s: (\d+) checks passed" % label, out, re.M) for _, out, _ in results]
    assert all(len(p) == 1 for p in passed) and len({p[0] for p in passed}) == 1, shown
    assert int(passed[0][0]) > 0, shown
    assert not any("keeps torch" in err for _, _, err in results), shown


def test_torchrun_variables_without_perseusrun_are_refused_by_name():
    code = "import perseus.torch as hvd\ntry:\n    hvd.init()\nexcept hvd.PerseusError as e:\n" \
           "    print('error:', e)\n"
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                          env=alone_env(RANK="1", WORLD_SIZE="2"))
    assert "perseus_init: PERSEUS_RENDEZVOUS_ADDR is not set" in proc.stdout, show(proc)
    assert "(RANK=1, WORLD_SIZE=2)" in proc.stdout, show(proc)


def test_missing_library_is_a_clear_error():
    code = "import perseus.torch as hvd\ntry:\n    hvd.init()\nexcept hvd.PerseusError as e:\n" \
           "    print('error:', e)\n"
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env(PERSEUS_LIBRARY="/nonexistent/libperseus.so"))
    assert "error: could not load libperseus" in proc.stdout, show(proc)


def test_import_perseus_makes_other_ranks_wait_for_rank_0s_store():
    # torch's TCPStore client retries a refused connection only a second later; after
    # `import perseus` the env:// rendezvous of a rank other than 0 first waits, looking every few
    # milliseconds, until MASTER_PORT takes a connection (rank 0 does not wait).
    code = r"""
import os, socket, threading, time
import perseus, torch
import sys, torch.distributed
rendezvous = sys.modules["torch.distributed.rendezvous"]
from perseus import _ddp
print("patched", getattr(rendezvous._rendezvous_handlers["env"], "_perseus_patched", False))
server = socket.socket()
server.bind(("127.0.0.1", 0))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.getsockname()[1]))
accepted = []
def listen_later():
    time.sleep(0.3)
    server.listen(4)
    accepted.append(server.accept()[0])
threading.Thread(target=listen_later, daemon=True).start()
os.environ["RANK"] = "0"
_ddp._wait_for_master("env://", None)
print("rank 0 connected", bool(accepted))
_ddp._wait_for_master("env://?rank=1&world_size=2", None)
time.sleep(0.1)
print("rank 1 connected", bool(accepted))
"""
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.stdout.split("\n")[:3] == ["patched True", "rank 0 connected False",
                                           "rank 1 connected True"], show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_horovod_conformance(n):
    # Shapes that differ between ranks are refused everywhere and the job goes on; a name in
    # flight raises ValueError at once; join with allgather/broadcast; averaged gradients of
    # allgather and broadcast; int16; a deadlock ended on every rank.
    expect_all_passed(run_ranks(n, "conformance.py", env=clean_env(PERSEUS_DEADLOCK_SECONDS="2")),
                      n, "conformance")


def test_duplicate_parameter_names_are_named_with_the_fix():
    # Two models' named_parameters merged: the same names twice. The error names them (the
    # first five, then how many more) and says to prefix them; prefixed, the optimizer works.
    code = """if True:
        import torch, perseus.torch as hvd
        hvd.init()
        a, b = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)
        params = list(a.parameters()) + list(b.parameters())
        def make(named, ps=params):
            return hvd.DistributedOptimizer(torch.optim.SGD(ps, lr=0.1), named_parameters=named)
        try:
            make(list(a.named_parameters()) + list(b.named_parameters()))
        except ValueError as e:
            print("error 1:", e)
        wide = [torch.nn.Linear(1, 1, bias=False) for _ in range(7)]
        ps = [m.weight for m in wide]
        try:
            make([("w%d" % (i % 7), p) for i, p in enumerate(ps + ps)], ps + ps)
        except ValueError as e:
            print("error 2:", e)
        opt = make([("a." + n, p) for n, p in a.named_parameters()] +
                   [("b." + n, p) for n, p in b.named_parameters()])
        (a(torch.ones(4, 2)).sum() + b(torch.ones(4, 2)).sum()).backward()
        opt.step()
        print("prefixed: ok")
        """
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                          env=alone_env())
    assert proc.returncode == 0, show(proc)
    first = re.search(r"^error 1: (.*)$", proc.stdout, re.M).group(1)
    assert first.startswith("named_parameters has 2 duplicate name(s): 'weight', 'bias'. "), \
        show(proc)
    assert "prefix each model's names" in first and "('a.' + n, p)" in first, show(proc)
    second = re.search(r"^error 2: (.*)$", proc.stdout, re.M).group(1)
    assert "has 7 duplicate name(s): 'w0', 'w1', 'w2', 'w3', 'w4' and 2 more. " in second, \
        show(proc)
    assert "prefixed: ok" in proc.stdout, show(proc)


@pytest.mark.parametrize("n", [2, 3])
def test_elastic_state_objects(n):
    # hvd.elastic's ObjectState, TorchState, ElasticSampler and run() in a job whose world never
    # changes (tests/blackbox/test_elastic_in_place.py changes it).
    expect_all_passed(run_ranks(n, "elastic_state.py"), n, "elastic_state")
