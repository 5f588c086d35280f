#include "lib/launch/system_call.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

#include "lib/launch/errors.h"

namespace perseus::launch {

void throw_system_error(std::string_view call, std::string_view what) {
  const int saved = errno;
  std::string message(call);
  if (!what.empty()) message.append(" ").append(what);
  message.append(": ").append(std::strerror(saved));
  throw LaunchError(message);
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags == -1 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) == -1) {
    throw_system_error("fcntl(O_NONBLOCK)", "on fd " + std::to_string(fd));
  }
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = retry_on_eintr([&] { return ::write(fd, data.data(), data.size()); });
    if (n < 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) == -1) throw_system_error("pipe2", "");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

long long monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace perseus::launch
