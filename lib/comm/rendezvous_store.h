#pragma once
// Gloo's rendezvous store over the job's key-value store (lib/rendezvous), so that Gloo's ranks
// exchange their addresses through the authenticated store perseusrun serves instead of a
// shared file system or a Redis server.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "lib/rendezvous/client.h"

namespace perseus::comm {

class RendezvousStore : public ::gloo::rendezvous::Store {
 public:
  // Keys are put under `prefix` (a job's successive perseus_init calls use fresh prefixes). A
  // get waits at most `timeout`. `client` must outlive the store; one thread at a time.
  RendezvousStore(rendezvous::Client &client, std::string prefix, int rank,
                  std::chrono::milliseconds timeout);

  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

 private:
  std::string fetch(const std::string &key, std::chrono::milliseconds timeout);

  rendezvous::Client &client_;
  std::string prefix_;
  int rank_;
  std::chrono::milliseconds timeout_;
  // What wait() fetched, so that Gloo's get() right after it needs no second round trip.
  std::map<std::string, std::string> fetched_;
};

}  // namespace perseus::comm
