"""The GPU machine's scripts, checked on this machine's CPU so that they do not rot between the
(rare) runs on a GPU: each runs under the built perseusrun with host tensors (--cpu: Gloo
instead of NCCL), and scripts/gpu/as_simulated_host.sh lays ranks out on simulated hosts.

CTest sets PERSEUSRUN and LIBPERSEUS; skipped when /usr/bin/python3 has no torch.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(ROOT / "build/apps/perseusrun/perseusrun")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(ROOT / "build/lib/comm/libperseus.so")
PYTHON = "/usr/bin/python3"
_SCRUB = re.compile(r"\A(OMPI_|PMIX_|PMI_|HOROVOD_|PERSEUS_|SLURM_|NCCL_)")

pytestmark = pytest.mark.skipif(
    subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="no torch for /usr/bin/python3")


def run(args, timeout=300):
    env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
    env["PERSEUS_LIBRARY"] = LIBPERSEUS
    proc = subprocess.run([PERSEUSRUN] + args, capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)
    return proc


def show(proc):
    return "exit %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
        proc.returncode, proc.stdout[-5000:], proc.stderr[-5000:])


def passed_per_rank(proc):
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^\[1,(\d+)\]<stdout>:rank \d+ of \d+: (\d+) of (\d+) checks passed", proc.stdout, re.M)}


def test_multirank_script_three_ranks():
    proc = run(["-np", "3", "-H", "localhost:3", PYTHON, "tests/gpu/gpu_multirank_test.py",
                "--expect", "flat", "--cpu"])
    assert proc.returncode == 0, show(proc)
    counts = passed_per_rank(proc)
    assert sorted(counts) == [0, 1, 2], show(proc)
    assert all(p == t and t > 500 for p, t in counts.values()), show(proc)


@pytest.mark.parametrize("hosts", ["2,2", "3,1"])
def test_multirank_script_on_simulated_hosts(hosts):
    # The wrapper's place variables must agree with what libperseus checks at init.
    n = sum(int(h) for h in hosts.split(","))
    proc = run(["-np", str(n), "-H", "localhost:%d" % n, "--gpu-bind", "none",
                "-x", "PERSEUS_HIERARCHICAL_ALLREDUCE=1", "scripts/gpu/as_simulated_host.sh",
                hosts, PYTHON, "tests/gpu/gpu_multirank_test.py", "--expect", "flat", "--cpu"])
    assert proc.returncode == 0, show(proc)
    assert sorted(passed_per_rank(proc)) == list(range(n)), show(proc)


def test_simulated_host_layout_is_refused_when_it_does_not_add_up():
    proc = run(["-np", "2", "-H", "localhost:2", "--gpu-bind", "none",
                "scripts/gpu/as_simulated_host.sh", "2,2", "true"])
    assert proc.returncode == 2, show(proc)
    assert "SIZES adds up to 4 ranks but the job has 2" in proc.stderr, show(proc)


def test_ops_script_one_rank():
    proc = run(["-np", "1", "-H", "localhost:1", PYTHON, "tests/gpu/gpu_ops_test.py", "--cpu",
                "--quick"])
    assert proc.returncode == 0, show(proc)
    assert re.search(r"# total: \d+ passed, 0 failed -> PASS", proc.stdout), show(proc)


def test_torch_script_one_rank():
    # Every group of the CUDA script (Horovod's API, process sets, DistributedOptimizer,
    # SyncBatchNorm, compression, the NaN check, `import perseus` DDP) on host tensors.
    proc = run(["-np", "1", "-H", "localhost:1", PYTHON, "tests/gpu/torch_gpu_test.py", "--cpu"])
    assert proc.returncode == 0, show(proc)
    groups = dict(re.findall(r"^\[1,0\]<stdout>:(\w+) +(\d+) passed, 0 failed", proc.stdout,
                             re.M))
    assert sorted(groups) == sorted(["ops", "procset", "optimizer", "syncbn", "compress",
                                     "nancheck", "ddp"]), show(proc)
    assert all(int(n) > 0 for n in groups.values()), show(proc)
    assert re.search(r"^\[1,0\]<stdout>:torch_gpu: \d+ checks passed$", proc.stdout, re.M), \
        show(proc)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_conformance_script(n):
    # Every op x dtype x size x dimensions against torch, on host tensors here.
    proc = run(["-np", str(n), "-H", "localhost:%d" % n, PYTHON,
                "tests/gpu/gpu_conformance_test.py", "--cpu", "--quick"])
    assert proc.returncode == 0, show(proc)
    totals = re.findall(r"^\[1,\d+\]<stdout>:rank \d+ of \d+ on cpu: (\d+) passed, 0 failed -> PASS$",
                        proc.stdout, re.M)
    assert len(totals) == n and all(int(t) > 1000 for t in totals), show(proc)


@pytest.mark.parametrize("n,empty", [(1, False), (2, False), (3, False), (3, True)])
def test_sync_batch_norm_script(n, empty):
    # The portable path here; on CUDA the same script checks the kernel path.
    proc = run(["-np", str(n), "-H", "localhost:%d" % n, PYTHON,
                "tests/gpu/sync_batch_norm_test.py", "--cpu"] + (["--empty-rank"] if empty else []))
    assert proc.returncode == 0, show(proc)
    totals = re.findall(r"^\[1,\d+\]<stdout>:sync_batch_norm: (\d+) checks passed$", proc.stdout,
                        re.M)
    assert len(totals) == n and all(int(t) > 90 for t in totals), show(proc)
