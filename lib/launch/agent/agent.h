#pragma once
// The agent: one per host, it starts that host's ranks and watches them. It talks to the
// launcher over its stdin and stdout with the protocol in agent_protocol.h, and logs to stderr.
//
// Promises:
//  - Every process of the job on this host is a descendant of the agent (it is a child
//    subreaper), and none is left when the agent exits: leftovers of ranks that exited get
//    SIGTERM, then SIGKILL after the job's grace.
//  - When the agent itself is killed, its job guard (job_guard.h) ends what is left: the
//    ranks die with the agent (PDEATHSIG), the guard kills the job cgroup, or without one
//    what its scans saw below the agent. The guard is the agent's child but not part of the
//    job: the sweeps above leave it out, and the agent waits for it before it exits.
//  - When the launcher goes away (end of stdin: it died, or the SSH session dropped), sends
//    nothing for the job's heartbeat timeout (heartbeat.h: its host or the network is down),
//    or the agent gets SIGTERM/SIGINT/SIGHUP, it ends every rank within a few seconds.
//  - A rank's Exited message follows all the output the rank wrote before it exited.
//
// Threading: one thread, one poll loop.

namespace perseus::launch {

// The agent's main function; returns its exit code.
int run_agent();

}  // namespace perseus::launch
