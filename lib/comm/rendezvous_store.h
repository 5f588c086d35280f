#pragma once
// Gloo's rendezvous store over the job's key-value store (lib/rendezvous), so that Gloo's ranks
// exchange their addresses through the authenticated store perseusrun serves instead of a
// shared file system or a Redis server.

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "lib/rendezvous/client.h"

namespace perseus::comm {

class RendezvousStore : public ::gloo::rendezvous::Store {
 public:
  // Keys are put under `prefix` (a job's successive perseus_init calls use fresh prefixes). A
  // get or wait waits at most `timeout` (naming the rank it waits for on stderr after 10 s); the
  // timeout Gloo passes to wait is for its connections and is not used. `client` must outlive
  // the store; one thread at a time.
  RendezvousStore(rendezvous::Client &client, std::string prefix, int rank,
                  std::chrono::milliseconds timeout);
  // An elastic world's join: while a key is awaited, `abandoned_key` is looked at every 20 ms
  // (the key is then polled, not waited for), and once it is set the wait ends with
  // Error(kCommunication) giving its value (the world ended: a peer will never come).
  void give_up_when(std::string abandoned_key) { abandoned_key_ = std::move(abandoned_key); }
  ~RendezvousStore() override;
  RendezvousStore(const RendezvousStore &) = delete;
  RendezvousStore &operator=(const RendezvousStore &) = delete;

  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

 private:
  std::string fetch(const std::string &key, std::chrono::milliseconds timeout);
  // Says on stderr which rank is awaited for a key that has not come within 10 s.
  void name_missing(const std::string &key) const;

  rendezvous::Client &client_;
  std::string prefix_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string abandoned_key_;
  // What wait() fetched, so that Gloo's get() right after it needs no second round trip.
  std::map<std::string, std::string> fetched_;

  // While fetch waits for a key: the reminder thread names it after 10 s.
  class WaitingFor {
   public:
    WaitingFor(RendezvousStore &store, const std::string &key);
    ~WaitingFor();
    WaitingFor(const WaitingFor &) = delete;
    WaitingFor &operator=(const WaitingFor &) = delete;

   private:
    RendezvousStore &store_;
  };
  void remind();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::string> waiting_for_;
  std::chrono::steady_clock::time_point waiting_since_;
  bool closing_ = false;
  std::thread reminder_;
};

}  // namespace perseus::comm
