#pragma once
// Which processes hold a TCP port on this host, for `perseusrun --check` and the launch
// preflight: "port 29500 is in use (LISTEN on IPv4) by pid 1234 (python train.py, user alice)".
//
// A port is in use when a TCP socket of the caller's network namespace, IPv4 or IPv6, has it as
// its local port in LISTEN state or in any other state but TIME_WAIT and CLOSE: connected,
// closing, or bound and nothing more (a socket that would make bind() fail). The sockets come
// from /proc/net/tcp and /proc/net/tcp6. Those files leave out sockets that are only bound; these
// come from the kernel's sock_diag netlink interface, which lists them from Linux 6.8 on (on
// older kernels such a socket is not seen). The processes holding a socket are those with a link
// /proc/<pid>/fd/* to "socket:[<inode>]". Only root can read the fds of other users' processes,
// and processes of another PID namespace sharing this network (a container) are not in /proc at
// all: a socket whose process cannot be found still makes the port in use, with no holder named.
// Nothing here binds, connects or signals anything.

#include <string>
#include <string_view>
#include <vector>

namespace perseus::launch {

// One line of /proc/net/tcp or /proc/net/tcp6.
struct SocketEntry {
  int local_port;
  int state;  // the kernel's TCP state number (0x0A = LISTEN, 0x06 = TIME_WAIT, 0x07 = CLOSE)
  unsigned long long inode;  // 0 for a socket no process holds (TIME_WAIT, an orphan closing)
  bool ipv6;
};

// The sockets listed in the text of /proc/net/tcp (`ipv6` false) or /proc/net/tcp6 (`ipv6`
// true), in order. Skips the header line and malformed lines, including lines whose addresses
// are not of the family `ipv6` names. Pure.
std::vector<SocketEntry> parse_proc_net_tcp(std::string_view text, bool ipv6);

struct PortHolder {
  int pid;
  std::string user;     // the owner of /proc/<pid>: a user name, else the uid as a number
  std::string command;  // /proc/<pid>/cmdline, NULs (and other control characters) as spaces,
                        // trimmed, at most 200 bytes, "..." ending a cut one; "[<comm>]" when it
                        // is empty (a kernel thread), "?" when neither can be read
};

struct PortUse {
  int port = 0;
  bool in_use = false;
  std::vector<PortHolder> holders;  // by pid; empty when in use by processes not visible here
  std::string detail;               // the sockets, e.g. "LISTEN on IPv4", "bound, IPv6",
                                    // "LISTEN on IPv4 and IPv6; ESTABLISHED on IPv4"
  bool orphaned = false;  // in use only by connections the kernel is still closing, which no
                          // process holds any more (so `holders` is empty, and none is hidden)
};

// Whether TCP port `port` (1-65535; any other is free) is in use on this host now, and by which
// processes. An unreadable /proc file is no error: what cannot be read is not seen.
PortUse find_port_use(int port);

// One line: "port 29500 is in use (LISTEN on IPv4) by pid 1234 (python train.py, user alice)",
// "port 29500 is in use (bound, IPv6) by a process perseusrun cannot see (run as root to name
// it)", "port 29500 is in use (FIN_WAIT2 on IPv4) by no process: connections the kernel is still
// closing", "port 29500 is free".
std::string describe(const PortUse &use);

}  // namespace perseus::launch
