#include "lib/launch/planning/host_identity.h"

#include <netdb.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>
#include <map>
#include <memory>
#include <optional>

#include "lib/launch/local_host.h"

namespace perseus::launch {

namespace {

constexpr const char *kThisMachine = "this machine";

std::vector<std::string> resolved_addresses(const std::string &host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {};
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  std::vector<std::string> addresses;
  for (const addrinfo *a = found; a; a = a->ai_next) {
    char text[NI_MAXHOST] = {};
    if (getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      addresses.emplace_back(text);
    }
  }
  return addresses;
}

// Names seen so far, by what identifies their machine ("this machine", or an address), each
// mapped to the first name that had it.
class NameTable {
 public:
  explicit NameTable(const ResolveHost &resolve) : resolve_(resolve) {}

  const std::string &canonical(const std::string &name) {
    auto [it, inserted] = canonical_.try_emplace(name, name);
    if (inserted) it->second = first_name_for(name);
    return it->second;
  }

 private:
  std::string first_name_for(const std::string &name) {
    const HostAddresses found = resolve_(name);
    std::vector<std::string> keys = found.addresses;
    if (found.this_machine) keys.insert(keys.begin(), kThisMachine);
    std::optional<std::string> first;
    for (const std::string &key : keys) {
      if (auto it = owner_.find(key); it != owner_.end()) {
        first = it->second;
        break;
      }
    }
    const std::string chosen = first.value_or(name);
    for (const std::string &key : keys) owner_.try_emplace(key, chosen);
    if (chosen != name) spdlog::debug("host {} is the same machine as host {}", name, chosen);
    return chosen;
  }

  const ResolveHost &resolve_;
  std::map<std::string, std::string> canonical_;  // name -> first name of its machine
  std::map<std::string, std::string> owner_;      // key -> first name that had it
};

}  // namespace

HostAddresses resolve_host(const std::string &host) {
  HostAddresses found{is_local_host(host), resolved_addresses(host)};
  for (const std::string &address : found.addresses) {
    found.this_machine = found.this_machine || is_local_host(address);
  }
  return found;
}

std::vector<HostSpec> unify_host_names(std::vector<HostSpec> mentions, const ResolveHost &resolve) {
  NameTable names(resolve);
  for (HostSpec &spec : mentions) spec.host = names.canonical(spec.host);
  return mentions;
}

}  // namespace perseus::launch
