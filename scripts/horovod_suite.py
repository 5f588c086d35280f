#!/usr/bin/env python3
"""Runs Horovod's own test suite against Perseus, as a user switching from Horovod would: the
suite's import line changed to Perseus's, each test as its own perseusrun job, and a table of
passed / failed / hung / crashed / skipped (issue 22's measurement, made repeatable).

    scripts/horovod_suite.py --horovod ~/src/horovod --suite torch --np 2 3
    scripts/horovod_suite.py --horovod ~/src/horovod --suite mxnet1 --np 2 \\
        --python .venv-mxnet/bin/python
    # one GPU, N ranks on it as simulated hosts (NCCL between them over sockets):
    scripts/horovod_suite.py --horovod DIR --suite torch --np 2 --simulate-hosts

Horovod's files are read from the checkout given (horovod/horovod, test/parallel and
test/utils) and copied into a temporary folder with only these changes: `import horovod.torch
as hvd` (or `horovod.mxnet`) becomes Perseus's import, and the helper test/utils/common.py
imports without cloudpickle, mock and horovod.runner (which test_torch.py and the MXNet suite
do not use). Nothing of Horovod's is kept in this repository.

A test's outcome is read from its ranks' pytest lines: passed when every rank passed, skipped
when every rank skipped, hung when the job ran past --timeout, crashed when a rank died of a
signal (SIGSEGV, SIGABRT: 'double free', ...), failed otherwise. Exit: 0 when nothing failed,
hung or crashed, else 1 (2: bad arguments).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = {
    # suite: (file under test/parallel, helper files beside it, import lines to change)
    "torch": ("test_torch.py", [], [("import horovod.torch as hvd",
                                     "import perseus.torch.horovod as hvd")]),
    "mxnet1": ("test_mxnet1.py", ["base_test_mxnet.py"], [("import horovod.mxnet as hvd",
                                                             "import perseus.mxnet as hvd")]),
}
# Lines of common.py that need packages these suites never use.
COMMON_OPTIONAL = ("import cloudpickle", "import mock",
                   "from horovod.runner.util.threads import in_thread")
SIGNAL_WORDS = ("Segmentation fault", "double free", "corrupted", "Aborted", "core dumped",
                "killed by signal", "AddressSanitizer")


def fail(message):
    print("horovod_suite: " + message, file=sys.stderr)
    sys.exit(2)


def prepare(horovod, suite, where):
    """Copies the suite into `where` with the import changed; returns the test file's path."""
    test_file, helpers, replacements = SUITES[suite]
    parallel = os.path.join(horovod, "test", "parallel")
    utils = os.path.join(horovod, "test", "utils", "common.py")
    for path in [os.path.join(parallel, test_file), utils] + [
            os.path.join(parallel, h) for h in helpers]:
        if not os.path.isfile(path):
            fail("%s is missing: --horovod must name a checkout of horovod/horovod" % path)
    os.makedirs(os.path.join(where, "parallel"))
    os.makedirs(os.path.join(where, "utils"))
    changed = 0
    for name in [test_file] + helpers:
        with open(os.path.join(parallel, name)) as f:
            text = f.read()
        for old, new in replacements:
            changed += text.count(old)
            text = text.replace(old, new)
        with open(os.path.join(where, "parallel", name), "w") as f:
            f.write(text)
    if not changed:
        fail("no line %r in %s: not the suite this script knows" % (replacements[0][0], test_file))
    with open(utils) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() in COMMON_OPTIONAL:
            lines[i] = "try:\n    %s\nexcept ImportError:\n    pass" % line.strip()
    with open(os.path.join(where, "utils", "common.py"), "w") as f:
        f.write("\n".join(lines))
    return os.path.join(where, "parallel", test_file)


def collect(python, test_path, env, pattern):
    out = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", test_path],
                         cwd=os.path.dirname(test_path), env=env, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        fail("pytest collected nothing from %s:\n%s%s" % (test_path, out.stdout, out.stderr))
    if pattern:
        ids = [i for i in ids if re.search(pattern, i)]
    return ids


def classify(rc, output, timed_out, ranks):
    if timed_out or rc == 124:  # perseusrun's --timeout
        return "hung"
    if any(word in output for word in SIGNAL_WORDS) or 128 < rc < 128 + 32:
        return "crashed"  # a rank killed by a signal: perseusrun exits 128 + N
    passed = len(re.findall(r"^\S*\s*=*\s*1 passed", output, re.M))
    skipped = len(re.findall(r"^\S*\s*=*\s*1 skipped", output, re.M))
    if rc == 0 and passed >= ranks:
        return "passed"
    if rc == 0 and skipped >= ranks:
        return "skipped"
    if rc == 0 and passed + skipped >= ranks:
        return "passed"  # a rank that skips itself (Horovod's tests do on odd ranks)
    return "failed"


def run_one(args, test_id, ranks, test_dir, env):
    command = [args.perseusrun, "-np", str(ranks), "-H", "localhost:%d" % ranks,
               "--timeout", str(args.timeout)] + args.perseusrun_args
    if args.simulate_hosts:
        command += ["--gpu-bind", "none", "-x", "NCCL_NVLS_ENABLE=0",
                    os.path.join(ROOT, "scripts", "gpu", "as_simulated_host.sh"),
                    ",".join(["1"] * ranks)]
    command += [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", test_id]
    start = time.monotonic()
    try:
        out = subprocess.run(command, cwd=test_dir, env=env, capture_output=True, text=True,
                             timeout=args.timeout + 30)
        rc, output, timed_out = out.returncode, out.stdout + out.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = -1, True
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
    seconds = time.monotonic() - start
    return classify(rc, output, timed_out, ranks), seconds, output


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod", required=True, help="a checkout of horovod/horovod")
    parser.add_argument("--suite", choices=sorted(SUITES), default="torch")
    parser.add_argument("--np", type=int, nargs="+", default=[2], help="job sizes to run")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="jobs at once (default: half the cores)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a test may take")
    parser.add_argument("-k", dest="pattern", help="only tests whose id matches this regex")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--perseusrun",
                        default=os.path.join(ROOT, "build", "apps", "perseusrun", "perseusrun"))
    parser.add_argument("--simulate-hosts", action="store_true",
                        help="every rank a host of its own on GPU 0 (one-GPU machines)")
    parser.add_argument("--perseusrun-arg", dest="perseusrun_args", action="append", default=[],
                        help="one more perseusrun option (again for more): --perseusrun-arg="
                             "--no-preflight lets several one-GPU jobs share the GPU")
    parser.add_argument("--logs", help="folder for each non-passing test's output")
    parser.add_argument("--json", help="write the outcomes here")
    args = parser.parse_args()
    if not os.access(args.perseusrun, os.X_OK):
        fail("no perseusrun at %s (build first, or --perseusrun PATH)" % args.perseusrun)
    if any(n < 1 for n in args.np):
        fail("--np %s: job sizes must be positive" % args.np)

    where = tempfile.mkdtemp(prefix="horovod-suite-")
    try:
        test_path = prepare(os.path.abspath(args.horovod), args.suite, where)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "lib", "framework_shims")] +
            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        ids = collect(args.python, test_path, env, args.pattern)
        results = {}
        for ranks in args.np:
            print("== %s, %d rank(s), %d tests, %d at a time" % (
                args.suite, ranks, len(ids), args.jobs), flush=True)
            counts = dict.fromkeys(("passed", "failed", "hung", "crashed", "skipped"), 0)
            outcomes = {}
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                futures = {pool.submit(run_one, args, i, ranks, os.path.dirname(test_path), env): i
                           for i in ids}
                for future in concurrent.futures.as_completed(futures):
                    test_id = futures[future]
                    outcome, seconds, output = future.result()
                    counts[outcome] += 1
                    outcomes[test_id] = {"outcome": outcome, "seconds": round(seconds, 1)}
                    short = test_id.split("::")[-1]
                    if outcome not in ("passed", "skipped"):
                        print("%-8s %5.1fs %s" % (outcome.upper(), seconds, short), flush=True)
                        if args.logs:
                            os.makedirs(args.logs, exist_ok=True)
                            with open(os.path.join(args.logs, "%s.np%d.log" % (short, ranks)),
                                      "w") as f:
                                f.write("".join(line for line in output.splitlines(True)
                                                if "NCCL INFO" not in line))
            ran = counts["passed"] + counts["failed"] + counts["hung"] + counts["crashed"]
            print("| %s | %d | %d | %d | %d | %d | %d | %.1f%% of those that ran |" % (
                args.suite, ranks, counts["passed"], counts["failed"], counts["hung"],
                counts["crashed"], counts["skipped"], 100.0 * counts["passed"] / max(ran, 1)),
                flush=True)
            results[str(ranks)] = {"counts": counts, "tests": outcomes}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, sort_keys=True)
        bad = any(r["counts"][k] for r in results.values() for k in ("failed", "hung", "crashed"))
        return 1 if bad else 0
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
