// lib/comm/negotiation: the wire format of one rank's cycle message (every malformed message is
// refused before anything is allocated for it) and the Negotiator, driven directly for several
// simulated ranks: every rank's Negotiator is fed the same messages, so all must decide the same.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/operation.h"
#include "lib/comm/types.h"

namespace perseus::comm {
namespace {

using Clock = std::chrono::steady_clock;

Descriptor allreduce(const std::string &name, uint64_t count = 4,
                     DataType type = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Descriptor d;
  d.kind = OpKind::kAllreduce;
  d.type = type;
  d.op = op;
  d.count = count;
  d.name = name;
  return d;
}

Descriptor broadcast(const std::string &name, int root, uint64_t count = 4) {
  Descriptor d;
  d.kind = OpKind::kBroadcast;
  d.type = DataType::kInt32;
  d.root = root;
  d.count = count;
  d.name = name;
  return d;
}

Descriptor alltoall(const std::string &name, std::vector<uint64_t> counts) {
  Descriptor d;
  d.kind = OpKind::kAlltoall;
  d.type = DataType::kInt64;
  d.counts = std::move(counts);
  for (uint64_t c : d.counts) d.count += c;
  d.name = name;
  return d;
}

Descriptor shaped(Descriptor d, std::vector<int64_t> shape) {
  d.has_shape = true;
  d.shape = std::move(shape);
  return d;
}

Descriptor allgatherv(const std::string &name, uint64_t count) {
  Descriptor d;
  d.kind = OpKind::kAllgatherv;
  d.type = DataType::kFloat32;
  d.count = count;
  d.name = name;
  return d;
}

RankMessage sample_message() {
  RankMessage m;
  m.shutdown = true;
  m.join = true;
  m.cached = {0, 7, 4294967295u};
  Descriptor a = allreduce("layer1.weight", 1001, DataType::kBfloat16, ReduceOp::kAverage);
  a.prescale = 0.5;
  a.postscale = -3.25;
  a.device = 3;
  a = shaped(a, {7, 11, 13});
  Descriptor b = shaped(alltoall("tokens", {1, 0, 5}), {6});
  Descriptor c = shaped(broadcast("", 2, 0), {});  // a scalar's shape, an empty name, count 0
  Descriptor d;
  d.kind = OpKind::kReducescatter;
  d.type = DataType::kFloat16;
  d.op = ReduceOp::kProduct;
  d.counts = {3, 3, 2};
  d.count = 8;
  d.root = -7;
  d.name = std::string("with\0nul", 8);
  m.fresh = {a, b, c, d};
  m.cancel = {"lonely", ""};
  return m;
}

// Throws unless decoding is refused with kCommunication; returns the message.
std::string refusal(std::string_view bytes, int from = 1, int ranks = 3) {
  try {
    (void)decode(bytes, from, ranks);
  } catch (const Error &e) {
    CHECK(e.code() == Code::kCommunication);
    return e.what();
  }
  FAIL("decode accepted " << bytes.size() << " bytes");
  return "";
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

template <typename T>
void put(std::string &out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// The bytes of one descriptor up to (not including) its counts list, as encode() writes them.
std::string descriptor_head(uint8_t kind, uint8_t type, uint8_t op) {
  std::string out;
  put<uint8_t>(out, kind);
  put<uint8_t>(out, type);
  put<uint8_t>(out, op);
  put<int32_t>(out, 0);   // root
  put<int32_t>(out, -1);  // device
  put<int32_t>(out, 0);   // process set
  put<double>(out, 1.0);  // prescale
  put<double>(out, 1.0);  // postscale
  put<uint64_t>(out, 0);  // count
  return out;
}

// flags, no cached numbers, one fresh descriptor of which `head` is the start.
std::string one_fresh(const std::string &rest) {
  std::string out;
  put<uint8_t>(out, 0);
  put<uint32_t>(out, 0);
  put<uint32_t>(out, 1);
  return out + rest;
}

// ---- the wire format ------------------------------------------------------------------------

TEST_CASE("negotiation: encode/decode round trip") {
  const RankMessage m = sample_message();
  const std::string bytes = encode(m);
  CHECK(decode(bytes, 0, 3) == m);
  CHECK(decode(encode(RankMessage{}), 2, 3) == RankMessage{});
  CHECK(RankMessage{}.empty());
  CHECK_FALSE(m.empty());
  for (int bits = 0; bits < 16; ++bits) {
    RankMessage flags;
    flags.shutdown = bits & 1;
    flags.join = bits & 2;
    flags.waiting = bits & 4;
    flags.deadlock = bits & 8;
    CHECK(decode(encode(flags), 0, 1) == flags);
    // Waiting is a state, not work; deadlock only qualifies a cancel.
    CHECK(flags.empty() == ((bits & 3) == 0));
  }
}

TEST_CASE("negotiation: decode refuses every truncation and any extension") {
  const std::string bytes = encode(sample_message());
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("first " << n << " of " << bytes.size() << " bytes");
    const std::string why = refusal(std::string_view(bytes).substr(0, n), 2);
    CHECK(contains(why, "rank 2 "));
    CHECK(contains(why, "truncated"));
  }
  for (const std::string &tail : {std::string(1, '\0'), std::string("x"), std::string(100, 'y')}) {
    const std::string why = refusal(bytes + tail);
    CHECK(contains(why, std::to_string(tail.size()) + " bytes follow the end"));
  }
}

TEST_CASE("negotiation: decode refuses unknown flags, kinds, dtypes and ops") {
  std::string flags = encode(RankMessage{});
  for (const int f : {16, 32, 128, 255}) {
    flags[0] = static_cast<char>(f);
    CHECK(contains(refusal(flags), "unknown flags " + std::to_string(f)));
  }
  for (const uint8_t kind : {static_cast<uint8_t>(kOpKinds), uint8_t{200}, uint8_t{255}}) {
    CHECK(contains(refusal(one_fresh(descriptor_head(kind, 0, 0))),
                   "operation kind " + std::to_string(kind) + " is unknown"));
  }
  for (const uint8_t type : {uint8_t{9}, uint8_t{255}}) {
    CHECK(contains(refusal(one_fresh(descriptor_head(0, type, 0))),
                   "dtype " + std::to_string(type) + " is unknown"));
  }
  for (const uint8_t op : {uint8_t{5}, uint8_t{255}}) {
    CHECK(contains(refusal(one_fresh(descriptor_head(0, 0, op))),
                   "op " + std::to_string(op) + " is unknown"));
  }
  // The largest valid values are accepted (the helpers write well-formed bytes).
  std::string valid = one_fresh(descriptor_head(kOpKinds - 1, 8, 4));
  put<uint32_t>(valid, 0);  // no counts
  put<int32_t>(valid, -1);  // no shape
  put<uint32_t>(valid, 0);  // empty name
  put<uint32_t>(valid, 0);  // no cancels
  const RankMessage m = decode(valid, 0, 3);
  REQUIRE(m.fresh.size() == 1);
  CHECK(m.fresh[0].kind == OpKind::kAddProcessSet);
  CHECK(m.fresh[0].type == DataType::kInt16);
  CHECK(m.fresh[0].op == ReduceOp::kProduct);
}

TEST_CASE("negotiation: decode refuses a count list longer than the ranks") {
  RankMessage m;
  m.fresh = {alltoall("a2a", {1, 2, 3, 4})};
  const std::string bytes = encode(m);
  CHECK(decode(bytes, 0, 4) == m);
  const std::string why = refusal(bytes, 1, 3);
  CHECK(contains(why, "number of counts is 4, over the cap of 3"));
  // A huge count is refused before it is reserved.
  std::string huge = one_fresh(descriptor_head(3, 0, 0));
  put<uint32_t>(huge, 0xffffffffu);
  CHECK(contains(refusal(huge), "number of counts is 4294967295, over the cap of 3"));
}

TEST_CASE("negotiation: decode refuses shapes of too many dimensions or negative extents") {
  for (const int32_t dims : {-2, static_cast<int32_t>(kMaxShapeDims + 1), int32_t{1 << 30}}) {
    std::string bytes = one_fresh(descriptor_head(0, 0, 0));
    put<uint32_t>(bytes, 0);
    put<int32_t>(bytes, dims);
    const std::string why = refusal(bytes);
    CHECK(contains(why, "number of dimensions " + std::to_string(dims) + " is not in -1..64"));
  }
  std::string negative = one_fresh(descriptor_head(0, 0, 0));
  put<uint32_t>(negative, 0);
  put<int32_t>(negative, 2);
  put<int64_t>(negative, 3);
  put<int64_t>(negative, -4);
  CHECK(contains(refusal(negative), "dimension -4 is negative"));
  RankMessage deepest;
  deepest.fresh = {shaped(allreduce("deep", 1), std::vector<int64_t>(kMaxShapeDims, 1))};
  CHECK(decode(encode(deepest), 0, 2) == deepest);
}

TEST_CASE("negotiation: decode refuses lengths over the caps before allocating") {
  // A name length just over the cap, and the largest, with no bytes behind them: refused by
  // the cap (not as a truncation, which would mean the length was trusted first).
  for (const uint32_t length : {static_cast<uint32_t>(kMaxNameBytes + 1), 0xffffffffu}) {
    std::string bytes = one_fresh(descriptor_head(0, 0, 0));
    put<uint32_t>(bytes, 0);  // no counts
    put<int32_t>(bytes, -1);  // no shape
    put<uint32_t>(bytes, length);
    const std::string why = refusal(bytes);
    CHECK(contains(why, "name is " + std::to_string(length) + ", over the cap of " +
                            std::to_string(kMaxNameBytes)));
    CHECK_FALSE(contains(why, "truncated"));
  }
  // A name of exactly the cap is fine.
  RankMessage longest;
  longest.fresh = {allreduce(std::string(kMaxNameBytes, 'n'))};
  longest.cancel = {std::string(kMaxNameBytes, 'c')};
  CHECK(decode(encode(longest), 0, 2) == longest);
  // Cancelled names have the same cap.
  std::string cancel;
  put<uint8_t>(cancel, 0);
  put<uint32_t>(cancel, 0);
  put<uint32_t>(cancel, 0);
  put<uint32_t>(cancel, 1);
  put<uint32_t>(cancel, 0xffffffffu);
  CHECK(contains(refusal(cancel), "cancelled name is 4294967295, over the cap"));
  // Entry counts over kMaxEntries, in each of the three lists.
  for (int list = 0; list < 3; ++list) {
    std::string bytes;
    put<uint8_t>(bytes, 0);
    for (int i = 0; i < list; ++i) put<uint32_t>(bytes, 0);
    put<uint32_t>(bytes, static_cast<uint32_t>(kMaxEntries + 1));
    const std::string why = refusal(bytes);
    INFO(why);
    CHECK(contains(why, "is " + std::to_string(kMaxEntries + 1) + ", over the cap of " +
                            std::to_string(kMaxEntries)));
  }
}

// ---- the Negotiator -------------------------------------------------------------------------

// Several simulated ranks, each with its own Negotiator. A cycle: every rank's outgoing message
// (through the wire format), then every Negotiator receives all of them.
struct Ranks {
  explicit Ranks(int n, size_t cache_descriptors = Negotiator::kCacheDescriptors) : size(n) {
    for (int r = 0; r < n; ++r) negotiators.emplace_back(r, n, cache_descriptors);
  }

  struct Plan {
    std::vector<std::vector<Descriptor>> local;
    std::vector<bool> shutdown, join;
    std::vector<std::string> cancel;  // sent by rank 0
  };

  Plan plan() const {
    Plan p;
    p.local.resize(static_cast<size_t>(size));
    p.shutdown.assign(static_cast<size_t>(size), false);
    p.join.assign(static_cast<size_t>(size), false);
    return p;
  }

  std::vector<RankMessage> messages(const Plan &p) const {
    std::vector<RankMessage> out;
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<size_t>(r);
      const RankMessage m = negotiators[i].outgoing(p.local[i], p.shutdown[i], p.join[i],
                                                    r == 0 ? p.cancel : std::vector<std::string>{});
      out.push_back(decode(encode(m), r, size));
      CHECK(out.back() == m);
    }
    return out;
  }

  // Every rank's cycle; checks that all decided the same and returns rank 0's.
  Negotiator::Cycle cycle(const Plan &p, Clock::time_point now = Clock::now()) {
    return deliver(messages(p), now);
  }

  Negotiator::Cycle deliver(const std::vector<RankMessage> &m, Clock::time_point now) {
    std::vector<Negotiator::Cycle> cycles;
    for (auto &n : negotiators) cycles.push_back(n.receive(m, now));
    for (size_t r = 1; r < cycles.size(); ++r) {
      INFO("rank " << r << " against rank 0");
      REQUIRE(cycles[r].ready.size() == cycles[0].ready.size());
      for (size_t k = 0; k < cycles[0].ready.size(); ++k) {
        CHECK(cycles[r].ready[k].name == cycles[0].ready[k].name);
        CHECK(cycles[r].ready[k].per_rank == cycles[0].ready[k].per_rank);
        CHECK(cycles[r].ready[k].joined == cycles[0].ready[k].joined);
        CHECK(cycles[r].ready[k].error == cycles[0].ready[k].error);
      }
      CHECK(cycles[r].all_shutdown == cycles[0].all_shutdown);
      CHECK(cycles[r].shut_down == cycles[0].shut_down);
      CHECK(cycles[r].join_done == cycles[0].join_done);
      REQUIRE(cycles[r].cancelled.size() == cycles[0].cancelled.size());
      for (size_t k = 0; k < cycles[0].cancelled.size(); ++k) {
        CHECK(cycles[r].cancelled[k].name == cycles[0].cancelled[k].name);
        CHECK(cycles[r].cancelled[k].missing == cycles[0].cancelled[k].missing);
      }
      CHECK(cycles[r].announced == cycles[0].announced);
      CHECK(negotiators[r].pending() == negotiators[0].pending());
      CHECK(negotiators[r].cached() == negotiators[0].cached());
    }
    return cycles[0];
  }

  int size;
  std::vector<Negotiator> negotiators;
};

std::vector<std::string> names_of(const std::vector<Agreed> &ready) {
  std::vector<std::string> names;
  for (const auto &a : ready) names.push_back(a.name);
  return names;
}

TEST_CASE("negotiator: different submission orders come out in one order on every rank") {
  Ranks ranks(3);
  auto p = ranks.plan();
  p.local[0] = {allreduce("a"), allreduce("b"), allreduce("c")};
  p.local[1] = {allreduce("c"), allreduce("a")};
  p.local[2] = {allreduce("b")};
  auto cycle = ranks.cycle(p);
  CHECK(cycle.ready.empty());  // nothing has every rank's submission yet
  CHECK(ranks.negotiators[0].pending() == 3);

  p = ranks.plan();
  p.local[1] = {allreduce("b")};
  p.local[2] = {allreduce("c"), allreduce("a")};
  cycle = ranks.cycle(p);
  // In order of first sighting (rank 0's a, b, c), not of completion.
  CHECK(names_of(cycle.ready) == std::vector<std::string>{"a", "b", "c"});
  for (const auto &a : cycle.ready) {
    CHECK(a.error.empty());
    CHECK(a.joined == std::vector<bool>{false, false, false});
  }
  CHECK(ranks.negotiators[0].pending() == 0);
  CHECK(ranks.negotiators[0].cached() == 3);
}

TEST_CASE("negotiator: random orders per rank, many cycles, same decisions everywhere") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    constexpr int kRanks = 3;
    constexpr int kNames = 25;
    Ranks ranks(kRanks);
    std::mt19937 random(seed);
    // Each rank submits every name once, in its own order, spread over cycles.
    std::vector<std::vector<std::vector<Descriptor>>> schedule(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      std::vector<int> order(kNames);
      for (int i = 0; i < kNames; ++i) order[static_cast<size_t>(i)] = i;
      std::shuffle(order.begin(), order.end(), random);
      for (int i : order) {
        if (schedule[r].empty() || random() % 3 == 0) schedule[r].emplace_back();
        schedule[r].back().push_back(allreduce("t" + std::to_string(i), 1 + i));
      }
    }
    size_t cycles = 0;
    for (const auto &s : schedule) cycles = std::max(cycles, s.size());
    std::map<std::string, int> submitted;  // name -> ranks that have submitted it
    std::vector<std::string> all_ready;
    for (size_t c = 0; c < cycles; ++c) {
      auto p = ranks.plan();
      for (int r = 0; r < kRanks; ++r) {
        if (c < schedule[r].size()) p.local[static_cast<size_t>(r)] = schedule[r][c];
      }
      for (const auto &local : p.local) {
        for (const auto &d : local) ++submitted[d.name];
      }
      const auto cycle = ranks.cycle(p);
      for (const auto &a : cycle.ready) {
        CHECK(submitted[a.name] == kRanks);  // never before every rank submitted it
        CHECK(a.error.empty());
        all_ready.push_back(a.name);
      }
      // Everything every rank has submitted is ready by now.
      size_t complete = 0;
      for (const auto &[name, n] : submitted) complete += n == kRanks;
      CHECK(all_ready.size() == complete);
    }
    CHECK(all_ready.size() == kNames);
    CHECK(std::set<std::string>(all_ready.begin(), all_ready.end()).size() == kNames);
  }
}

TEST_CASE("negotiator: the cached path sends numbers; an unknown number is refused") {
  Ranks ranks(3);
  auto p = ranks.plan();
  for (auto &local : p.local) local = {allreduce("w", 10), broadcast("b", 1)};
  CHECK(names_of(ranks.cycle(p).ready) == std::vector<std::string>{"w", "b"});
  REQUIRE(ranks.negotiators[0].cached() == 2);

  // The same descriptors again: numbers only, in submission order.
  p.local[1] = {broadcast("b", 1), allreduce("w", 10)};
  const auto messages = ranks.messages(p);
  for (const auto &m : messages) CHECK(m.fresh.empty());
  CHECK(messages[0].cached == std::vector<uint32_t>{0, 1});
  CHECK(messages[1].cached == std::vector<uint32_t>{1, 0});
  const auto cycle = ranks.deliver(messages, Clock::now());
  REQUIRE(cycle.ready.size() == 2);
  CHECK(cycle.ready[0].per_rank[2] == allreduce("w", 10));
  CHECK(cycle.ready[1].per_rank[0] == broadcast("b", 1));
  CHECK(ranks.negotiators[0].cached() == 2);  // agreed again: the same entries, no new ones

  // A changed descriptor of a cached name goes in full, and replaces the name's entry under
  // its number: the next time the changed one goes as that number.
  p = ranks.plan();
  for (auto &local : p.local) local = {allreduce("w", 11)};
  const auto changed = ranks.messages(p);
  for (const auto &m : changed) {
    CHECK(m.cached.empty());
    REQUIRE(m.fresh.size() == 1);
    CHECK(m.fresh[0].count == 11);
  }
  CHECK(ranks.deliver(changed, Clock::now()).ready.size() == 1);
  CHECK(ranks.negotiators[0].cached() == 2);
  const auto again = ranks.messages(p);
  for (const auto &m : again) {
    CHECK(m.fresh.empty());
    CHECK(m.cached == std::vector<uint32_t>{0});
  }
  const auto replaced = ranks.deliver(again, Clock::now());
  REQUIRE(replaced.ready.size() == 1);
  CHECK(replaced.ready[0].per_rank[1].count == 11);

  // A number nobody agreed on is a broken peer.
  std::vector<RankMessage> bad(3);
  bad[2].cached = {99};
  Negotiator fresh(0, 3);
  try {
    (void)fresh.receive(bad, Clock::now());
    FAIL("accepted an unknown cached number");
  } catch (const Error &e) {
    CHECK(e.code() == Code::kCommunication);
    CHECK(contains(e.what(), "rank 2"));
    CHECK(contains(e.what(), "99"));
  }
  // So is a name announced twice by one rank.
  std::vector<RankMessage> twice(3);
  twice[1].fresh = {allreduce("x")};
  Negotiator n(0, 3);
  (void)n.receive(twice, Clock::now());
  try {
    (void)n.receive(twice, Clock::now());
    FAIL("accepted a second announcement");
  } catch (const Error &e) {
    CHECK(e.code() == Code::kCommunication);
    CHECK(contains(e.what(), "rank 1 announced 'x' twice"));
  }
}

Descriptor scaled(Descriptor d, double prescale, double postscale) {
  d.prescale = prescale;
  d.postscale = postscale;
  return d;
}

Descriptor on_device(Descriptor d) {
  d.device = 0;
  return d;
}

TEST_CASE("negotiator: the cache stays bounded over a long job, alike on every rank") {
  // Capacity 64 names at 3 ranks (the least it takes).
  Ranks ranks(3, 3);
  REQUIRE(ranks.negotiators[0].cache_capacity() == 64);
  auto p = ranks.plan();
  // A training loop: the same named tensors every step, for many steps, plus an unnamed call
  // a step (a new name each time: never cached).
  for (int step = 0; step < 500; ++step) {
    const std::string unnamed = "allreduce.noname." + std::to_string(step);
    for (auto &local : p.local) local = {allreduce("g.0"), allreduce("g.1", 7), allreduce(unnamed)};
    const auto messages = ranks.messages(p);
    if (step > 0) {
      for (const auto &m : messages) CHECK(m.cached == std::vector<uint32_t>{0, 1});
    }
    CHECK(ranks.deliver(messages, Clock::now()).ready.size() == 3);
  }
  CHECK(ranks.negotiators[0].cached() == 2);
  // A user's name that only contains ".noname." is cached like any other.
  for (auto &local : p.local) local = {allreduce("layer.noname.3")};
  CHECK(ranks.cycle(p).ready.size() == 1);
  CHECK(ranks.negotiators[0].cached() == 3);
  for (const auto &m : ranks.messages(p)) CHECK(m.cached == std::vector<uint32_t>{2});
  CHECK(ranks.cycle(p).ready.size() == 1);

  // More names than it holds: full at 64, emptied for the 65th, numbered again from 0 on every
  // rank (deliver checks that every rank's cache has as many entries as rank 0's).
  for (int i = 3; i < 64; ++i) {
    for (auto &local : p.local) local = {allreduce("n." + std::to_string(i))};
    CHECK(ranks.cycle(p).ready.size() == 1);
  }
  CHECK(ranks.negotiators[0].cached() == 64);
  for (auto &local : p.local) local = {allreduce("n.64")};
  CHECK(ranks.cycle(p).ready.size() == 1);
  CHECK(ranks.negotiators[0].cached() == 1);
  // A name cached before the emptying goes in full again, then as its new number.
  for (auto &local : p.local) local = {allreduce("g.1", 7)};
  for (const auto &m : ranks.messages(p)) CHECK(m.fresh.size() == 1);
  CHECK(ranks.cycle(p).ready.size() == 1);
  const auto messages = ranks.messages(p);
  for (const auto &m : messages) CHECK(m.cached == std::vector<uint32_t>{1});
  const auto cycle = ranks.deliver(messages, Clock::now());
  REQUIRE(cycle.ready.size() == 1);
  CHECK(cycle.ready[0].name == "g.1");
  CHECK(cycle.ready[0].per_rank[2].count == 7);
}

TEST_CASE("negotiator: mismatched arguments fail naming the ranks and values") {
  struct Case {
    const char *what;
    Descriptor d0, d1, d2;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"count",
       allreduce("x", 4),
       allreduce("x", 5),
       allreduce("x", 4),
       {"its count: rank 0 gave 4, rank 1 5"}},
      {"dtype",
       allreduce("x", 4, DataType::kFloat32),
       allreduce("x", 4, DataType::kFloat32),
       allreduce("x", 4, DataType::kInt32),
       {"its dtype: rank 0 gave float32, rank 2 int32"}},
      {"op",
       allreduce("x", 4, DataType::kFloat32, ReduceOp::kSum),
       allreduce("x", 4, DataType::kFloat32, ReduceOp::kMax),
       allreduce("x", 4, DataType::kFloat32, ReduceOp::kMin),
       {"its op: rank 0 gave sum, rank 1 max, rank 2 min"}},
      {"root", broadcast("x", 0), broadcast("x", 0), broadcast("x", 2), {"its root", "rank 2 2"}},
      // Scale factors compared by value, written to the last digit: 1e-7 and 2e-7 are the same
      // with six decimals, which is how they were once compared.
      {"scales",
       scaled(allreduce("x", 4), 1e-7, 1.0),
       scaled(allreduce("x", 4), 2e-7, 1.0),
       scaled(allreduce("x", 4), 1e-7, 1.0),
       {"its prescale/postscale: rank 0 gave 9.9999999999999995e-08/1, rank 1 "
        "1.9999999999999999e-07/1"}},
      {"memory",
       allreduce("x", 4),
       allreduce("x", 4),
       on_device(allreduce("x", 4)),
       {"its memory: rank 0 gave host, rank 2 device"}},
      {"kind", allreduce("x"), broadcast("x", 0), allreduce("x"), {"its operation", "broadcast"}},
      {"shape, equal counts",
       shaped(allreduce("x", 6), {2, 3}),
       shaped(allreduce("x", 6), {2, 3}),
       shaped(allreduce("x", 6), {3, 2}),
       {"its shape: rank 0 gave [2, 3], rank 2 [3, 2]"}},
      {"shape, number of dimensions",
       shaped(broadcast("x", 0, 6), {6}),
       shaped(broadcast("x", 0, 6), {1, 6}),
       shaped(broadcast("x", 0, 6), {6}),
       {"its shape: rank 0 gave [6], rank 1 [1, 6]"}},
      {"allgatherv rows",
       shaped(allgatherv("x", 6), {2, 3}),
       shaped(allgatherv("x", 6), {3, 2}),
       shaped(allgatherv("x", 12), {4, 3}),
       {"all but the first dimension must agree", "rank 0 gave [*, 3], rank 1 [*, 2]"}},
      {"allgatherv dimensions",
       shaped(allgatherv("x", 6), {2, 3}),
       shaped(allgatherv("x", 6), {2, 3}),
       shaped(allgatherv("x", 6), {2, 3, 1}),
       {"rank 0 gave [*, 3], rank 2 [*, 3, 1]"}},
      {"alltoall rows",
       shaped(alltoall("x", {4, 4, 4}), {6, 2}),
       shaped(alltoall("x", {4, 4, 4}), {3, 4}),
       shaped(alltoall("x", {4, 4, 4}), {6, 2}),
       {"rank 0 gave [*, 2], rank 1 [*, 4]"}},
  };
  for (const auto &c : cases) {
    INFO(c.what);
    Ranks ranks(3);
    auto p = ranks.plan();
    p.local = {{c.d0}, {c.d1}, {c.d2}};
    const auto cycle = ranks.cycle(p);
    REQUIRE(cycle.ready.size() == 1);
    const std::string &error = cycle.ready[0].error;
    INFO(error);
    for (const auto &e : c.expect) CHECK(contains(error, e));
    CHECK(ranks.negotiators[0].cached() == 0);  // a failed agreement is not cached
    // The job goes on: the name can be used again, matching this time.
    p.local = {{c.d0}, {c.d0}, {c.d0}};
    const auto again = ranks.cycle(p);
    REQUIRE(again.ready.size() == 1);
    CHECK(again.ready[0].error.empty());
  }
  // Allgatherv counts may differ; alltoall send counts too, but there must be one per rank.
  Ranks ranks(3);
  auto p = ranks.plan();
  Descriptor g;
  g.kind = OpKind::kAllgatherv;
  g.name = "g";
  for (int r = 0; r < 3; ++r) {
    g.count = static_cast<uint64_t>(r * 7);
    p.local[static_cast<size_t>(r)] = {g, alltoall("a", {1, 2, 3})};
  }
  p.local[1][1] = alltoall("a", {4, 0});
  const auto cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 2);
  CHECK(cycle.ready[0].error.empty());
  CHECK(contains(cycle.ready[1].error, "rank 1 gave 2 send counts for 3 ranks"));
}

TEST_CASE(
    "negotiator: shapes agree with different first dimensions; a rank without one is "
    "not compared; counts that overflow are refused before anything is allocated") {
  Ranks ranks(3);
  auto p = ranks.plan();
  p.local = {{shaped(allgatherv("g", 6), {2, 3}), shaped(allreduce("r", 6), {2, 3})},
             {shaped(allgatherv("g", 0), {0, 3}), allreduce("r", 6)},
             {shaped(allgatherv("g", 15), {5, 3}), shaped(allreduce("r", 6), {2, 3})}};
  auto cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 2);
  CHECK(cycle.ready[0].error.empty());
  CHECK(cycle.ready[1].error.empty());
  // Peers that announce more elements than size_t holds in bytes.
  const uint64_t huge = std::numeric_limits<uint64_t>::max() / 2;
  p.local = {{allgatherv("big", huge)}, {allgatherv("big", huge)}, {allgatherv("big", 1)}};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 1);
  CHECK(contains(cycle.ready[0].error, "the ranks' counts add up to more elements of float32"));
  p.local = {{alltoall("a2a", {huge, 0, 0})},
             {alltoall("a2a", {huge, 0, 0})},
             {alltoall("a2a", {0, 0, 0})}};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 1);
  CHECK(contains(cycle.ready[0].error, "the counts sent to rank 0 add up to more elements"));
  // And the job goes on.
  p.local = {{allgatherv("big", 1)}, {allgatherv("big", 2)}, {allgatherv("big", 3)}};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 1);
  CHECK(cycle.ready[0].error.empty());
}

TEST_CASE("negotiator: join") {
  Ranks ranks(3);
  auto p = ranks.plan();
  p.join[2] = true;
  auto cycle = ranks.cycle(p);
  CHECK_FALSE(cycle.join_done);
  CHECK(ranks.negotiators[0].joined(2));

  // A joined rank counts as ready for an allreduce (and takes part with zeros).
  p = ranks.plan();
  p.local[0] = {allreduce("x", 6), alltoall("a", {1, 1, 1}), broadcast("b", 2)};
  p.local[1] = {allreduce("x", 6), alltoall("a", {1, 1, 1}), broadcast("b", 2)};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 3);
  CHECK(cycle.ready[0].name == "x");
  CHECK(cycle.ready[0].error.empty());
  CHECK(cycle.ready[0].joined == std::vector<bool>{false, false, true});
  CHECK(cycle.ready[0].per_rank[2].count == 6);
  // Other kinds fail naming the joined rank, broadcasts too (as in Horovod).
  CHECK(cycle.ready[1].name == "a");
  CHECK(contains(cycle.ready[1].error, "alltoall cannot run while rank 2 has joined"));
  CHECK(cycle.ready[2].name == "b");
  CHECK(contains(cycle.ready[2].error, "broadcast cannot run while rank 2 has joined"));
  // ... at once, when one rank has submitted it, without waiting for the others.
  p = ranks.plan();
  p.local[0] = {allgatherv("only0", 3), broadcast("only0b", 0)};
  p.local[1] = {allgatherv("only1", 3)};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 3);
  for (const auto &agreed : cycle.ready) {
    INFO(agreed.name << ": " << agreed.error);
    CHECK(contains(agreed.error, "cannot run while rank 2 has joined"));
  }
  CHECK(ranks.negotiators[1].pending() == 0);

  // Rank 0 joins, then rank 1: the last rank is 1, and joining starts over afterwards.
  p = ranks.plan();
  p.join[0] = true;
  cycle = ranks.cycle(p);
  CHECK_FALSE(cycle.join_done);
  p = ranks.plan();
  p.local[1] = {allreduce("y", 2)};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 1);  // ready with two joined ranks
  CHECK(cycle.ready[0].joined == std::vector<bool>{true, false, true});
  p = ranks.plan();
  p.join[1] = true;
  cycle = ranks.cycle(p);
  REQUIRE(cycle.join_done);
  CHECK(*cycle.join_done == 1);
  for (int r = 0; r < 3; ++r) CHECK_FALSE(ranks.negotiators[0].joined(r));

  // Every rank joining in one cycle: the highest rank counts as last.
  p = ranks.plan();
  p.join = {true, true, true};
  cycle = ranks.cycle(p);
  REQUIRE(cycle.join_done);
  CHECK(*cycle.join_done == 2);
}

TEST_CASE("negotiator: stalls name the missing ranks; rank 0's cancel removes the operation") {
  Ranks ranks(3);
  const auto t0 = Clock::now();
  auto p = ranks.plan();
  p.local[0] = {allreduce("lonely"), allreduce("other")};
  p.local[2] = {allreduce("lonely"), allreduce("other")};
  p.local[1] = {allreduce("other")};
  auto cycle = ranks.cycle(p, t0);
  REQUIRE(cycle.ready.size() == 1);
  CHECK(cycle.ready[0].name == "other");

  CHECK(ranks.negotiators[0].stalls(t0 + std::chrono::seconds(2), std::chrono::seconds(3)).empty());
  for (const auto &n : ranks.negotiators) {
    const auto stalls = n.stalls(t0 + std::chrono::seconds(5), std::chrono::seconds(3));
    REQUIRE(stalls.size() == 1);
    CHECK(stalls[0].name == "lonely");
    CHECK(stalls[0].kind == OpKind::kAllreduce);
    CHECK(stalls[0].submitted == std::vector<int>{0, 2});
    CHECK(stalls[0].missing == std::vector<int>{1});
    CHECK(stalls[0].waited >= std::chrono::seconds(5));
  }

  // A cancel from another rank than 0 is ignored.
  std::vector<RankMessage> m(3);
  m[1].cancel = {"lonely"};
  cycle = ranks.deliver(m, t0);
  CHECK(cycle.cancelled.empty());
  CHECK(ranks.negotiators[0].pending() == 1);

  // Rank 0's cancel: reported once, with who was missing, and gone.
  p = ranks.plan();
  p.cancel = {"lonely", "never-heard-of"};
  cycle = ranks.cycle(p, t0 + std::chrono::seconds(6));
  REQUIRE(cycle.cancelled.size() == 1);
  CHECK(cycle.cancelled[0].name == "lonely");
  CHECK(cycle.cancelled[0].missing == std::vector<int>{1});
  CHECK(cycle.cancelled[0].submitted == std::vector<int>{0, 2});
  CHECK(ranks.negotiators[0].pending() == 0);
  CHECK(ranks.negotiators[0].stalls(t0 + std::chrono::hours(1), std::chrono::seconds(0)).empty());
  // The late rank's submission then starts a new operation (it does not run the old one).
  p = ranks.plan();
  p.local[1] = {allreduce("lonely")};
  cycle = ranks.cycle(p);
  CHECK(cycle.ready.empty());
  CHECK(ranks.negotiators[0].pending() == 1);
}

// Ranks 0 and 2 wait for 'lonely', rank 1 in a barrier: each rank's messages say `waiting`.
std::vector<RankMessage> waiting_messages(Ranks &ranks, const Ranks::Plan &p,
                                          std::vector<bool> waiting) {
  auto m = ranks.messages(p);
  for (size_t r = 0; r < m.size(); ++r) m[r].waiting = waiting[r];
  return m;
}

TEST_CASE("negotiator: a deadlock is every rank waiting with nothing new for the whole time") {
  using std::chrono::seconds;
  Ranks ranks(3);
  const auto t0 = Clock::now();
  auto p = ranks.plan();
  Descriptor barrier;
  barrier.kind = OpKind::kBarrier;
  barrier.name = "barrier.noname.0";
  p.local[0] = {allreduce("lonely")};
  p.local[1] = {barrier};
  p.local[2] = {allreduce("lonely")};
  ranks.deliver(waiting_messages(ranks, p, {false, false, false}), t0);
  const auto idle = ranks.plan();
  // Every rank waits from the next cycle on: a deadlock once 10 s have passed since the
  // submissions, not before.
  ranks.deliver(waiting_messages(ranks, idle, {true, true, true}), t0 + seconds(1));
  for (const auto &n : ranks.negotiators) {
    CHECK(n.deadlocked(t0 + seconds(9), seconds(10)).empty());
    const auto stuck = n.deadlocked(t0 + seconds(10), seconds(10));
    REQUIRE(stuck.size() == 2);
    CHECK(stuck[0].name == "barrier.noname.0");
    CHECK(stuck[0].kind == OpKind::kBarrier);
    CHECK(stuck[0].submitted == std::vector<int>{1});
    CHECK(stuck[0].missing == std::vector<int>{0, 2});
    CHECK(stuck[1].name == "lonely");
    CHECK(stuck[1].missing == std::vector<int>{1});
  }
  // One rank that does not wait (it computes, and may submit later): no deadlock.
  ranks.deliver(waiting_messages(ranks, idle, {true, false, true}), t0 + seconds(11));
  CHECK(ranks.negotiators[0].deadlocked(t0 + seconds(60), seconds(10)).empty());
  // Something new submitted (and agreed) restarts the clock.
  p = ranks.plan();
  for (auto &local : p.local) local = {allreduce("meanwhile")};
  auto cycle = ranks.deliver(waiting_messages(ranks, p, {true, true, true}), t0 + seconds(20));
  CHECK(names_of(cycle.ready) == std::vector<std::string>{"meanwhile"});
  CHECK(ranks.negotiators[0].deadlocked(t0 + seconds(29), seconds(10)).empty());
  CHECK(ranks.negotiators[0].deadlocked(t0 + seconds(30), seconds(10)).size() == 2);

  // Rank 0 cancels them as a deadlock: every rank learns both, and that it was one.
  p = ranks.plan();
  p.cancel = {"barrier.noname.0", "lonely"};
  auto m = waiting_messages(ranks, p, {true, true, true});
  m[0].deadlock = true;
  cycle = ranks.deliver(m, t0 + seconds(31));
  CHECK(cycle.deadlock);
  REQUIRE(cycle.cancelled.size() == 2);
  CHECK(cycle.cancelled[0].kind == OpKind::kBarrier);
  CHECK(ranks.negotiators[1].pending() == 0);
  CHECK(ranks.negotiators[1].deadlocked(t0 + seconds(100), seconds(1)).empty());
}

TEST_CASE("negotiator: a joined rank counts as waiting for a deadlock") {
  using std::chrono::seconds;
  Ranks ranks(3);
  const auto t0 = Clock::now();
  auto p = ranks.plan();
  p.join[2] = true;
  p.local[0] = {allreduce("x")};  // all-reduces run with a joined rank: they wait for 0 and 1
  p.local[1] = {allreduce("y")};
  ranks.deliver(waiting_messages(ranks, p, {false, false, false}), t0);
  const auto idle = ranks.plan();
  ranks.deliver(waiting_messages(ranks, idle, {true, true, false}), t0 + seconds(1));
  const auto stuck = ranks.negotiators[0].deadlocked(t0 + seconds(10), seconds(5));
  REQUIRE(stuck.size() == 2);
  CHECK(stuck[0].missing == std::vector<int>{1});
  CHECK(stuck[1].missing == std::vector<int>{0});
}

TEST_CASE("negotiator: all_shutdown only when every rank said shutdown") {
  Ranks ranks(3);
  auto p = ranks.plan();
  CHECK_FALSE(ranks.cycle(p).all_shutdown);
  CHECK(ranks.cycle(p).shut_down.empty());
  p.shutdown = {true, false, true};
  auto cycle = ranks.cycle(p);
  CHECK_FALSE(cycle.all_shutdown);
  CHECK(cycle.shut_down == std::vector<int>{0, 2});
  p.shutdown = {false, true, false};
  cycle = ranks.cycle(p);
  CHECK_FALSE(cycle.all_shutdown);  // not cumulative: the flag is sent every cycle
  CHECK(cycle.shut_down == std::vector<int>{1});
  p.shutdown = {true, true, true};
  cycle = ranks.cycle(p);
  CHECK(cycle.all_shutdown);
  CHECK(cycle.shut_down == std::vector<int>{0, 1, 2});
}

TEST_CASE("negotiator: what is ready in the cycle of a shutdown still runs") {
  // A rank may leave right after submitting (an async call it never waits for): the others
  // run what every rank submitted before the job ends.
  Ranks ranks(2);
  auto p = ranks.plan();
  p.local[0] = {allreduce("last")};
  p.local[1] = {allreduce("last"), allreduce("never")};
  p.shutdown = {true, false};
  const auto cycle = ranks.cycle(p);
  REQUIRE(cycle.ready.size() == 1);
  CHECK(cycle.ready[0].name == "last");
  CHECK(cycle.shut_down == std::vector<int>{0});
}

TEST_CASE("negotiation: process sets are numbered alike everywhere and gate readiness") {
  std::vector<Negotiator> n;
  for (int r = 0; r < 4; ++r) n.emplace_back(r, 4);
  const auto now = std::chrono::steady_clock::now();
  Descriptor make;
  make.kind = OpKind::kAddProcessSet;
  make.name = "set.odd";
  make.counts = {1, 3};
  std::vector<RankMessage> all(4);
  for (auto &m : all) m.fresh = {make};
  for (auto &x : n) {
    const auto cycle = x.receive(all, now);
    REQUIRE(cycle.ready.size() == 1);
    CHECK(cycle.ready[0].error.empty());
    CHECK(cycle.ready[0].created_set == 1);
    CHECK(x.members(1) == std::vector<int>{1, 3});
  }
  // An all-reduce in set 1: ready once ranks 1 and 3 have submitted it; 0 and 2 take no part.
  Descriptor in_set;
  in_set.kind = OpKind::kAllreduce;
  in_set.type = DataType::kFloat32;
  in_set.count = 4;
  in_set.process_set = 1;
  in_set.name = "x [process set 1]";
  std::vector<RankMessage> first(4), second(4);
  first[1].fresh = {in_set};
  second[3].fresh = {in_set};
  for (auto &x : n) {
    CHECK(x.receive(first, now).ready.empty());
    const auto cycle = x.receive(second, now);
    REQUIRE(cycle.ready.size() == 1);
    CHECK(cycle.ready[0].error.empty());
    CHECK(cycle.ready[0].member == std::vector<bool>{false, true, false, true});
  }
  // A rank outside the set that submits in it makes the operation fail, naming it.
  std::vector<RankMessage> intruder(4);
  in_set.name = "y [process set 1]";
  intruder[0].fresh = {in_set};
  intruder[1].fresh = {in_set};
  intruder[3].fresh = {in_set};
  for (auto &x : n) {
    const auto cycle = x.receive(intruder, now);
    REQUIRE(cycle.ready.size() == 1);
    CHECK(cycle.ready[0].error.find("rank 0 submitted it in process set 1") != std::string::npos);
  }
  // alltoall and reducescatter in set 1 (without rank 0): one count per member, not per rank.
  Descriptor a2a;
  a2a.kind = OpKind::kAlltoall;
  a2a.type = DataType::kFloat32;
  a2a.process_set = 1;
  a2a.name = "a2a [process set 1]";
  a2a.counts = {2, 5};
  a2a.count = 7;
  Descriptor rs = a2a;
  rs.kind = OpKind::kReducescatter;
  rs.name = "rs [process set 1]";
  std::vector<RankMessage> both(4);
  both[1].fresh = {a2a, rs};
  both[3].fresh = {a2a, rs};
  for (auto &x : n) {
    const auto cycle = x.receive(both, now);
    REQUIRE(cycle.ready.size() == 2);
    CHECK(cycle.ready[0].error.empty());
    CHECK(cycle.ready[1].error.empty());
  }
  a2a.name = "a2a.bad [process set 1]";
  rs.name = "rs.bad [process set 1]";
  both[1].fresh = {a2a, rs};
  a2a.counts = {1, 2, 3, 1};  // one per rank of the job: wrong in a set of two
  rs.counts = {1, 2, 3, 1};
  both[3].fresh = {a2a, rs};
  for (auto &x : n) {
    const auto cycle = x.receive(both, now);
    REQUIRE(cycle.ready.size() == 2);
    CHECK(contains(cycle.ready[0].error, "rank 3 gave 4 send counts for 2 members"));
    CHECK(!cycle.ready[1].error.empty());
  }
  // Bad sets: repeated ranks, a set that does not exist.
  make.name = "set.bad";
  make.counts = {2, 2};
  for (auto &m : all) m.fresh = {make};
  for (auto &x : n) {
    const auto cycle = x.receive(all, now);
    REQUIRE(cycle.ready.size() == 1);
    CHECK(cycle.ready[0].error.find("distinct") != std::string::npos);
    CHECK(x.process_sets() == 2);
  }
}

}  // namespace
}  // namespace perseus::comm
