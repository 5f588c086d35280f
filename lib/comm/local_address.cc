#include "lib/comm/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

struct AddrinfoFree {
  void operator()(addrinfo *a) const { freeaddrinfo(a); }
};

Error failed(const std::string &what, const std::string &where, const std::string &why) {
  return Error(Code::kRendezvous, "finding the local address toward the rendezvous store " + where +
                                      ": " + what + ": " + why);
}

std::string text_of(const sockaddr_storage &address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void *raw =
      address.ss_family == AF_INET6
          ? static_cast<const void *>(&reinterpret_cast<const sockaddr_in6 *>(&address)->sin6_addr)
          : &reinterpret_cast<const sockaddr_in *>(&address)->sin_addr;
  inet_ntop(address.ss_family, raw, text, sizeof text);
  return text;
}

}  // namespace

std::string address_toward(const std::string &host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw failed("getaddrinfo", where, gai_strerror(rc));
  std::unique_ptr<addrinfo, AddrinfoFree> owner(found);
  const int fd = socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw failed("socket", where, strerror(errno));
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  const bool ok = connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr *>(&local), &length) == 0;
  const int saved = errno;
  close(fd);
  if (!ok) throw failed("connect/getsockname (UDP)", where, strerror(saved));
  return text_of(local);
}

}  // namespace perseus::comm
