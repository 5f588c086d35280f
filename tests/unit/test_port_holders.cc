#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "lib/launch/agent/port_holders.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {
namespace {

// The entries as text, so that a failed check shows them.
std::string show(const std::vector<SocketEntry> &entries) {
  std::ostringstream text;
  for (const SocketEntry &entry : entries) {
    text << "{port " << entry.local_port << ", state " << entry.state << ", inode " << entry.inode
         << (entry.ipv6 ? ", IPv6} " : ", IPv4} ");
  }
  return text.str();
}

constexpr const char *kTcpHeader =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode                                                     \n";

TEST_CASE("parse_proc_net_tcp reads IPv4 lines") {
  const std::string text =
      std::string(kTcpHeader) +
      "   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
      "0 1070 1 0000000018ea6843 100 0 0 10 0                      \n"
      "   1: 0100007F:7345 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        "
      "0 365558 1 00000000408dc7bc 100 0 0 10 0                    \n"
      "   2: 01E7600A:C9A4 06E7600A:0016 01 00000000:00000000 02:000AFC5E 00000000  1000        "
      "0 91234 4 000000001c4387fe 20 4 30 10 -1                    \n"
      "   3: 01E7600A:C9AE 06E7600A:0016 06 00000000:00000000 03:00001250 00000000     0        "
      "0 0 3 0000000050a459df                                      \n"
      "  10: 0100007F:ffff 0100007f:1f90 08 00000000:00000001 00:00000000 00000000  1000        "
      "0 18446744073709551615 1 0000000050a459df 20 4 30 10 -1\n";
  const std::vector<SocketEntry> expected = {{0x07E8, 0x0A, 1070, false},
                                             {0x7345, 0x0A, 365558, false},
                                             {0xC9A4, 0x01, 91234, false},
                                             {0xC9AE, 0x06, 0, false},
                                             {0xFFFF, 0x08, 18446744073709551615ull, false}};
  CHECK(show(parse_proc_net_tcp(text, false)) == show(expected));
}

TEST_CASE("parse_proc_net_tcp reads IPv6 lines") {
  const std::string text =
      "  sl  local_address                         remote_address                        st "
      "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A "
      "00000000:00000000 00:00000000 00000000     0        0 21345 1 00000000c0a1b2c3 100 0 0 "
      "10 0\n"
      "   1: 00000000000000000000000001000000:7345 00000000000000000000000001000000:A2C4 01 "
      "00000000:00000000 00:00000000 00000000  1000        0 424242 1 00000000c0a1b2c3 20 4 30 "
      "10 -1\n"
      "   2: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:D1E2 06 "
      "00000000:00000000 03:00000F6B 00000000     0        0 0 3 0000000000000000\n";
  const std::vector<SocketEntry> expected = {
      {0x0016, 0x0A, 21345, true}, {0x7345, 0x01, 424242, true}, {0x1F90, 0x06, 0, true}};
  CHECK(show(parse_proc_net_tcp(text, true)) == show(expected));
}

TEST_CASE("parse_proc_net_tcp skips the header and malformed lines") {
  const std::string good =
      "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1";
  const std::vector<SocketEntry> one = {{0x1F90, 0x0A, 77, false}};
  CHECK(parse_proc_net_tcp("", false).empty());
  CHECK(parse_proc_net_tcp(kTcpHeader, false).empty());
  CHECK(show(parse_proc_net_tcp(good, false)) == show(one));               // no newline at the end
  CHECK(show(parse_proc_net_tcp(good + "\r\n\n\n", false)) == show(one));  // CRLF, empty lines
  CHECK(parse_proc_net_tcp(kTcpHeader + good + "\n", true).empty());       // not an IPv6 line
  const std::vector<std::string> malformed = {
      "garbage",
      "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0",
      "   1 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   x: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:1F9G 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:11F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F: 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007X:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:1F90 00000000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1 0",
      "   1: 0100007F:1F90 00000000:0000 ZZ 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:1F90 00000000:0000 100 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:1F90 00000000:0000 -1 00000000:00000000 00:00000000 00000000 0 0 77 1",
      "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 -77 1",
      "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 7x7 1",
      "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 "
      "99999999999999999999999 1",
  };
  for (const std::string &line : malformed) {
    CAPTURE(line);
    CHECK(parse_proc_net_tcp(line, false).empty());
    CHECK(show(parse_proc_net_tcp(kTcpHeader + line + "\n" + good + "\n", false)) == show(one));
  }
}

// ---- Real sockets ----

struct Socket {
  UniqueFd fd;
  int port = 0;
};

// A TCP socket bound to port 0 of the loopback address of its family; nullopt when that family is
// unavailable here.
std::optional<Socket> bound_socket(bool ipv6) {
  Socket socket{UniqueFd(::socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0))};
  if (!socket.fd.valid()) return std::nullopt;
  sockaddr_storage address{};
  socklen_t size = 0;
  if (ipv6) {
    auto *in6 = reinterpret_cast<sockaddr_in6 *>(&address);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    size = sizeof(sockaddr_in6);
  } else {
    auto *in4 = reinterpret_cast<sockaddr_in *>(&address);
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    size = sizeof(sockaddr_in);
  }
  if (::bind(socket.fd.get(), reinterpret_cast<sockaddr *>(&address), size) != 0) {
    return std::nullopt;
  }
  size = sizeof address;
  if (::getsockname(socket.fd.get(), reinterpret_cast<sockaddr *>(&address), &size) != 0) {
    return std::nullopt;
  }
  socket.port = ntohs(ipv6 ? reinterpret_cast<sockaddr_in6 *>(&address)->sin6_port
                           : reinterpret_cast<sockaddr_in *>(&address)->sin_port);
  return socket;
}

std::optional<Socket> listening_socket(bool ipv6) {
  std::optional<Socket> socket = bound_socket(ipv6);
  if (socket && ::listen(socket->fd.get(), 8) != 0) return std::nullopt;
  return socket;
}

// A client connected to `server` on 127.0.0.1, and the server's end of the connection.
struct Connection {
  Socket client;
  UniqueFd accepted;
};

Connection connect_to(const Socket &server) {
  Connection connection;
  std::optional<Socket> client = bound_socket(false);
  REQUIRE(client);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(server.port));
  REQUIRE(::connect(client->fd.get(), reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
  connection.client = std::move(*client);
  connection.accepted = UniqueFd(::accept4(server.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(connection.accepted.valid());
  return connection;
}

// The command find_port_use gives for this process (and for a child forked from it).
std::string own_command() {
  std::ifstream file("/proc/self/cmdline");
  std::stringstream text;
  text << file.rdbuf();
  std::string command = text.str();
  std::replace(command.begin(), command.end(), '\0', ' ');
  while (!command.empty() && command.back() == ' ') command.pop_back();
  return command;
}

std::string own_user() {
  const passwd *entry = ::getpwuid(::geteuid());
  return entry ? entry->pw_name : std::to_string(::geteuid());
}

void check_is_this_process(const PortHolder &holder, int pid) {
  CHECK(holder.pid == pid);
  CHECK(holder.user == own_user());
  const std::string command = own_command();
  if (command.size() <= 200) {
    CHECK(holder.command == command);
  } else {
    CHECK(holder.command.starts_with(command.substr(0, 150)));
  }
}

bool has_holder(const PortUse &use, int pid) {
  return std::any_of(use.holders.begin(), use.holders.end(),
                     [&](const PortHolder &holder) { return holder.pid == pid; });
}

// Polls find_port_use until `done` holds of its answer, for up to 5 s; returns the last answer.
PortUse wait_for_use(int port, const std::function<bool(const PortUse &)> &done) {
  PortUse use = find_port_use(port);
  for (int tries = 0; tries < 100 && !done(use); ++tries) {
    ::usleep(50 * 1000);
    use = find_port_use(port);
  }
  return use;
}

// Whether this kernel lists sockets that are bound and nothing more (Linux 6.8 and later).
bool kernel_lists_bound_sockets() {
  utsname name{};
  if (::uname(&name) != 0) return false;
  int major = 0;
  int minor = 0;
  if (std::sscanf(name.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 8);
}

TEST_CASE("a listening IPv4 socket of this process is found, and gone once closed") {
  std::optional<Socket> socket = listening_socket(false);
  REQUIRE(socket);
  const int port = socket->port;
  CAPTURE(port);
  const PortUse use = find_port_use(port);
  CHECK(use.port == port);
  CHECK(use.in_use);
  CHECK(use.detail == "LISTEN on IPv4");
  CHECK_FALSE(use.orphaned);
  REQUIRE(use.holders.size() == 1);
  check_is_this_process(use.holders[0], ::getpid());
  CHECK(describe(use) == "port " + std::to_string(port) + " is in use (LISTEN on IPv4) by pid " +
                             std::to_string(::getpid()) + " (" + use.holders[0].command +
                             ", user " + own_user() + ")");

  socket->fd.reset();
  const PortUse after = find_port_use(port);
  CHECK_FALSE(after.in_use);
  CHECK(after.holders.empty());
  CHECK(after.detail.empty());
  CHECK(describe(after) == "port " + std::to_string(port) + " is free");
}

TEST_CASE("a listening IPv6 socket on ::1 is found") {
  std::optional<Socket> socket = listening_socket(true);
  if (!socket) {
    MESSAGE("IPv6 is unavailable here (no listening socket on ::1): skipped");
    return;
  }
  CAPTURE(socket->port);
  const PortUse use = find_port_use(socket->port);
  CHECK(use.in_use);
  CHECK(use.detail == "LISTEN on IPv6");
  REQUIRE(use.holders.size() == 1);
  check_is_this_process(use.holders[0], ::getpid());
  socket->fd.reset();
  CHECK_FALSE(find_port_use(socket->port).in_use);
}

TEST_CASE("IPv4 and IPv6 listeners on one port are one use") {
  std::optional<Socket> ipv6 = listening_socket(true);
  if (!ipv6) {
    MESSAGE("IPv6 is unavailable here: skipped");
    return;
  }
  // The IPv6 socket's port may be taken on 127.0.0.1 by another process: then try no further.
  Socket ipv4{UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)), ipv6->port};
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(ipv6->port));
  if (::bind(ipv4.fd.get(), reinterpret_cast<sockaddr *>(&address), sizeof address) != 0 ||
      ::listen(ipv4.fd.get(), 8) != 0) {
    MESSAGE("port " << ipv6->port << " is taken on 127.0.0.1: skipped");
    return;
  }
  const PortUse use = find_port_use(ipv6->port);
  CHECK(use.in_use);
  CHECK(use.detail == "LISTEN on IPv4 and IPv6");
  REQUIRE(use.holders.size() == 1);  // one process, two sockets
  CHECK(use.holders[0].pid == ::getpid());
}

TEST_CASE("a socket that is bound but not listening makes its port in use") {
  for (const bool ipv6 : {false, true}) {
    CAPTURE(ipv6);
    std::optional<Socket> socket = bound_socket(ipv6);
    if (!socket) {
      REQUIRE(ipv6);
      MESSAGE("IPv6 is unavailable here: skipped");
      continue;
    }
    const PortUse use = find_port_use(socket->port);
    if (!use.in_use && !kernel_lists_bound_sockets()) {
      MESSAGE("this kernel (before Linux 6.8) does not list bound-only sockets: skipped");
      return;
    }
    CHECK(use.in_use);
    CHECK(use.detail == (ipv6 ? "bound, IPv6" : "bound, IPv4"));
    REQUIRE(use.holders.size() == 1);
    check_is_this_process(use.holders[0], ::getpid());
    socket->fd.reset();
    CHECK_FALSE(find_port_use(socket->port).in_use);
  }
}

TEST_CASE("a connection's ports are in use until it closes, then TIME_WAIT leaves them free") {
  std::optional<Socket> server = listening_socket(false);
  REQUIRE(server);
  Connection connection = connect_to(*server);
  const int client_port = connection.client.port;
  CAPTURE(server->port);
  CAPTURE(client_port);

  const PortUse server_use = find_port_use(server->port);
  CHECK(server_use.detail == "LISTEN on IPv4; ESTABLISHED on IPv4");
  CHECK(server_use.holders.size() == 1);
  CHECK(has_holder(server_use, ::getpid()));
  const PortUse client_use = find_port_use(client_port);
  CHECK(client_use.detail == "ESTABLISHED on IPv4");
  CHECK(has_holder(client_use, ::getpid()));

  // The client closes first: its socket, which no process holds any more, waits in FIN_WAIT2
  // for the server's end to close.
  connection.client.fd.reset();
  const PortUse closing = wait_for_use(
      client_port, [](const PortUse &use) { return use.detail == "FIN_WAIT2 on IPv4"; });
  CHECK(closing.in_use);
  CHECK(closing.detail == "FIN_WAIT2 on IPv4");
  CHECK(closing.orphaned);
  CHECK(closing.holders.empty());
  CHECK(describe(closing) == "port " + std::to_string(client_port) +
                                 " is in use (FIN_WAIT2 on IPv4) by no process: connections the "
                                 "kernel is still closing");

  // Then the server's end: the client's socket goes to TIME_WAIT, which leaves the port free.
  connection.accepted.reset();
  const PortUse closed = wait_for_use(client_port, [](const PortUse &use) { return !use.in_use; });
  CHECK_FALSE(closed.in_use);
  std::ifstream file("/proc/net/tcp");
  std::stringstream text;
  text << file.rdbuf();
  const std::vector<SocketEntry> entries = parse_proc_net_tcp(text.str(), false);
  CHECK(std::any_of(entries.begin(), entries.end(), [&](const SocketEntry &entry) {
    return entry.local_port == client_port && entry.state == 0x06;
  }));
}

// A child process that runs `body` (which writes its port and a newline to the fd it is given, then
// waits) or executes `argv`; killed and reaped on destruction.
class ListeningChild {
 public:
  ListeningChild(const std::function<void(int)> &body, const std::vector<std::string> &argv) {
    Pipe to_child = make_pipe();
    Pipe from_child = make_pipe();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) run(body, argv, to_child.read_end.get(), from_child.write_end.get());
    from_child.write_end.reset();
    to_child_ = std::move(to_child.write_end);
    port_ = read_port(from_child.read_end.get());
  }
  ~ListeningChild() {
    ::kill(pid_, SIGKILL);
    retry_on_eintr([&] { return ::waitpid(pid_, nullptr, 0); });
  }
  ListeningChild(const ListeningChild &) = delete;
  ListeningChild &operator=(const ListeningChild &) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }  // 0 when the child sent none

 private:
  [[noreturn]] static void run(const std::function<void(int)> &body,
                               const std::vector<std::string> &argv, int input, int output) {
    if (body) {
      body(output);
      ::_exit(0);
    }
    ::dup2(input, 0);
    ::dup2(output, 1);
    std::vector<char *> args;
    for (const std::string &arg : argv) args.push_back(const_cast<char *>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }

  static int read_port(int fd) {
    std::string line;
    pollfd entry{fd, POLLIN, 0};
    char byte = 0;
    while (retry_on_eintr([&] { return ::poll(&entry, 1, 10000); }) == 1 &&
           retry_on_eintr([&] { return ::read(fd, &byte, 1); }) == 1 && byte != '\n') {
      line += byte;
    }
    return byte == '\n' ? std::atoi(line.c_str()) : 0;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  UniqueFd to_child_;  // the child's stdin, open while it lives
};

TEST_CASE("a forked child that listens is named with its own pid") {
  ListeningChild child(
      [](int output) {
        std::optional<Socket> socket = listening_socket(false);
        if (!socket) return;
        write_all(output, std::to_string(socket->port) + "\n");
        for (;;) ::pause();
      },
      {});
  REQUIRE(child.port() > 0);
  const PortUse use = find_port_use(child.port());
  CHECK(use.in_use);
  CHECK(use.detail == "LISTEN on IPv4");
  REQUIRE(use.holders.size() == 1);
  check_is_this_process(use.holders[0], child.pid());
  CHECK_FALSE(has_holder(use, ::getpid()));
}

// Whether `text` ends with a whole UTF-8 sequence.
bool ends_whole_utf8(std::string_view text) {
  size_t start = text.size();
  while (start > 0 && (static_cast<unsigned char>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start == 0) return start == text.size();
  const auto lead = static_cast<unsigned char>(text[start - 1]);
  const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  return text.size() - (start - 1) == length;
}

TEST_CASE("a holder's command has spaces for NULs and control characters, and is cut at 200") {
  const std::string script =
      "import socket,sys\n"
      "s=socket.socket()\n"
      "s.bind(('127.0.0.1',0))\n"
      "s.listen()\n"
      "print(s.getsockname()[1],flush=True)\n"
      "sys.stdin.read()\n";
  std::string shown_script = script;
  std::replace(shown_script.begin(), shown_script.end(), '\n', ' ');
  // The cut falls in a run of 3-byte "€": in two of the three alignments, inside one. argv[0]
  // is not checked: a python3 on PATH may be a wrapper that executes another path.
  std::string euros;
  for (int i = 0; i < 70; ++i) euros += "\xe2\x82\xac";
  int cut_short = 0;
  for (const std::string shift : {"", "y", "yy"}) {
    CAPTURE(shift);
    ListeningChild child({}, {"python3", "-c", script, "a\tb", shift + euros});
    if (child.port() == 0) {
      MESSAGE("python3 is unavailable here: skipped");
      return;
    }
    const PortUse use = find_port_use(child.port());
    REQUIRE(use.holders.size() == 1);
    CHECK(use.holders[0].pid == child.pid());
    const std::string &command = use.holders[0].command;
    CAPTURE(command);
    const size_t tail = command.find(" -c " + shown_script + " a b " + shift + "\xe2\x82\xac");
    REQUIRE(tail != std::string::npos);
    REQUIRE(command.ends_with("..."));
    const std::string kept = command.substr(0, command.size() - 3);
    CHECK(kept.size() >= 195);
    CHECK(kept.size() <= 197);
    CHECK(ends_whole_utf8(kept));
    CHECK((" -c " + shown_script + " a b " + shift + euros).starts_with(kept.substr(tail)));
    if (kept.size() < 197) ++cut_short;
  }
  CHECK(cut_short == 2);
}

TEST_CASE("describe says who holds the port, or why nobody is named") {
  PortUse use;
  use.port = 29500;
  CHECK(describe(use) == "port 29500 is free");

  use.in_use = true;
  use.detail = "LISTEN on IPv4";
  use.holders = {{1234, "alice", "python train.py"}};
  CHECK(describe(use) ==
        "port 29500 is in use (LISTEN on IPv4) by pid 1234 (python train.py, user alice)");

  use.detail = "LISTEN on IPv4 and IPv6";
  use.holders.push_back({1240, "1001", "torchrun --nproc-per-node 8 train.py"});
  CHECK(describe(use) ==
        "port 29500 is in use (LISTEN on IPv4 and IPv6) by pid 1234 (python train.py, user "
        "alice), pid 1240 (torchrun --nproc-per-node 8 train.py, user 1001)");

  use.detail = "bound, IPv6";
  use.holders.clear();
  CHECK(describe(use) ==
        "port 29500 is in use (bound, IPv6) by a process perseusrun cannot see (run as root to "
        "name it)");

  use.detail = "FIN_WAIT1 on IPv4";
  use.orphaned = true;
  CHECK(describe(use) ==
        "port 29500 is in use (FIN_WAIT1 on IPv4) by no process: connections the kernel is still "
        "closing");
}

}  // namespace
}  // namespace perseus::launch
