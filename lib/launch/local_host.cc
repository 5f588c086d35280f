#include "lib/launch/local_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>

namespace perseus::launch {

namespace {

std::string address_text(const sockaddr *address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(address)->sin_addr, text,
              sizeof text);
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(address)->sin6_addr, text,
              sizeof text);
  }
  return text;
}

bool is_interface_address(const std::string &host) {
  ifaddrs *list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs *entry = list; entry && !found; entry = entry->ifa_next) {
    if (entry->ifa_addr) found = address_text(entry->ifa_addr) == host;
  }
  freeifaddrs(list);
  return found;
}

bool is_loopback_literal(const std::string &host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

std::string local_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

bool is_local_host(const std::string &host) {
  return host == "localhost" || is_loopback_literal(host) || host == local_hostname() ||
         is_interface_address(host);
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

}  // namespace perseus::launch
