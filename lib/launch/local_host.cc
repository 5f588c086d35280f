#include "lib/launch/local_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "lib/launch/system_call.h"

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

std::string interface_address(const std::string &name) {
  ifaddrs *list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string v4, v6;
  for (ifaddrs *entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || name != entry->ifa_name) continue;
    if (entry->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = address_text(entry->ifa_addr);
    if (entry->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = address_text(entry->ifa_addr);
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

std::string route_source_address(const std::string &host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), "22", &hints, &found) != 0 || !found) return "";
  std::string address;
  UniqueFd fd(socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (fd.valid() && connect(fd.get(), found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd.get(), reinterpret_cast<sockaddr *>(&local), &length) == 0) {
    address = address_text(reinterpret_cast<const sockaddr *>(&local));
  }
  freeaddrinfo(found);
  return address;
}

int free_tcp_port() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  socklen_t length = sizeof address;
  if (!fd.valid() || bind(fd.get(), reinterpret_cast<sockaddr *>(&address), length) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr *>(&address), &length) != 0) {
    throw_system_error("bind", "to find a free port for MASTER_PORT");
  }
  return ntohs(address.sin_port);
}

std::string current_user() {
  const passwd *entry = getpwuid(getuid());
  if (entry) return entry->pw_name;
  const char *user = getenv("USER");
  return user ? user : "root";
}

std::string home_directory() {
  if (const char *home = getenv("HOME"); home && *home) return home;
  const passwd *entry = getpwuid(getuid());
  return entry ? entry->pw_dir : "/";
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

}  // namespace perseus::launch
