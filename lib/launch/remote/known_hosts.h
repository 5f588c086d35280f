#pragma once
// Host key checking against an OpenSSH known_hosts file (hashed entries too), with libssh2's
// knownhost API. Unknown and changed keys stop the connection unless the user chose
// --ssh-accept-new, which trusts and records a key seen for the first time (never a changed
// one).

#include <libssh2.h>

#include <string>

namespace perseus::launch {

// "SHA256:<base64>" as OpenSSH prints it, of the key the session's server presented.
std::string host_key_fingerprint(LIBSSH2_SESSION *session);

// Checks the session's host key for `host`:`port` against `known_hosts_path`. Throws
// LaunchError naming the host, the key's type and fingerprint and what to do, when the key is
// unknown (and !accept_new) or changed.
void verify_host_key(LIBSSH2_SESSION *session, const std::string &host, int port,
                     const std::string &known_hosts_path, bool accept_new);

}  // namespace perseus::launch
