#include "lib/launch/remote/known_hosts.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <mutex>

#include "lib/launch/errors.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {

namespace {

std::string base64_unpadded(const unsigned char *bytes, size_t size) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text;
  for (size_t i = 0; i < size; i += 3) {
    uint32_t group = static_cast<uint32_t>(bytes[i]) << 16;
    if (i + 1 < size) group |= static_cast<uint32_t>(bytes[i + 1]) << 8;
    if (i + 2 < size) group |= bytes[i + 2];
    const size_t chars = size - i >= 3 ? 4 : size - i + 1;
    for (size_t c = 0; c < chars; ++c) text += kAlphabet[(group >> (18 - 6 * c)) & 63];
  }
  return text;
}

struct KeyType {
  int knownhost_bit;
  const char *name;
};

KeyType key_type(int hostkey_type) {
  switch (hostkey_type) {
    case LIBSSH2_HOSTKEY_TYPE_RSA:
      return {LIBSSH2_KNOWNHOST_KEY_SSHRSA, "ssh-rsa"};
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_256:
      return {LIBSSH2_KNOWNHOST_KEY_ECDSA_256, "ecdsa-sha2-nistp256"};
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_384:
      return {LIBSSH2_KNOWNHOST_KEY_ECDSA_384, "ecdsa-sha2-nistp384"};
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_521:
      return {LIBSSH2_KNOWNHOST_KEY_ECDSA_521, "ecdsa-sha2-nistp521"};
    case LIBSSH2_HOSTKEY_TYPE_ED25519:
      return {LIBSSH2_KNOWNHOST_KEY_ED25519, "ssh-ed25519"};
    default:
      return {LIBSSH2_KNOWNHOST_KEY_UNKNOWN, "unknown"};
  }
}

// How OpenSSH names a host in known_hosts: "host", or "[host]:port" off port 22.
std::string entry_name(const std::string &host, int port) {
  return port == 22 ? host : "[" + host + "]:" + std::to_string(port);
}

// Appends one line; several sessions may record keys at once.
void append_line(const std::string &path, const std::string &line) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid() || !write_all(fd.get(), line)) throw_system_error("append to", path);
}

using KnownHostsPtr = std::unique_ptr<LIBSSH2_KNOWNHOSTS, decltype(&libssh2_knownhost_free)>;

}  // namespace

std::string host_key_fingerprint(LIBSSH2_SESSION *session) {
  const char *hash = libssh2_hostkey_hash(session, LIBSSH2_HOSTKEY_HASH_SHA256);
  if (!hash) return "SHA256:?";
  return "SHA256:" + base64_unpadded(reinterpret_cast<const unsigned char *>(hash), 32);
}

void verify_host_key(LIBSSH2_SESSION *session, const std::string &host, int port,
                     const std::string &known_hosts_path, bool accept_new) {
  size_t length = 0;
  int type = 0;
  const char *key = libssh2_session_hostkey(session, &length, &type);
  if (!key) throw LaunchError("host " + host + ": the server sent no host key");
  const KeyType kind = key_type(type);
  const std::string described = std::string(kind.name) + " key " + host_key_fingerprint(session);
  KnownHostsPtr known(libssh2_knownhost_init(session), libssh2_knownhost_free);
  if (!known) throw LaunchError("host " + host + ": libssh2_knownhost_init failed");
  // A missing file is an empty one: every host is then unknown.
  libssh2_knownhost_readfile(known.get(), known_hosts_path.c_str(), LIBSSH2_KNOWNHOST_FILE_OPENSSH);
  const int mask = LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | kind.knownhost_bit;
  libssh2_knownhost *found = nullptr;
  const int result =
      libssh2_knownhost_checkp(known.get(), host.c_str(), port, key, length, mask, &found);
  if (result == LIBSSH2_KNOWNHOST_CHECK_MATCH) return;
  if (result == LIBSSH2_KNOWNHOST_CHECK_MISMATCH) {
    throw LaunchError("host " + host + " presented " + described +
                      ", which does not match its entry in " + known_hosts_path +
                      ": the host key has CHANGED. Someone may be intercepting the connection, "
                      "or the host was reinstalled; if you know it was, remove the old key with "
                      "'ssh-keygen -R " +
                      entry_name(host, port) + "' and connect again");
  }
  if (!accept_new) {
    throw LaunchError("host " + host + " presented " + described + ", which is not in " +
                      known_hosts_path +
                      "; check the fingerprint and add the key (for example by logging in "
                      "once with ssh), or run with --ssh-accept-new to trust first-seen keys");
  }
  libssh2_knownhost *added = nullptr;
  const std::string name = entry_name(host, port);
  char line[8192];
  size_t line_length = 0;
  if (libssh2_knownhost_addc(known.get(), name.c_str(), nullptr, key, length, nullptr, 0, mask,
                             &added) != 0 ||
      libssh2_knownhost_writeline(known.get(), added, line, sizeof line, &line_length,
                                  LIBSSH2_KNOWNHOST_FILE_OPENSSH) != 0) {
    throw LaunchError("host " + host + ": could not record its key in " + known_hosts_path);
  }
  append_line(known_hosts_path, std::string(line, line_length));
}

}  // namespace perseus::launch
