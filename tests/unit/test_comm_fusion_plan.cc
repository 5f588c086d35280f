// lib/comm/fusion_plan: which of a cycle's agreed operations the engine runs together. Every
// rank runs the same plan on the same list, so the plan must follow only from the list.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "lib/comm/fusion_plan.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/types.h"

namespace perseus::comm {
namespace {

Agreed agreed(OpKind kind, uint64_t count, DataType type = DataType::kFloat32) {
  Descriptor d;
  d.kind = kind;
  d.type = type;
  d.op = ReduceOp::kSum;
  d.count = count;
  Agreed a;
  a.per_rank = {d, d};
  a.joined = {false, false};
  a.member = {true, true};
  return a;
}

Agreed allreduce(uint64_t count, DataType type = DataType::kFloat32) {
  return agreed(OpKind::kAllreduce, count, type);
}

using Plan = std::vector<std::vector<size_t>>;

}  // namespace

TEST_CASE("all-reduces of one kind are packed in agreed order up to the threshold") {
  // 4-byte floats: 100 + 100 + 100 elements are 1200 bytes.
  const std::vector<Agreed> ready = {allreduce(100), allreduce(100), allreduce(100)};
  CHECK(plan_fusion(ready, 1200) == Plan{{0, 1, 2}});
  CHECK(plan_fusion(ready, 1199) == Plan{{0, 1}, {2}});
  CHECK(plan_fusion(ready, 400) == Plan{{0}, {1}, {2}});
}

TEST_CASE("threshold 0 fuses nothing, and a tensor larger than the threshold runs alone") {
  const std::vector<Agreed> ready = {allreduce(10), allreduce(1000), allreduce(10)};
  CHECK(plan_fusion(ready, 0) == Plan{{0}, {1}, {2}});
  CHECK(plan_fusion(ready, 100) == Plan{{0, 2}, {1}});
}

TEST_CASE("a tensor that does not fit is skipped, and later ones that fit still join") {
  // 40 + 400 > 200 bytes, but 40 + 80 fits: the skipped one starts its own group afterwards.
  const std::vector<Agreed> ready = {allreduce(10), allreduce(100), allreduce(20)};
  CHECK(plan_fusion(ready, 200) == Plan{{0, 2}, {1}});
}

TEST_CASE("only all-reduces alike in type, op, scales, process set and memory fuse") {
  std::vector<Agreed> ready = {allreduce(4), allreduce(4, DataType::kFloat64),
                               allreduce(4), allreduce(4),
                               allreduce(4), allreduce(4),
                               allreduce(4), allreduce(4)};
  for (auto &d : ready[2].per_rank) d.op = ReduceOp::kMax;
  for (auto &d : ready[3].per_rank) d.prescale = 0.5;
  for (auto &d : ready[4].per_rank) d.postscale = 2.0;
  for (auto &d : ready[5].per_rank) d.process_set = 1;
  for (auto &d : ready[6].per_rank) d.device = 0;
  CHECK(plan_fusion(ready, 1 << 20) == Plan{{0, 7}, {1}, {2}, {3}, {4}, {5}, {6}});
}

TEST_CASE("other operations and failed agreements are groups of one, between the fused") {
  std::vector<Agreed> ready = {allreduce(4), agreed(OpKind::kBroadcast, 4),     allreduce(4),
                               allreduce(4), agreed(OpKind::kReducescatter, 4), allreduce(4)};
  ready[3].error = "shapes differ";
  CHECK(plan_fusion(ready, 1 << 20) == Plan{{0, 2, 5}, {1}, {3}, {4}});
}

TEST_CASE("empty tensors fuse and an empty list plans nothing") {
  CHECK(plan_fusion({}, 1024).empty());
  const std::vector<Agreed> ready = {allreduce(0), allreduce(0), allreduce(3)};
  CHECK(plan_fusion(ready, 12) == Plan{{0, 1, 2}});
}

}  // namespace perseus::comm
