#include "lib/comm/rendezvous_store.h"

#include <algorithm>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

// Names what a Gloo key stands for (gloo/rendezvous/context.cc: "<rank>" holds that rank's
// connection addresses, "rank_<rank>" its host name), for messages people read.
std::string describe(const std::string &key) {
  const auto all_digits = [](const std::string &s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (all_digits(key)) return "rank " + key + "'s connection addresses";
  if (key.rfind("rank_", 0) == 0 && all_digits(key.substr(5))) {
    return "rank " + key.substr(5) + "'s host name";
  }
  return "key '" + key + "'";
}

}  // namespace

RendezvousStore::RendezvousStore(rendezvous::Client &client, std::string prefix, int rank,
                                 std::chrono::milliseconds timeout)
    : client_(client), prefix_(std::move(prefix)), rank_(rank), timeout_(timeout) {}

void RendezvousStore::set(const std::string &key, const std::vector<char> &data) {
  try {
    client_.set(prefix_ + key, std::string(data.begin(), data.end()));
  } catch (const rendezvous::WireError &error) {
    throw Error(Code::kRendezvous, "rank " + std::to_string(rank_) + " could not publish " +
                                       describe(key) + ": " + error.what());
  }
}

std::string RendezvousStore::fetch(const std::string &key, std::chrono::milliseconds timeout) {
  if (auto it = fetched_.find(key); it != fetched_.end()) return it->second;
  try {
    return fetched_[key] = client_.get(prefix_ + key, timeout);
  } catch (const rendezvous::TimeoutError &) {
    // The key did not come in time: a rank that never called perseus_init, or died first.
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout_).count();
    throw Error(Code::kTimeout, "rank " + std::to_string(rank_) + " waited " +
                                    std::to_string(seconds) + " s for " + describe(key) +
                                    " in the rendezvous store, in vain: did every rank call "
                                    "perseus_init? (PERSEUS_INIT_TIMEOUT sets the limit in "
                                    "seconds)");
  } catch (const rendezvous::WireError &error) {
    // The store failed us: closed, refused, or not the job's secret.
    throw Error(Code::kRendezvous, "rank " + std::to_string(rank_) + " could not read " +
                                       describe(key) +
                                       " from the rendezvous store: " + error.what());
  }
}

std::vector<char> RendezvousStore::get(const std::string &key) {
  const std::string value = fetch(key, timeout_);
  fetched_.erase(key);
  return {value.begin(), value.end()};
}

void RendezvousStore::wait(const std::vector<std::string> &keys) { wait(keys, timeout_); }

void RendezvousStore::wait(const std::vector<std::string> &keys,
                           const std::chrono::milliseconds &timeout) {
  // Gloo passes kNoTimeout (0) for "no limit"; ours is never unbounded.
  const auto limit = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (const std::string &key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    fetch(key, std::max(left, std::chrono::milliseconds(1)));
  }
}

}  // namespace perseus::comm
