#include "lib/launch/agent/port_holders.h"

#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "lib/launch/agent/process_info.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {
namespace {

constexpr int kTcpTimeWait = 0x06;
constexpr int kTcpClose = 0x07;
constexpr int kTcpListen = 0x0A;
// Linux's pseudo-state, for sock_diag only, of a socket that is bound and nothing more.
constexpr int kTcpBoundInactive = 13;

// A whole number written in `base` with nothing around it.
std::optional<unsigned long long> parse_number(std::string_view text, int base) {
  unsigned long long value = 0;
  const char *last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value, base);
  if (text.empty() || error != std::errc() || end != last) return std::nullopt;
  return value;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while ((start = line.find_first_not_of(" \t\r", start)) != std::string_view::npos) {
    size_t end = line.find_first_of(" \t\r", start);
    if (end == std::string_view::npos) end = line.size();
    fields.push_back(line.substr(start, end - start));
    start = end;
  }
  return fields;
}

// The port of an address column: "0100007F:1F90" (IPv4) or 32 hex digits, ':', port (IPv6).
std::optional<int> address_port(std::string_view address, bool ipv6) {
  const size_t colon = address.find(':');
  if (colon != (ipv6 ? 32u : 8u) || !parse_number(address.substr(0, colon), 16)) {
    return std::nullopt;
  }
  const std::string_view port = address.substr(colon + 1);
  const auto value = parse_number(port, 16);
  if (port.size() > 4 || !value) return std::nullopt;
  return static_cast<int>(*value);
}

// "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ..."
std::optional<SocketEntry> parse_line(std::string_view line, bool ipv6) {
  const std::vector<std::string_view> fields = split_fields(line);
  if (fields.size() < 10 || fields[0].back() != ':') return std::nullopt;
  const auto slot = parse_number(fields[0].substr(0, fields[0].size() - 1), 10);
  const auto port = address_port(fields[1], ipv6);
  const auto remote_port = address_port(fields[2], ipv6);
  const auto state = parse_number(fields[3], 16);
  const auto inode = parse_number(fields[9], 10);
  if (!slot || !port || !remote_port || !state || *state > 0xFF || !inode) return std::nullopt;
  return SocketEntry{*port, static_cast<int>(*state), *inode, ipv6};
}

// Asks sock_diag for every socket of `ipv6`'s family that is bound and nothing more.
bool request_bound_sockets(int fd, bool ipv6) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 body;
  } request{};
  request.header.nlmsg_len = sizeof request;
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.body.sdiag_family = static_cast<std::uint8_t>(ipv6 ? AF_INET6 : AF_INET);
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = 1u << kTcpBoundInactive;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  const ssize_t sent = retry_on_eintr([&] {
    return ::sendto(fd, &request, sizeof request, 0, reinterpret_cast<sockaddr *>(&kernel),
                    sizeof kernel);
  });
  return sent == static_cast<ssize_t>(sizeof request);
}

constexpr size_t netlink_align(size_t length) {
  return (length + NLMSG_ALIGNTO - 1) & ~size_t{NLMSG_ALIGNTO - 1};
}

// Adds the sockets of one datagram of replies to `found`; false once the dump has ended.
bool read_bound_sockets(const char *data, size_t size, bool ipv6, std::vector<SocketEntry> &found) {
  constexpr size_t kHeader = netlink_align(sizeof(nlmsghdr));
  size_t offset = 0;
  while (offset + sizeof(nlmsghdr) <= size) {
    nlmsghdr header;
    std::memcpy(&header, data + offset, sizeof header);
    if (header.nlmsg_len < sizeof header || header.nlmsg_len > size - offset) return false;
    if (header.nlmsg_type == NLMSG_DONE || header.nlmsg_type == NLMSG_ERROR) return false;
    if (header.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        header.nlmsg_len >= kHeader + sizeof(inet_diag_msg)) {
      inet_diag_msg message;
      std::memcpy(&message, data + offset + kHeader, sizeof message);
      found.push_back(
          {ntohs(message.id.idiag_sport), kTcpBoundInactive, message.idiag_inode, ipv6});
    }
    offset += netlink_align(header.nlmsg_len);
  }
  return true;
}

// The sockets of `ipv6`'s family that are bound and nothing more, which /proc/net/tcp leaves out.
// Empty where the kernel cannot tell (before Linux 6.8, or without sock_diag).
std::vector<SocketEntry> bound_sockets(bool ipv6) {
  std::vector<SocketEntry> found;
  UniqueFd fd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!fd.valid()) return found;
  const timeval timeout{1, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (!request_bound_sockets(fd.get(), ipv6)) return found;
  std::vector<char> buffer(65536);  // more than the kernel puts in one datagram of a dump
  for (;;) {
    const ssize_t got =
        retry_on_eintr([&] { return ::recv(fd.get(), buffer.data(), buffer.size(), 0); });
    if (got <= 0) return found;
    if (!read_bound_sockets(buffer.data(), static_cast<size_t>(got), ipv6, found)) return found;
  }
}

// The sockets on local port `port` that make it in use.
std::vector<SocketEntry> sockets_on_port(int port) {
  std::vector<SocketEntry> sockets;
  for (const bool ipv6 : {false, true}) {
    const std::string text = read_proc_file(ipv6 ? "/proc/net/tcp6" : "/proc/net/tcp");
    for (const SocketEntry &entry : parse_proc_net_tcp(text, ipv6)) {
      if (entry.local_port != port) continue;
      if (entry.state != kTcpTimeWait && entry.state != kTcpClose) sockets.push_back(entry);
    }
    for (const SocketEntry &entry : bound_sockets(ipv6)) {
      if (entry.local_port == port) sockets.push_back(entry);
    }
  }
  return sockets;
}

std::string state_name(int state) {
  static constexpr std::array<const char *, 13> kNames = {
      "",      "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",   "TIME_WAIT",
      "CLOSE", "CLOSE_WAIT",  "LAST_ACK", "LISTEN",   "CLOSING",   "NEW_SYN_RECV"};
  if (state > 0 && state < static_cast<int>(kNames.size())) return kNames[state];
  return "state " + std::to_string(state);
}

// "LISTEN on IPv4 and IPv6; bound, IPv4; ESTABLISHED on IPv6": LISTEN first, then bound, then the
// other states in the kernel's order.
std::string describe_sockets(const std::vector<SocketEntry> &sockets) {
  struct Families {
    bool ipv4 = false;
    bool ipv6 = false;
  };
  std::map<std::pair<int, int>, Families> by_state;  // by (rank, state)
  for (const SocketEntry &entry : sockets) {
    const int rank = entry.state == kTcpListen ? 0 : entry.state == kTcpBoundInactive ? 1 : 2;
    Families &families = by_state[{rank, entry.state}];
    (entry.ipv6 ? families.ipv6 : families.ipv4) = true;
  }
  std::string detail;
  for (const auto &[key, families] : by_state) {
    if (!detail.empty()) detail += "; ";
    detail += key.second == kTcpBoundInactive ? "bound, " : state_name(key.second) + " on ";
    detail += families.ipv4 && families.ipv6 ? "IPv4 and IPv6" : families.ipv4 ? "IPv4" : "IPv6";
  }
  return detail;
}

// 1234 for "socket:[1234]".
std::optional<unsigned long long> socket_inode(std::string_view link) {
  constexpr std::string_view kPrefix = "socket:[";
  if (!link.starts_with(kPrefix) || !link.ends_with(']')) return std::nullopt;
  return parse_number(link.substr(kPrefix.size(), link.size() - kPrefix.size() - 1), 10);
}

std::vector<int> list_pids() {
  std::vector<int> pids;
  DIR *proc = opendir("/proc");
  if (!proc) return pids;
  while (dirent *entry = readdir(proc)) {
    const auto pid = parse_number(entry->d_name, 10);
    if (pid && *pid > 0 && *pid <= 0x7fffffff) pids.push_back(static_cast<int>(*pid));
  }
  closedir(proc);
  std::sort(pids.begin(), pids.end());
  return pids;
}

// Whether process `pid` has an fd on one of the sockets `wanted`; adds those to `found`.
bool holds_socket(int pid, const std::set<unsigned long long> &wanted,
                  std::set<unsigned long long> &found) {
  DIR *fds = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!fds) return false;  // gone, or another user's process
  bool holds = false;
  std::array<char, 64> link;
  while (dirent *entry = readdir(fds)) {
    const ssize_t size = ::readlinkat(dirfd(fds), entry->d_name, link.data(), link.size());
    if (size <= 0) continue;
    const auto inode = socket_inode(std::string_view(link.data(), static_cast<size_t>(size)));
    if (inode && wanted.contains(*inode)) {
      found.insert(*inode);
      holds = true;
    }
  }
  closedir(fds);
  return holds;
}

// The processes with an fd on one of the sockets `wanted`, by pid; adds the sockets seen to
// `found`.
std::vector<PortHolder> holders_of(const std::set<unsigned long long> &wanted,
                                   std::set<unsigned long long> &found) {
  std::vector<PortHolder> holders;
  for (const int pid : list_pids()) {
    if (holds_socket(pid, wanted, found)) {
      holders.push_back(PortHolder{pid, process_user(pid), process_command(pid)});
    }
  }
  return holders;
}

}  // namespace

std::vector<SocketEntry> parse_proc_net_tcp(std::string_view text, bool ipv6) {
  std::vector<SocketEntry> entries;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    if (auto entry = parse_line(text.substr(0, end), ipv6)) entries.push_back(*entry);
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return entries;
}

PortUse find_port_use(int port) {
  PortUse use;
  use.port = port;
  const std::vector<SocketEntry> sockets = sockets_on_port(port);
  if (sockets.empty()) return use;
  use.in_use = true;
  use.detail = describe_sockets(sockets);
  std::set<unsigned long long> wanted;
  for (const SocketEntry &entry : sockets) {
    if (entry.inode != 0) wanted.insert(entry.inode);
  }
  use.orphaned = wanted.empty();
  std::set<unsigned long long> found;
  if (!use.orphaned) use.holders = holders_of(wanted, found);
  if (!use.holders.empty() && found.size() < wanted.size()) {
    use.detail += "; another socket's process cannot be seen";
  }
  return use;
}

std::string describe(const PortUse &use) {
  std::string line = "port " + std::to_string(use.port);
  if (!use.in_use) return line + " is free";
  line += " is in use";
  if (!use.detail.empty()) line += " (" + use.detail + ")";
  if (use.orphaned) return line + " by no process: connections the kernel is still closing";
  if (use.holders.empty()) {
    return line + " by a process perseusrun cannot see (run as root to name it)";
  }
  for (size_t i = 0; i < use.holders.size(); ++i) {
    const PortHolder &holder = use.holders[i];
    line += i == 0 ? " by " : ", ";
    line += "pid " + std::to_string(holder.pid) + " (" +
            (holder.command.empty() ? "?" : holder.command) +
            (holder.user.empty() ? "" : ", user " + holder.user) + ")";
  }
  return line;
}

}  // namespace perseus::launch
