#include "lib/launch/remote/ssh_session.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/remote/known_hosts.h"

namespace perseus::launch {

namespace {

constexpr int kKeepaliveSeconds = 10;
constexpr size_t kRelayChunk = 64 * 1024;
// libssh2 1.10 signs with RSA keys only as ssh-rsa (SHA-1), which OpenSSH 8.8 and later refuse.
constexpr const char *kRsaNote =
    ". RSA keys need libssh2 1.11 or later (this perseusrun has " LIBSSH2_VERSION
    "): use an ed25519 or ECDSA key, or --rsh ssh";

bool looks_like_rsa(const std::string &key) {
  std::ifstream pub(key + ".pub");
  std::string type;
  pub >> type;
  return type == "ssh-rsa" ||
         std::filesystem::path(key).filename().string().find("rsa") != std::string::npos;
}

std::string address_of(const sockaddr_storage &address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(address).sin_addr, text, sizeof text);
  } else if (address.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(address).sin6_addr, text,
              sizeof text);
  }
  return text;
}

// Connects without blocking longer than `timeout_ms`; returns errno-style failure text or "".
std::string connect_with_timeout(int fd, const addrinfo &address, int timeout_ms) {
  set_nonblocking(fd);
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0 && errno != EINPROGRESS) {
    return std::strerror(errno);
  }
  pollfd p{fd, POLLOUT, 0};
  const int ready = retry_on_eintr([&] { return poll(&p, 1, timeout_ms); });
  if (ready == 0) return "no answer within " + std::to_string(timeout_ms / 1000) + " s";
  int error = 0;
  socklen_t length = sizeof error;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  if (error != 0) return std::strerror(error);
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return "";
}

std::string session_error(LIBSSH2_SESSION *session) {
  char *message = nullptr;
  libssh2_session_last_error(session, &message, nullptr, 0);
  return message ? message : "unknown libssh2 error";
}

// Relays one SSH channel to the launcher's socket, never blocking: bytes from the agent go to
// the socket as fast as the launcher takes them (and no faster: the SSH window holds the rest),
// bytes from the launcher go into the channel, the agent's stderr to `stderr_fd`. Any libssh2
// failure but EAGAIN ends the relay with lost() saying why: a dead connection never turns into
// a loop that spins.
class ChannelRelay {
 public:
  ChannelRelay(LIBSSH2_SESSION *session, LIBSSH2_CHANNEL *channel, int socket, int relay,
               int stderr_fd)
      : session_(session),
        channel_(channel),
        socket_(socket),
        relay_(relay),
        stderr_fd_(stderr_fd),
        buffer_(kRelayChunk) {}

  // One round of moving bytes; false once the relay is over (the agent's output ended, the
  // launcher's socket closed, or the connection failed).
  bool step();
  // Sleeps until the socket or the launcher's socket can make progress (at most a second,
  // for the keepalive), unless the last step made progress.
  void wait();

  const std::string &lost() const { return lost_; }
  bool said_anything() const { return said_anything_; }
  const std::string &first_stderr() const { return first_stderr_; }

 private:
  void read_channel();
  void read_channel_stderr();
  void write_launcher();
  void read_launcher();
  void write_channel();
  void send_eof();
  void keepalive();
  // True when `result` of libssh2's `what` is data (> 0); records a failure other than EAGAIN.
  bool check(ssize_t result, const char *what);

  LIBSSH2_SESSION *session_;
  LIBSSH2_CHANNEL *channel_;
  int socket_, relay_, stderr_fd_;
  std::vector<char> buffer_;
  std::string to_launcher_, to_channel_, first_stderr_, lost_;
  bool progress_ = false, relay_ended_ = false, launcher_gone_ = false, eof_sent_ = false;
  bool said_anything_ = false, socket_trouble_ = false;
};

bool ChannelRelay::step() {
  progress_ = false;
  read_channel();
  read_channel_stderr();
  write_launcher();
  read_launcher();
  write_channel();
  send_eof();
  keepalive();
  if (!lost_.empty() || launcher_gone_) return false;
  return !(to_launcher_.empty() && libssh2_channel_eof(channel_));
}

void ChannelRelay::read_channel() {
  // A launcher that is slow to read holds back the agent's output in the SSH window; a socket
  // in trouble is read anyway, to learn what happened.
  if (to_launcher_.size() >= kRelayChunk && !socket_trouble_) return;
  const ssize_t n = libssh2_channel_read(channel_, buffer_.data(), buffer_.size());
  if (!check(n, "reading the agent's output")) return;
  if (!said_anything_) write_all(stderr_fd_, first_stderr_);  // the agent started after all
  said_anything_ = progress_ = true;
  to_launcher_.append(buffer_.data(), static_cast<size_t>(n));
}

void ChannelRelay::read_channel_stderr() {
  const ssize_t n = libssh2_channel_read_stderr(channel_, buffer_.data(), buffer_.size());
  if (!check(n, "reading the agent's stderr")) return;
  // Until the agent speaks, stderr is the remote shell's (e.g. "not found"): it goes into the
  // error message instead of onto the terminal unprefixed.
  progress_ = true;
  const std::string_view text(buffer_.data(), static_cast<size_t>(n));
  if (said_anything_) {
    write_all(stderr_fd_, text);
  } else if (first_stderr_.size() < 4096) {
    first_stderr_.append(text);
  }
}

void ChannelRelay::write_launcher() {
  if (to_launcher_.empty()) return;
  const ssize_t n =
      send(relay_, to_launcher_.data(), to_launcher_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n > 0) {
    to_launcher_.erase(0, static_cast<size_t>(n));
    progress_ = true;
  } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    launcher_gone_ = true;
  }
}

void ChannelRelay::read_launcher() {
  if (!to_channel_.empty() || relay_ended_) return;
  const ssize_t n = recv(relay_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
  if (n > 0) to_channel_.assign(buffer_.data(), static_cast<size_t>(n));
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    relay_ended_ = true;
  }
}

void ChannelRelay::write_channel() {
  if (to_channel_.empty()) return;
  const ssize_t n = libssh2_channel_write(channel_, to_channel_.data(), to_channel_.size());
  if (!check(n, "writing to the agent")) return;
  to_channel_.erase(0, static_cast<size_t>(n));
  progress_ = true;
}

void ChannelRelay::send_eof() {
  if (!relay_ended_ || !to_channel_.empty() || eof_sent_) return;
  const int rc = libssh2_channel_send_eof(channel_);
  check(rc, "sending the end of the agent's input");
  eof_sent_ = rc != LIBSSH2_ERROR_EAGAIN;
}

void ChannelRelay::keepalive() {
  int next = 0;
  check(libssh2_keepalive_send(session_, &next), "sending an SSH keepalive");
}

// What a libssh2 failure on an established connection means, for the user.
std::string connection_failure(ssize_t code) {
  switch (code) {
    case LIBSSH2_ERROR_SOCKET_RECV:
    case LIBSSH2_ERROR_SOCKET_DISCONNECT:
      return "the host closed or reset the connection";
    case LIBSSH2_ERROR_SOCKET_SEND:
      return "cannot send to the host";
    case LIBSSH2_ERROR_TIMEOUT:
    case LIBSSH2_ERROR_SOCKET_TIMEOUT:
      return "the host stopped answering";
    default:
      return "the SSH session failed";
  }
}

bool ChannelRelay::check(ssize_t result, const char *what) {
  if (result > 0) return true;
  if (result < 0 && result != LIBSSH2_ERROR_EAGAIN && lost_.empty()) {
    lost_ = "the SSH connection was lost while " + std::string(what) + ": " +
            connection_failure(result) + " (libssh2 error " + std::to_string(result) + ": " +
            session_error(session_) + ")";
  }
  return false;
}

void ChannelRelay::wait() {
  if (progress_) return;
  const int directions = libssh2_session_block_directions(session_);
  short socket_events = 0;
  if (to_launcher_.size() < kRelayChunk) socket_events |= POLLIN;
  if (directions & LIBSSH2_SESSION_BLOCK_INBOUND && !to_channel_.empty()) socket_events |= POLLIN;
  if (directions & LIBSSH2_SESSION_BLOCK_OUTBOUND) socket_events |= POLLOUT;
  short relay_events = 0;
  if (to_channel_.empty() && !relay_ended_) relay_events |= POLLIN;
  if (!to_launcher_.empty()) relay_events |= POLLOUT;
  pollfd fds[2] = {{socket_, socket_events, 0}, {relay_events ? relay_ : -1, relay_events, 0}};
  poll(fds, 2, 1000);
  socket_trouble_ = (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0;
}

}  // namespace

void ssh_library_init() {
  static std::once_flag once;
  std::call_once(once, [] { libssh2_init(0); });
}

SshSession::SshSession(const SshTarget &target, const SshSettings &settings)
    : target_(target), settings_(settings) {
  connect_socket();
  owned_session_.reset(libssh2_session_init());
  session_ = owned_session_.get();
  if (!session_) fail("libssh2_session_init failed");
  handshake();
  verify_host_key(session_, target_.host, target_.port, settings_.home + "/.ssh/known_hosts",
                  settings_.accept_new);
  authenticate();
  libssh2_keepalive_config(session_, 1, kKeepaliveSeconds);
}

void SshSession::SessionDeleter::operator()(LIBSSH2_SESSION *session) const {
  libssh2_session_set_blocking(session, 1);
  libssh2_session_set_timeout(session, 2000);
  libssh2_session_disconnect(session, "perseusrun: done");
  libssh2_session_free(session);
}

void SshSession::fail(const std::string &what) {
  throw LaunchError("host " + target_.host + ": " + what);
}

void SshSession::connect_socket() {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  const std::string port = std::to_string(target_.port);
  if (const int error = getaddrinfo(target_.host.c_str(), port.c_str(), &hints, &found)) {
    fail(std::string("cannot resolve the name: ") + gai_strerror(error));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  std::string why;
  for (const addrinfo *a = found; a; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    why = connect_with_timeout(fd.get(), *a, settings_.connect_timeout_ms);
    if (why.empty()) {
      socket_ = std::move(fd);
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      getsockname(socket_.get(), reinterpret_cast<sockaddr *>(&address), &length);
      local_address_ = address_of(address);
      length = sizeof address;
      getpeername(socket_.get(), reinterpret_cast<sockaddr *>(&address), &length);
      peer_address_ = address_of(address);
      return;
    }
  }
  fail("cannot connect to port " + port + " (SSH): " + why +
       "; check that the host is up and runs sshd (--ssh-port, --ssh-connect-timeout)");
}

void SshSession::handshake() {
  libssh2_session_set_timeout(session_, settings_.connect_timeout_ms);
  const std::pair<int, const char *> methods[] = {
      {LIBSSH2_METHOD_CRYPT_CS, kSafeCiphers},
      {LIBSSH2_METHOD_CRYPT_SC, kSafeCiphers},
      {LIBSSH2_METHOD_MAC_CS, kSafeMacs},
      {LIBSSH2_METHOD_MAC_SC, kSafeMacs},
  };
  for (const auto &[method, preference] : methods) {
    if (libssh2_session_method_pref(session_, method, preference) != 0) {
      fail("cannot restrict the SSH methods to " + std::string(preference) + ": " +
           session_error(session_));
    }
  }
  const int rc = libssh2_session_handshake(session_, socket_.get());
  if (rc != 0) fail(handshake_failure(rc));
}

// Only a failed negotiation can be the methods' fault; a server that does not answer in time,
// or hangs up, is something else.
std::string SshSession::handshake_failure(int rc) const {
  if (rc == LIBSSH2_ERROR_TIMEOUT) {
    std::ostringstream seconds;
    seconds << settings_.connect_timeout_ms / 1000.0;
    return "the SSH handshake timed out: no answer from the SSH server within " + seconds.str() +
           " s (--ssh-connect-timeout); check that the host is not overloaded and that port " +
           std::to_string(target_.port) + " is its sshd (--ssh-port)";
  }
  if (rc == LIBSSH2_ERROR_KEX_FAILURE || rc == LIBSSH2_ERROR_METHOD_NONE) {
    return "SSH handshake failed: " + session_error(session_) +
           " (perseusrun allows only the ciphers " + kSafeCiphers + " and MACs " + kSafeMacs +
           ", which are safe from the Terrapin attack; the server must offer one of each)";
  }
  return "SSH handshake failed: " + session_error(session_) + " (libssh2 error " +
         std::to_string(rc) + "); check that port " + std::to_string(target_.port) +
         " is the host's sshd (--ssh-port)";
}

void SshSession::authenticate() {
  const std::string &user = target_.user;
  const char *offered =
      libssh2_userauth_list(session_, user.c_str(), static_cast<unsigned>(user.size()));
  if (libssh2_userauth_authenticated(session_)) return;
  std::vector<std::string> tried;
  auto try_key = [&](const std::string &key) {
    if (!std::filesystem::exists(key) ||
        std::find(tried.begin(), tried.end(), key) != tried.end()) {
      return false;
    }
    tried.push_back(key);
    const std::string pub = key + ".pub";
    return libssh2_userauth_publickey_fromfile_ex(
               session_, user.c_str(), static_cast<unsigned>(user.size()),
               std::filesystem::exists(pub) ? pub.c_str() : nullptr, key.c_str(), nullptr) == 0;
  };
  if (!settings_.identity.empty()) {
    if (!std::filesystem::exists(settings_.identity)) {
      fail("--ssh-identity " + settings_.identity + " does not exist");
    }
    if (try_key(settings_.identity)) return;
  }
  if (getenv("SSH_AUTH_SOCK")) {
    tried.push_back("ssh-agent");
    if (LIBSSH2_AGENT *agent = libssh2_agent_init(session_)) {
      bool ok = false;
      if (libssh2_agent_connect(agent) == 0 && libssh2_agent_list_identities(agent) == 0) {
        libssh2_agent_publickey *identity = nullptr, *previous = nullptr;
        while (!ok && libssh2_agent_get_identity(agent, &identity, previous) == 0) {
          ok = libssh2_agent_userauth(agent, user.c_str(), identity) == 0;
          previous = identity;
        }
        libssh2_agent_disconnect(agent);
      }
      libssh2_agent_free(agent);
      if (ok) return;
    }
  }
  for (const char *name : {"id_ed25519", "id_ecdsa", "id_rsa"}) {
    if (try_key(settings_.home + "/.ssh/" + name)) return;
  }
  std::string list;
  for (const auto &t : tried) list += (list.empty() ? "" : ", ") + t;
  fail("cannot log in as " + user + " (tried " + (list.empty() ? "no key: none found" : list) +
       "; the server accepts " + (offered ? offered : "?") +
       "); give a key with --ssh-identity FILE, load one into ssh-agent, or set the user "
       "with --ssh-user or user@host" +
       (std::any_of(tried.begin(), tried.end(), looks_like_rsa) ? kRsaNote : ""));
}

std::string SshSession::relay(const std::string &command, int relay, int stderr_fd,
                              const std::atomic<bool> &stop) {
  LIBSSH2_CHANNEL *channel = libssh2_channel_open_session(session_);
  if (!channel) fail("cannot open an SSH channel: " + session_error(session_));
  if (libssh2_channel_exec(channel, command.c_str()) != 0) {
    libssh2_channel_free(channel);
    fail("cannot run '" + command + "': " + session_error(session_));
  }
  libssh2_session_set_blocking(session_, 0);
  ChannelRelay link(session_, channel, socket_.get(), relay, stderr_fd);
  while (!stop && link.step()) link.wait();
  // A lost connection has nothing left to close, and a stopped one (the launcher gave up on
  // the host, which may not answer at all) is not waited for: its socket is shut, so that the
  // session's deleter fails at once instead of waiting out its timeout (after which libssh2
  // would leave the session unfreed), and the agent ends when its input does.
  if (!link.lost().empty() || stop) {
    shutdown(socket_.get(), SHUT_RDWR);
    return link.lost();
  }
  libssh2_session_set_blocking(session_, 1);
  libssh2_session_set_timeout(session_, 2000);
  libssh2_channel_close(channel);
  const int status = libssh2_channel_get_exit_status(channel);
  libssh2_channel_free(channel);
  if (link.said_anything()) return "";
  const std::string &first_stderr = link.first_stderr();
  const std::string line = first_stderr.substr(0, first_stderr.find('\n'));
  return "'" + command + "' exited with status " + std::to_string(status) +
         (line.empty() ? "" : ": " + line) +
         (status == 127 ? "; is perseusrun installed at that path there (--remote-perseusrun)?"
                        : "");
}

}  // namespace perseus::launch
