#!/usr/bin/env python3
"""Wall time of a job of `true` on 1, 3 and 8 SSH hosts, perseusrun against mpirun, same run.

    sudo bench/ssh_launch_time.py [--perseusrun build/apps/perseusrun/perseusrun] [--repeat 7]
                                  [--sizes 1,3,8] [--root] [--timeout 60]

The hosts are tests/blackbox/testhosts.py's: network namespaces on a bridge of this machine,
each with its own sshd (needs root). For each N it runs, one rank per host on the first N hosts,

    perseusrun -H a1,...,aN -npernode 1 --ssh-user USER --remote-perseusrun PATH true
    mpirun --oversubscribe -np N -H a1,...,aN --mca plm_rsh_agent "ssh ... -l USER" ... true

alternately, --repeat times each after one warm-up run of each, and prints the medians and their
ratio as a Markdown table (ratio < 1: perseusrun is faster). perseusrun logs in with libssh2,
mpirun with OpenSSH's ssh; both with the same key, known_hosts and user.

Login user: by default a throw-away user whose login shell is /bin/sh (TestHosts' fast_user),
so that the launchers are measured, not the login shell. --root logs in as root instead, whose
login shell here runs `pyenv init` from ~/.bashrc (about 0.6 s of CPU per SSH session: on a
small machine that dominates the times). The table's preamble says which user was used.

Before timing, both launchers run a probe on every N that reports the user and the network
namespace of each rank: the benchmark stops with an error unless every rank ran as the login
user, one on each of the N hosts. A run that takes longer than --timeout is ended (its process
group and whatever it left on the hosts), counted as hung and left out of the medians; a run
that fails is counted as failed and left out as well. Times on the CPU development machine are
only meaningful as ratios.
"""
import argparse
import os
import pwd
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "blackbox"))

from testhosts import TestHosts, TestHostsUnavailable, unavailable_reason  # noqa: E402

SYSTEM_LIB_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")
# Prints "<user> net:[<inode>]" for the rank: who it ran as and on which host (namespace).
PROBE = ["/bin/sh", "-c", 'echo "probe $(id -un) $(readlink /proc/self/ns/net)"']
PROBE_LINE = re.compile(r"probe (\S+) net:\[(\d+)\]")


def fail(msg):
    sys.exit("ssh_launch_time: " + msg)


def first_line(args):
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "unknown (%s)" % e
    out = (p.stdout or p.stderr).strip()
    return out.splitlines()[0] if out else "unknown"


def non_system_libraries(binary):
    """Shared libraries of `binary` that ldd resolves outside the system's directories (or not
    at all): a throw-away login user may not be able to read those."""
    p = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    odd = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            odd.append(line)
        elif "=>" in line:
            path = line.split("=>", 1)[1].split("(")[0].strip()
            if path and not path.startswith(SYSTEM_LIB_DIRS):
                odd.append(line)
    return odd


def runnable_remotely(hosts, binary):
    """(ok, message): whether the login user can run `binary --version` on host 0 over SSH."""
    p = hosts.ssh(0, "%s --version" % shlex.quote(binary), timeout=30)
    return p.returncode == 0, (p.stderr or p.stdout).strip()


def remote_binary(hosts, binary, cleanup):
    """A path of perseusrun that the login user can execute on the hosts: `binary` itself when
    it can, otherwise a copy in a temporary directory open to everyone (removed by `cleanup`)."""
    ok, msg = runnable_remotely(hosts, binary)
    if ok:
        return binary, "as built"
    odd = non_system_libraries(binary)
    if odd:
        fail("%s uses libraries outside the system's directories, which user %s may not read; "
             "not copying it:\n  %s" % (binary, hosts.user, "\n  ".join(odd)))
    tmp = tempfile.mkdtemp(prefix="perseus-bench-")
    cleanup.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
    os.chmod(tmp, 0o755)
    copy = os.path.join(tmp, "perseusrun")
    shutil.copy2(binary, copy)
    os.chmod(copy, 0o755)
    ok, msg2 = runnable_remotely(hosts, copy)
    if not ok:
        fail("user %s cannot run perseusrun on the hosts, neither %s (%s) nor a copy at %s (%s)"
             % (hosts.user, binary, msg, copy, msg2))
    return copy, "copied to %s (user %s cannot run %s: %s)" % (copy, hosts.user, binary, msg)


def commands(args, hosts, perseusrun, mpirun, n, program):
    addrs = ",".join(hosts.addresses[:n])
    ours = [perseusrun, "-H", addrs, "-npernode", "1", "--ssh-user", hosts.user,
            "--remote-perseusrun", perseusrun, *program]
    agent = ("ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes "
             "-o UserKnownHostsFile=%s -i %s -l %s"
             % (hosts.known_hosts, hosts.client_key, hosts.user))
    theirs = [mpirun, "--oversubscribe", "-np", str(n), "-H", addrs,
              "--mca", "plm_rsh_agent", agent,
              # orted connects back to mpirun over the bridge, not over another interface.
              "--mca", "oob_tcp_if_include", str(hosts.network),
              "--mca", "btl", "self,tcp",
              *args.mpirun_option, *program]
    return ours, theirs


def end_leftovers(hosts):
    """SIGKILLs what a hung run left on the hosts: every process in their namespaces but the
    listening sshd (all of them were started by this benchmark's runs)."""
    for i in range(hosts.count):
        keep = hosts.sshd_pid(i)
        for pid in hosts.pids_on(i):
            if pid != keep:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run(command, env, timeout):
    """(status, seconds, output): status is an exit code or "hung". The run gets its own
    process group, which is SIGKILLed when it hangs."""
    start = time.perf_counter()
    p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = p.communicate()
        return "hung", time.perf_counter() - start, out.decode(errors="replace")
    return p.returncode, time.perf_counter() - start, out.decode(errors="replace")


def probe(name, command, env, hosts, n, timeout):
    """Stops the benchmark unless `command` (running PROBE) ran one rank as the login user on
    each of the first n hosts."""
    status, secs, out = run(command, env, timeout)
    if status != 0:
        end_leftovers(hosts)
        fail("%s on %d host(s) %s:\n  %s\n%s"
             % (name, n, "hung (more than %g s)" % timeout if status == "hung"
                else "failed with exit status %s" % status,
                " ".join(shlex.quote(a) for a in command), out.strip()))
    seen = PROBE_LINE.findall(out)
    want = {os.stat("/run/netns/" + ns).st_ino for ns in hosts.namespaces[:n]}
    users = {u for u, _ in seen}
    got = [int(ino) for _, ino in seen]
    if len(got) != n or set(got) != want or users != {hosts.user}:
        fail("%s on %d host(s) did not run one rank per host as %s: got %s, want namespaces %s"
             "\n%s" % (name, n, hosts.user, seen, sorted(want), out.strip()))


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perseusrun",
                        default=os.path.join(ROOT, "build/apps/perseusrun/perseusrun"))
    parser.add_argument("--mpirun", default=shutil.which("mpirun"))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--sizes", default="1,3,8", help="numbers of hosts (default 1,3,8)")
    parser.add_argument("--root", action="store_true",
                        help="log in as root (slow login shell here) instead of a /bin/sh user")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds after which a run counts as hung (default 60)")
    parser.add_argument("--mpirun-option", action="append", default=[], metavar="ARG",
                        help="extra argument for mpirun, before the program (repeatable)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not args.mpirun:
        fail("mpirun not found (apt-get install openmpi-bin)")
    if not os.access(args.perseusrun, os.X_OK):
        fail("%s is not executable (build it first, or pass --perseusrun)" % args.perseusrun)
    reason = unavailable_reason()
    if reason:
        fail("cannot create SSH test hosts: " + reason)

    cleanup = []
    try:
        with TestHosts(max(sizes), fast_user=not args.root) as hosts:
            bench(args, hosts, sizes, cleanup)
    except TestHostsUnavailable as e:
        fail(str(e))
    finally:
        for fn in reversed(cleanup):
            fn()


def bench(args, hosts, sizes, cleanup):
    perseusrun, where = remote_binary(hosts, os.path.abspath(args.perseusrun), cleanup)
    env = hosts.env()
    # mpirun itself runs as root here, whatever the login user on the hosts.
    mpi_env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    shell = pwd.getpwnam(hosts.user).pw_shell
    versions = first_line([perseusrun, "--version"])
    libssh2 = next((l.split(":", 1)[1].strip() for l in subprocess.run(
        [perseusrun, "--version"], capture_output=True, text=True).stdout.splitlines()
        if l.startswith("libssh2:")), "unknown")
    print("- perseusrun: %s (libssh2 %s), binary %s" % (versions, libssh2, where))
    print("- mpirun: %s" % first_line([args.mpirun, "--version"]))
    print("- sshd: %s" % first_line(["/usr/sbin/sshd", "-V"]))
    print("- login user: %s (shell %s)%s" % (
        hosts.user, shell, "" if args.root else ", a throw-away user (fast login)"))
    print("- hosts: %s on bridge %s (%s), repeat %d, timeout %g s"
          % (", ".join(hosts.addresses[:max(sizes)]), hosts.bridge, hosts.network,
             args.repeat, args.timeout))
    print(flush=True)

    for n in sizes:
        ours, theirs = commands(args, hosts, perseusrun, args.mpirun, n, PROBE)
        probe("perseusrun", ours, env, hosts, n, args.timeout)
        probe("mpirun", theirs, mpi_env, hosts, n, args.timeout)

    print("| hosts | perseusrun median (s) | mpirun median (s) | perseusrun / mpirun | hung runs |")
    print("|---|---|---|---|---|", flush=True)
    for n in sizes:
        ours, theirs = commands(args, hosts, perseusrun, args.mpirun, n, ["true"])
        runs = (("perseusrun", ours, env), ("mpirun", theirs, mpi_env))
        times = {name: [] for name, _, _ in runs}
        hung = {name: 0 for name, _, _ in runs}
        failed = {name: [] for name, _, _ in runs}
        for attempt in range(args.repeat + 1):  # the first round warms up, not counted
            for name, command, e in runs:
                status, secs, out = run(command, e, args.timeout)
                if status == "hung":
                    end_leftovers(hosts)
                if attempt == 0:
                    continue
                if status == "hung":
                    hung[name] += 1
                elif status != 0:
                    failed[name].append(status)
                    sys.stderr.write("%s on %d host(s) failed (%s):\n%s\n"
                                     % (name, n, status, out.strip()))
                else:
                    times[name].append(secs)
        a, b = median(times["perseusrun"]), median(times["mpirun"])
        notes = ["%s: %d" % (k, v) for k, v in hung.items() if v]
        notes += ["%s: %d failed" % (k, len(v)) for k, v in failed.items() if v]
        print("| %d | %.3f | %.3f | %.2f | %s |" % (n, a, b, a / b, ", ".join(notes) or "none"),
              flush=True)


if __name__ == "__main__":
    main()
