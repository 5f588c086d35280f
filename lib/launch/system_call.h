#pragma once
// Thin wrappers around the system calls lib/launch makes: each failure names the call, the
// object it was made on and the system's reason, and EINTR is retried where it is made.

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

namespace perseus::launch {

// Throws LaunchError "<call> <what>: <strerror(errno)>". Reads errno, so call it first.
[[noreturn]] void throw_system_error(std::string_view call, std::string_view what);

// Runs `call` until it does not fail with EINTR.
template <typename Call>
auto retry_on_eintr(Call call) {
  for (;;) {
    auto result = call();
    if (!(result == -1 && errno == EINTR)) return result;
  }
}

void set_nonblocking(int fd);

// Writes all of `data` to a blocking fd; false when the peer is gone (EPIPE) or on error.
bool write_all(int fd, std::string_view data);

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd &operator=(UniqueFd &&other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd &) = delete;
  UniqueFd &operator=(const UniqueFd &) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read_end;
  UniqueFd write_end;
};

// A pipe whose ends are close-on-exec.
Pipe make_pipe();

// Milliseconds on the monotonic clock.
long long monotonic_ms();

}  // namespace perseus::launch
