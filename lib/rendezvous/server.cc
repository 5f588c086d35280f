#include "lib/rendezvous/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace perseus::rendezvous {

namespace {

// A peer must say hello within this time; then it may stay as long as it likes.
constexpr auto kHelloDeadline = std::chrono::seconds(10);
// Past this many connections, one that has not proved the secret is evicted for a newcomer.
constexpr size_t kMaxConnections = 1024;
constexpr size_t kReadChunk = 64 * 1024;

struct Connection {
  int fd = -1;
  Nonce server_nonce{};
  std::optional<Channel> receive;  // set once the hello was right
  std::optional<Channel> send;
  std::string in;
  std::string out;
  std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
  std::string peer;
};

std::string peer_name(const sockaddr_storage &address) {
  char host[INET6_ADDRSTRLEN] = "?";
  char port[8] = "?";
  getnameinfo(reinterpret_cast<const sockaddr *>(&address), sizeof address, host, sizeof host, port,
              sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + port;
}

int listen_on(const std::string &address, int &port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo *found = nullptr;
  if (getaddrinfo(address.c_str(), "0", &hints, &found) != 0 || !found) {
    throw WireError("rendezvous: '" + address + "' is not an IP address to listen on");
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const bool ok =
      fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 1024) == 0;
  freeaddrinfo(found);
  if (!ok) {
    const std::string why = strerror(errno);
    if (fd >= 0) close(fd);
    throw WireError("rendezvous: cannot listen on " + address + ": " + why);
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &length);
  port = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in &>(bound).sin_port
                                          : reinterpret_cast<sockaddr_in6 &>(bound).sin6_port);
  return fd;
}

std::optional<int64_t> to_int64(const std::string &text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

struct Server::State {
  Secret secret;
  std::string address;
  int port = 0;
  int listener = -1;
  int wake[2] = {-1, -1};
  std::atomic<int> dropped{0};
  std::list<Connection> connections;
  std::map<std::string, std::string> store;  // written by the server's thread alone, in put()
  mutable std::mutex store_mutex;            // put()'s writes against lookup() from others
  std::map<std::string, std::vector<Connection *>> waiting;  // GETs of keys not set yet
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex inbox_mutex;  // publish() from other threads
  std::vector<std::pair<std::string, std::string>> inbox;

  void run();
  void accept_all();
  void serve(Connection &c);
  void handle(Connection &c, const Message &request);
  void put(const std::string &key, const std::string &value);
  void reply(Connection &c, Op op, const std::string &value);
  void evict_oldest_unproven();
  void drop(std::list<Connection>::iterator it, const std::string &why);
};

void Server::State::run() {
  while (!stop) {
    std::vector<pollfd> fds{{wake[0], POLLIN, 0}, {listener, POLLIN, 0}};
    for (const Connection &c : connections) {
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    }
    poll(fds.data(), fds.size(), 1000);
    if (fds[0].revents & POLLIN) {
      char drain[64];
      (void)!read(wake[0], drain, sizeof drain);
      std::vector<std::pair<std::string, std::string>> published;
      {
        std::lock_guard lock(inbox_mutex);
        published.swap(inbox);
      }
      for (const auto &[key, value] : published) put(key, value);
    }
    if (fds[1].revents) accept_all();
    size_t i = 2;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = connections.begin(); it != connections.end() && i < fds.size(); ++i) {
      Connection &c = *it;
      try {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) serve(c);
        if (!c.out.empty()) {
          const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) c.out.erase(0, static_cast<size_t>(n));
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) throw WireError("peer gone");
        }
        if (!c.receive && now - c.accepted > kHelloDeadline) throw WireError("no hello in time");
        ++it;
      } catch (const WireError &error) {
        auto next = std::next(it);
        drop(it, error.what());
        it = next;
      }
    }
  }
}

void Server::State::accept_all() {
  for (;;) {
    sockaddr_storage from{};
    socklen_t length = sizeof from;
    const int fd = accept4(listener, reinterpret_cast<sockaddr *>(&from), &length,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (connections.size() >= kMaxConnections) evict_oldest_unproven();
    if (connections.size() >= kMaxConnections) {
      close(fd);
      ++dropped;
      continue;
    }
    Connection &c = connections.emplace_back();
    c.fd = fd;
    c.peer = peer_name(from);
    c.server_nonce = random_nonce();
    c.out.assign(reinterpret_cast<const char *>(c.server_nonce.data()), kNonceSize);
  }
}

// Peers that have not proved the secret cannot crowd out those that will: the oldest of them
// makes room for a newcomer, who gets its chance to say hello.
void Server::State::evict_oldest_unproven() {
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    if (!it->receive) {
      drop(it, "evicted before its hello");
      return;
    }
  }
}

void Server::State::serve(Connection &c) {
  char chunk[kReadChunk];
  const ssize_t n = recv(c.fd, chunk, sizeof chunk, MSG_DONTWAIT);
  if (n == 0) throw WireError("closed");
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    throw WireError(strerror(errno));
  }
  c.in.append(chunk, static_cast<size_t>(n));
  if (!c.receive) {
    if (c.in.size() < kHelloSize) return;
    if (!check_hello(secret, c.server_nonce, std::string_view(c.in).substr(0, kHelloSize))) {
      throw WireError("refused a hello without the job's secret");
    }
    Nonce client{};
    std::memcpy(client.data(), c.in.data(), kNonceSize);
    c.receive.emplace(secret, c.server_nonce, client, 'C');
    c.send.emplace(secret, c.server_nonce, client, 'S');
    c.in.erase(0, kHelloSize);
  }
  while (auto request = c.receive->open(c.in)) handle(c, *request);
}

void Server::State::handle(Connection &c, const Message &request) {
  switch (request.op) {
    case Op::kSet:
      put(request.key, request.value);
      reply(c, Op::kReply, "");
      break;
    case Op::kGet: {
      const auto found = store.find(request.key);
      if (found != store.end()) {
        reply(c, Op::kReply, found->second);
      } else {
        waiting[request.key].push_back(&c);
      }
      break;
    }
    case Op::kAdd: {
      const auto delta = to_int64(request.value);
      const auto current = store.count(request.key) ? to_int64(store[request.key]) : 0;
      int64_t sum = 0;
      if (!delta || !current || __builtin_add_overflow(*current, *delta, &sum)) {
        reply(c, Op::kError,
              "add needs integers whose sum fits in 64 bits: key '" + request.key + "'");
        break;
      }
      put(request.key, std::to_string(sum));
      reply(c, Op::kReply, store[request.key]);
      break;
    }
    case Op::kCheck:
      reply(c, Op::kReply, store.count(request.key) ? "1" : "0");
      break;
    default:
      throw WireError("refused a request with a reply's op");
  }
}

// Sets a key and answers every GET that was waiting for it.
void Server::State::put(const std::string &key, const std::string &value) {
  {
    std::lock_guard lock(store_mutex);
    store[key] = value;
  }
  const auto waiters = waiting.find(key);
  if (waiters == waiting.end()) return;
  for (Connection *waiter : waiters->second) reply(*waiter, Op::kReply, value);
  waiting.erase(waiters);
}

void Server::State::reply(Connection &c, Op op, const std::string &value) {
  c.out += c.send->seal(Message{op, "", value});
}

void Server::State::drop(std::list<Connection>::iterator it, const std::string &why) {
  if (why != "closed") ++dropped;
  for (auto &[key, waiters] : waiting) std::erase(waiters, &*it);
  close(it->fd);
  connections.erase(it);
}

Server::Server(const Secret &secret, const std::string &address) : state_(new State) {
  state_->secret = secret;
  state_->address = address;
  state_->listener = listen_on(address, state_->port);
  if (pipe2(state_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(state_->listener);
    throw WireError("rendezvous: pipe2 failed");
  }
  state_->thread = std::thread([state = state_.get()] { state->run(); });
}

Server::~Server() {
  state_->stop = true;
  (void)!write(state_->wake[1], "x", 1);
  state_->thread.join();
  for (Connection &c : state_->connections) close(c.fd);
  close(state_->listener);
  close(state_->wake[0]);
  close(state_->wake[1]);
}

void Server::publish(const std::string &key, const std::string &value) {
  {
    std::lock_guard lock(state_->inbox_mutex);
    state_->inbox.emplace_back(key, value);
  }
  (void)!write(state_->wake[1], "x", 1);
}

std::optional<std::string> Server::lookup(const std::string &key) const {
  std::lock_guard lock(state_->store_mutex);
  const auto found = state_->store.find(key);
  if (found == state_->store.end()) return std::nullopt;
  return found->second;
}

const std::string &Server::address() const { return state_->address; }
int Server::port() const { return state_->port; }
int Server::dropped() const { return state_->dropped; }

}  // namespace perseus::rendezvous
