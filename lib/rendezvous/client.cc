#include "lib/rendezvous/client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

namespace perseus::rendezvous {

namespace {

using Clock = std::chrono::steady_clock;

// A connected blocking socket, or -1 with `why` set; never waits past `deadline`.
int connect_before(const addrinfo &address, Clock::time_point deadline, std::string &why) {
  const int fd = socket(address.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = strerror(errno);
    return -1;
  }
  int error = 0;
  if (connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd, POLLOUT, 0};
      socklen_t length = sizeof error;
      error = poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) == 1
                  ? (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length), error)
                  : ETIMEDOUT;
    }
  }
  if (error != 0) {
    why = strerror(error);
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int connect_to(const std::string &host, int port, Clock::time_point deadline,
               const std::string &where) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    throw WireError("rendezvous " + where + ": cannot resolve the address");
  }
  std::string why = "no address";
  for (;;) {  // the server may not be listening yet: retry until the deadline
    for (const addrinfo *a = found; a; a = a->ai_next) {
      const int fd = connect_before(*a, deadline, why);
      if (fd >= 0) {
        freeaddrinfo(found);
        return fd;
      }
    }
    if (Clock::now() >= deadline) break;
    usleep(50000);
  }
  freeaddrinfo(found);
  throw WireError("rendezvous " + where + ": cannot connect: " + why);
}

}  // namespace

Client::Client(const std::string &host, int port, const Secret &secret,
               std::chrono::milliseconds timeout)
    : where_(host + ":" + std::to_string(port)) {
  const auto deadline = Clock::now() + timeout;
  fd_ = connect_to(host, port, deadline, where_);
  try {
    while (in_.size() < kNonceSize) receive_some(deadline);
    Nonce server{};
    std::memcpy(server.data(), in_.data(), kNonceSize);
    in_.erase(0, kNonceSize);
    const Nonce client = random_nonce();
    send_all(hello_proof(secret, server, client));
    send_.emplace(secret, server, client, 'C');
    receive_.emplace(secret, server, client, 'S');
  } catch (...) {
    close(fd_);
    throw;
  }
}

Client::~Client() {
  if (fd_ >= 0) close(fd_);
}

void Client::send_all(const std::string &bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw WireError("rendezvous " + where_ + ": send: " + strerror(errno));
    sent += static_cast<size_t>(n);
  }
}

void Client::receive_some(Clock::time_point deadline) {
  for (;;) {
    // Rounded up, so that poll never wakes before the deadline it was given.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw TimeoutError("rendezvous " + where_ + ": no answer in time");
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) != 0) break;
  }
  char chunk[64 * 1024];
  const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    throw WireError("rendezvous " + where_ +
                    ": the server closed the connection (is this "
                    "the job's secret?)");
  }
  in_.append(chunk, static_cast<size_t>(n));
}

Message Client::call(const Message &request, std::chrono::milliseconds timeout) {
  if (!broken_.empty()) {
    throw WireError("rendezvous " + where_ + ": this connection failed earlier (" + broken_ +
                    "); connect again");
  }
  std::optional<Message> reply;
  try {
    send_all(send_->seal(request));
    const auto deadline = Clock::now() + timeout;
    while (!(reply = receive_->open(in_))) receive_some(deadline);
  } catch (const WireError &error) {
    broken_ = error.what();
    throw;
  }
  // A refusal is a whole answer: the connection stays in step and usable.
  if (reply->op == Op::kError) throw WireError("rendezvous " + where_ + ": " + reply->value);
  return *reply;
}

void Client::set(const std::string &key, const std::string &value) {
  call({Op::kSet, key, value}, std::chrono::seconds(60));
}

std::string Client::get(const std::string &key, std::chrono::milliseconds timeout) {
  try {
    return call({Op::kGet, key, ""}, timeout).value;
  } catch (const TimeoutError &error) {
    throw TimeoutError(std::string(error.what()) + " (waiting for key '" + key + "')");
  } catch (const WireError &error) {
    throw WireError(std::string(error.what()) + " (waiting for key '" + key + "')");
  }
}

int64_t Client::add(const std::string &key, int64_t delta) {
  return std::stoll(call({Op::kAdd, key, std::to_string(delta)}, std::chrono::seconds(60)).value);
}

bool Client::check(const std::string &key) {
  return call({Op::kCheck, key, ""}, std::chrono::seconds(60)).value == "1";
}

Secret Client::read_secret_file(const std::string &path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    throw WireError("PERSEUS_SECRET_FILE " + path + ": " + strerror(errno));
  }
  if ((info.st_mode & 077) != 0) {
    throw WireError("PERSEUS_SECRET_FILE " + path + " may be read by others (mode " +
                    std::to_string(info.st_mode & 0777) + "); it must be 0600");
  }
  std::ifstream file(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.size() != kSecretSize) {
    throw WireError("PERSEUS_SECRET_FILE " + path + " holds " + std::to_string(text.size()) +
                    " bytes, not " + std::to_string(kSecretSize));
  }
  Secret secret{};
  std::memcpy(secret.data(), text.data(), kSecretSize);
  return secret;
}

}  // namespace perseus::rendezvous
