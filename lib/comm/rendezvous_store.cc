#include "lib/comm/rendezvous_store.h"

#include <algorithm>
#include <cstdio>
#include <utility>

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

// The rank a Gloo key belongs to, or -1.
int rank_of(const std::string &key) {
  const std::string digits = key.rfind("rank_", 0) == 0 ? key.substr(5) : key;
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(digits);
}

// A rank that is slow to join is named this soon, long before PERSEUS_INIT_TIMEOUT fails it.
constexpr auto kNameTheMissingAfter = std::chrono::seconds(10);

}  // namespace

RendezvousStore::RendezvousStore(rendezvous::Client &client, std::string prefix, int rank,
                                 std::chrono::milliseconds timeout)
    : client_(client), prefix_(std::move(prefix)), rank_(rank), timeout_(timeout) {
  if (timeout_ > kNameTheMissingAfter) reminder_ = std::thread([this] { remind(); });
}

RendezvousStore::~RendezvousStore() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  if (reminder_.joinable()) reminder_.join();
}

RendezvousStore::WaitingFor::WaitingFor(RendezvousStore &store, const std::string &key)
    : store_(store) {
  {
    std::lock_guard lock(store_.mutex_);
    store_.waiting_for_ = key;
    store_.waiting_since_ = std::chrono::steady_clock::now();
  }
  store_.wake_.notify_all();
}

RendezvousStore::WaitingFor::~WaitingFor() {
  std::lock_guard lock(store_.mutex_);
  store_.waiting_for_.reset();
}

// A thread beside the blocking get (a get that times out would break the store's connection):
// when one key has been awaited kNameTheMissingAfter, it is named once.
void RendezvousStore::remind() {
  std::unique_lock lock(mutex_);
  while (!closing_) {
    if (!waiting_for_) {
      wake_.wait(lock);
      continue;
    }
    const std::string key = *waiting_for_;
    const auto due = waiting_since_ + kNameTheMissingAfter;
    if (wake_.wait_until(lock, due, [&] { return closing_ || waiting_for_ != key; })) continue;
    if (waiting_for_ == key && std::chrono::steady_clock::now() >= due) {
      name_missing(key);
      return;  // once
    }
  }
}

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
    const WaitingFor waiting(*this, key);
    if (!abandoned_key_.empty()) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!client_.check(prefix_ + key)) {
        if (client_.check(abandoned_key_)) {
          throw Error(Code::kCommunication,
                      "rank " + std::to_string(rank_) + " gave up waiting for " + describe(key) +
                          ": " + client_.get(abandoned_key_, std::chrono::seconds(5)));
        }
        if (std::chrono::steady_clock::now() >= deadline)
          throw rendezvous::TimeoutError(prefix_ + key);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
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

// Said on rank 0, and on the others only when it is rank 0 they wait for, so that a job of
// many ranks prints one line, not one per rank.
void RendezvousStore::name_missing(const std::string &key) const {
  const int owner = rank_of(key);
  if (rank_ != 0 && owner != 0) return;
  const auto limit = std::chrono::duration_cast<std::chrono::seconds>(timeout_).count();
  const std::string who = owner >= 0 ? "rank " + std::to_string(owner) : "the rank that sets it";
  std::fprintf(stderr,
               "perseus: rank %d: still waiting after %lld s for %s in the rendezvous store: has "
               "%s called perseus_init (hvd.init())? It is given until PERSEUS_INIT_TIMEOUT "
               "(%lld s)\n",
               rank_, static_cast<long long>(kNameTheMissingAfter.count()), describe(key).c_str(),
               who.c_str(), static_cast<long long>(limit));
}

std::vector<char> RendezvousStore::get(const std::string &key) {
  const std::string value = fetch(key, timeout_);
  fetched_.erase(key);
  return {value.begin(), value.end()};
}

void RendezvousStore::wait(const std::vector<std::string> &keys) { wait(keys, timeout_); }

void RendezvousStore::wait(const std::vector<std::string> &keys,
                           const std::chrono::milliseconds &) {
  // Gloo passes its own timeout, which is meant for its connections (gloo/backend.cc gives it a
  // fraction of the limit); the ranks are waited for in the store within this store's limit.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (const std::string &key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    fetch(key, std::max(left, std::chrono::milliseconds(1)));
  }
}

}  // namespace perseus::comm
