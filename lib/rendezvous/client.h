#pragma once
// A rank's connection to the job's key-value store (server.h). Blocking calls; one
// connection, used from one thread at a time. Any failure throws WireError naming the server,
// and leaves the connection unusable (a late answer could otherwise be taken for the next
// call's): make a new Client to go on.

#include <chrono>
#include <cstdint>
#include <string>

#include "lib/rendezvous/wire.h"

namespace perseus::rendezvous {

class Client {
 public:
  // Connects to host:port and proves the secret; gives up after `timeout`.
  Client(const std::string &host, int port, const Secret &secret,
         std::chrono::milliseconds timeout);
  ~Client();
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;

  void set(const std::string &key, const std::string &value);
  // Waits until the key is set, at most `timeout` (then TimeoutError naming the key).
  std::string get(const std::string &key, std::chrono::milliseconds timeout);
  int64_t add(const std::string &key, int64_t delta);
  bool check(const std::string &key);

  // Reads the secret perseusrun wrote for this rank (PERSEUS_SECRET_FILE): exactly 32 bytes in
  // a file only its owner may read.
  static Secret read_secret_file(const std::string &path);

 private:
  Message call(const Message &request, std::chrono::milliseconds timeout);
  void send_all(const std::string &bytes);
  void receive_some(std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::string where_;
  std::string in_;
  std::optional<Channel> send_;
  std::optional<Channel> receive_;
  std::string broken_;  // why an earlier call failed; "" while usable
};

}  // namespace perseus::rendezvous
