#pragma once
// One SSH connection made with libssh2: connect (bounded by the connect timeout), handshake
// with methods the Terrapin attack (CVE-2023-48795) cannot use, host key check, log in; then
// run one command and relay its stdin/stdout to a local socket.
//
// Threading: a session belongs to the thread that made it. libssh2 is initialised once per
// process (ssh_library_init) before any thread makes a session.

#include <libssh2.h>

#include <atomic>
#include <memory>
#include <string>

#include "lib/launch/system_call.h"

namespace perseus::launch {

struct SshTarget {
  std::string host;
  std::string user;  // resolved: never empty
  int port = 22;
};

struct SshSettings {
  std::string identity;  // tried before ssh-agent and ~/.ssh/id_*
  std::string home;      // where ~/.ssh is
  bool accept_new = false;
  int connect_timeout_ms = 10000;
};

// Ciphers and MACs that are not open to the Terrapin prefix-truncation attack: CTR-mode AES
// with non-EtM HMAC-SHA2 (neither ChaCha20-Poly1305 nor any -etm MAC nor CBC).
inline constexpr const char *kSafeCiphers = "aes256-ctr,aes192-ctr,aes128-ctr";
inline constexpr const char *kSafeMacs = "hmac-sha2-256,hmac-sha2-512";

void ssh_library_init();

class SshSession {
 public:
  // Throws LaunchError naming the host and the cause (unreachable, refused, host key, login).
  SshSession(const SshTarget &target, const SshSettings &settings);
  ~SshSession() = default;
  SshSession(const SshSession &) = delete;
  SshSession &operator=(const SshSession &) = delete;

  // Runs `command` through the remote login shell, relays `relay` <-> its stdin/stdout and its
  // stderr to `stderr_fd`, until its stdout ends or `stop` is set. Returns a description of
  // how it ended when that was not a clean end ("" otherwise), e.g. the exit status and the
  // first line of stderr of a remote command that failed before saying anything.
  std::string relay(const std::string &command, int relay, int stderr_fd,
                    const std::atomic<bool> &stop);

  // This machine's address on the connection (what the host reaches us at), and the host's.
  const std::string &local_address() const { return local_address_; }
  const std::string &peer_address() const { return peer_address_; }

 private:
  void connect_socket();
  void handshake();
  std::string handshake_failure(int rc) const;
  void authenticate();
  [[noreturn]] void fail(const std::string &what);

  // Disconnects and frees; a member, so that a constructor that throws half-way frees too.
  struct SessionDeleter {
    void operator()(LIBSSH2_SESSION *session) const;
  };

  SshTarget target_;
  SshSettings settings_;
  UniqueFd socket_;
  std::unique_ptr<LIBSSH2_SESSION, SessionDeleter> owned_session_;
  LIBSSH2_SESSION *session_ = nullptr;  // owned_session_.get()
  std::string local_address_;
  std::string peer_address_;
};

}  // namespace perseus::launch
