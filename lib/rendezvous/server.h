#pragma once
// The job's key-value store, served by the launcher on one address (never the wildcard) for
// the ranks' rendezvous: set, get (waits until the key is set), add, check. Every connection
// must prove it knows the job's secret before anything else (wire.h); a connection that fails
// any check is dropped and counted (dropped()), and the store goes on serving the others.
// Connections that have not proved the secret never keep out one that will: at the limit the
// oldest of them is evicted.
//
// Threading: the server runs its own thread, started by the constructor and joined by the
// destructor; the store lives only on that thread.

#include <memory>
#include <optional>
#include <string>

#include "lib/rendezvous/wire.h"

namespace perseus::rendezvous {

class Server {
 public:
  // Binds `address` (an IPv4 or IPv6 literal) on an ephemeral port. Throws WireError naming the
  // address when it cannot.
  Server(const Secret &secret, const std::string &address);
  ~Server();
  Server(const Server &) = delete;
  Server &operator=(const Server &) = delete;

  // Sets a key from the launcher's own thread (any thread): the launcher tells the ranks
  // through the store which rank ended and how ("perseus/exit/<rank>").
  void publish(const std::string &key, const std::string &value);
  // A key's value as the store holds it now, if set (the launcher reads what ranks declared).
  std::optional<std::string> lookup(const std::string &key) const;

  const std::string &address() const;
  int port() const;
  // Connections dropped so far for failing a check (for tests and -v).
  int dropped() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace perseus::rendezvous
