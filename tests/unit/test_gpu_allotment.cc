#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/gpu_allotment.h"

namespace perseus::launch {
namespace {

// One row of the table: the host's facts and the expected CUDA_VISIBLE_DEVICES of each local
// rank ("-" for nullopt), or, with `error` set, the substrings the InputError must contain.
struct Case {
  std::string name;
  GpuBind bind;
  std::optional<int> gpu_count;
  std::optional<std::string> cuda_visible_devices;
  int local_size;
  std::vector<std::string> expected;
  std::vector<std::string> error = {};
};

constexpr auto kList = GpuBind::kList;
constexpr auto kIsolate = GpuBind::kIsolate;
constexpr auto kNone = GpuBind::kNone;
constexpr std::nullopt_t kNoDriver = std::nullopt;
constexpr std::nullopt_t kUnset = std::nullopt;

const std::vector<Case> kCases = {
    // No driver: 0..local_size-1, so that scripts see the same variables everywhere.
    {"no driver, list", kList, kNoDriver, kUnset, 3, {"0,1,2", "0,1,2", "0,1,2"}},
    {"no driver, isolate", kIsolate, kNoDriver, kUnset, 3, {"0", "1", "2"}},
    {"no driver, one rank", kList, kNoDriver, kUnset, 1, {"0"}},
    {"driver with no GPUs counts as none", kIsolate, 0, kUnset, 2, {"0", "1"}},
    // A driver: the first local_size of 0..gpus-1.
    {"8 GPUs, 4 ranks, list", kList, 8, kUnset, 4, {"0,1,2,3", "0,1,2,3", "0,1,2,3", "0,1,2,3"}},
    {"8 GPUs, 4 ranks, isolate", kIsolate, 8, kUnset, 4, {"0", "1", "2", "3"}},
    {"8 GPUs, 8 ranks, isolate", kIsolate, 8, kUnset, 8, {"0", "1", "2", "3", "4", "5", "6", "7"}},
    {"8 GPUs, 1 rank, list", kList, 8, kUnset, 1, {"0"}},
    // The host's CUDA_VISIBLE_DEVICES wins over the driver's count.
    {"CUDA_VISIBLE_DEVICES 3,5, list", kList, 8, "3,5", 2, {"3,5", "3,5"}},
    {"CUDA_VISIBLE_DEVICES 3,5, isolate", kIsolate, 8, "3,5", 2, {"3", "5"}},
    {"CUDA_VISIBLE_DEVICES without a driver", kIsolate, kNoDriver, "3,5", 2, {"3", "5"}},
    {"CUDA_VISIBLE_DEVICES longer than the ranks, list", kList, 8, "7,6,5,4", 2, {"7,6", "7,6"}},
    {"CUDA_VISIBLE_DEVICES longer than the ranks, isolate",
     kIsolate,
     8,
     "7,6,5,4",
     3,
     {"7", "6", "5"}},
    {"UUID entries, list",
     kList,
     2,
     "GPU-8a3f1c2e-0000-1111-2222-333344445555,GPU-b9d2e4f6-6666-7777-8888-999900001111",
     2,
     {"GPU-8a3f1c2e-0000-1111-2222-333344445555,GPU-b9d2e4f6-6666-7777-8888-999900001111",
      "GPU-8a3f1c2e-0000-1111-2222-333344445555,GPU-b9d2e4f6-6666-7777-8888-999900001111"}},
    {"UUID entries, isolate",
     kIsolate,
     2,
     "GPU-8a3f1c2e-0000-1111-2222-333344445555,MIG-4c1d2e3f-aaaa-bbbb-cccc-ddddeeeeffff",
     2,
     {"GPU-8a3f1c2e-0000-1111-2222-333344445555", "MIG-4c1d2e3f-aaaa-bbbb-cccc-ddddeeeeffff"}},
    // An empty CUDA_VISIBLE_DEVICES means "no GPU": kept for every rank, whatever the count.
    {"empty CUDA_VISIBLE_DEVICES, list", kList, 8, "", 3, {"", "", ""}},
    {"empty CUDA_VISIBLE_DEVICES, isolate", kIsolate, 8, "", 3, {"", "", ""}},
    {"empty CUDA_VISIBLE_DEVICES, no driver", kIsolate, kNoDriver, "", 2, {"", ""}},
    // kNone leaves the variable alone, even where the others would refuse.
    {"none with 8 GPUs", kNone, 8, kUnset, 4, {"-", "-", "-", "-"}},
    {"none with CUDA_VISIBLE_DEVICES", kNone, 8, "3,5", 2, {"-", "-"}},
    {"none with too few GPUs", kNone, 2, kUnset, 4, {"-", "-", "-", "-"}},
    {"none with empty CUDA_VISIBLE_DEVICES", kNone, 2, "", 2, {"-", "-"}},
    // No ranks on the host.
    {"no ranks, list", kList, 8, kUnset, 0, {}},
    {"no ranks, none", kNone, 8, kUnset, 0, {}},
    // Two ranks would share a GPU.
    {"too few GPUs, list",
     kList,
     2,
     kUnset,
     4,
     {},
     {"node7", "4 ranks", "2 GPU(s)", "the driver", "--gpu-bind none", "-npernode", "-H node7:2"}},
    {"too few GPUs, isolate", kIsolate, 1, kUnset, 2, {}, {"node7", "--gpu-bind none"}},
    {"too few in CUDA_VISIBLE_DEVICES",
     kIsolate,
     8,
     "3,5",
     3,
     {},
     {"node7", "3 ranks", "2 GPU(s)", "CUDA_VISIBLE_DEVICES=3,5", "--gpu-bind none"}},
};

// The values joined by " ", nullopt as "-" and "" as "''", so that a failed check shows them.
std::string shown(const std::vector<std::string> &values) {
  std::string out;
  for (const std::string &value : values) {
    out += (out.empty() ? "" : " ") + (value.empty() ? std::string("''") : value);
  }
  return out;
}

std::string shown(const std::vector<std::optional<std::string>> &values) {
  std::vector<std::string> out;
  for (const auto &value : values) out.push_back(value ? *value : "-");
  return shown(out);
}

// allot_gpus as one value per local rank.
std::vector<std::optional<std::string>> allotted(GpuBind bind, const HostGpuFacts &facts,
                                                 int local_size, const std::string &host) {
  const GpuAllotment allotment = allot_gpus(bind, facts, local_size, host);
  std::vector<std::optional<std::string>> values;
  for (int i = 0; i < local_size; ++i) values.push_back(allotment.of(static_cast<size_t>(i)));
  return values;
}

TEST_CASE("allot_gpus table") {
  for (const Case &c : kCases) {
    CAPTURE(c.name);
    const HostGpuFacts facts{c.gpu_count, c.cuda_visible_devices};
    if (c.error.empty()) {
      std::vector<std::optional<std::string>> values;
      REQUIRE_NOTHROW(values = allotted(c.bind, facts, c.local_size, "node7"));
      CHECK(shown(values) == shown(c.expected));
      continue;
    }
    std::string message;
    try {
      allotted(c.bind, facts, c.local_size, "node7");
    } catch (const InputError &error) {
      message = error.what();
    }
    REQUIRE_MESSAGE(!message.empty(), "expected an InputError");
    for (const std::string &part : c.error) {
      CAPTURE(message);
      CHECK_MESSAGE(message.find(part) != std::string::npos, "missing: ", part);
    }
  }
}

TEST_CASE("list mode keeps one shared value, however many ranks") {
  const GpuAllotment allotment =
      allot_gpus(GpuBind::kList, {std::nullopt, std::nullopt}, 5000, "h");
  REQUIRE(allotment.shared.has_value());
  CHECK(allotment.own.empty());
  CHECK(allotment.shared->substr(0, 8) == "0,1,2,3,");
  CHECK(allotment.of(4999) == allotment.shared);
}

TEST_CASE("kNone never yields a value") {
  for (int local_size = 0; local_size <= 16; ++local_size) {
    for (const HostGpuFacts &facts : {HostGpuFacts{std::nullopt, std::nullopt},
                                      HostGpuFacts{1, std::nullopt}, HostGpuFacts{8, "0,1"}}) {
      const auto values = allotted(GpuBind::kNone, facts, local_size, "h");
      CHECK(values.size() == static_cast<size_t>(local_size));
      for (const auto &value : values) CHECK_FALSE(value.has_value());
    }
  }
}

TEST_CASE("isolate gives each rank a distinct entry of the list that list mode gives") {
  for (int gpus = 1; gpus <= 8; ++gpus) {
    for (int local_size = 1; local_size <= gpus; ++local_size) {
      const HostGpuFacts facts{gpus, std::nullopt};
      const auto listed = allotted(GpuBind::kList, facts, local_size, "h");
      const auto isolated = allotted(GpuBind::kIsolate, facts, local_size, "h");
      REQUIRE(listed.size() == static_cast<size_t>(local_size));
      REQUIRE(isolated.size() == static_cast<size_t>(local_size));
      std::string joined;
      for (const auto &value : isolated) joined += (joined.empty() ? "" : ",") + value.value();
      for (const auto &value : listed) CHECK(value.value() == joined);
    }
  }
}

}  // namespace
}  // namespace perseus::launch

namespace perseus::launch {
namespace {

HostGpuFacts with_busy(std::optional<int> gpus, std::optional<std::string> visible,
                       std::vector<std::string> busy) {
  HostGpuFacts facts{gpus, std::move(visible)};
  facts.busy = std::move(busy);
  facts.busy_detail = "GPU 0 (pid 42 python hold.py, user bob, 30000 MiB)";
  return facts;
}

TEST_CASE("busy GPUs are left out when enough free ones remain") {
  // -H host:4 on an 8-GPU host whose GPUs 0-3 are busy runs on 4-7.
  const auto list =
      allotted(GpuBind::kList, with_busy(8, std::nullopt, {"0", "1", "2", "3"}), 4, "node1");
  for (const auto &value : list) CHECK(value == "4,5,6,7");
  const auto isolated = allotted(
      GpuBind::kIsolate, with_busy(8, std::nullopt, {"0", "GPU-aaaa", "2", "GPU-cccc"}), 2, "n");
  CHECK(isolated[0] == "1");
  CHECK(isolated[1] == "3");
  // Busy entries are matched against the host's own CUDA_VISIBLE_DEVICES too (index or UUID).
  CHECK(allotted(GpuBind::kIsolate, with_busy(8, "3,5", {"3"}), 1, "n")[0] == "5");
  CHECK(allotted(GpuBind::kIsolate, with_busy(8, "GPU-a,GPU-b", {"GPU-a"}), 1, "n")[0] == "GPU-b");
  // kNone looks at nothing.
  CHECK_FALSE(allotted(GpuBind::kNone, with_busy(1, std::nullopt, {"0"}), 1, "n")[0]);
}

TEST_CASE("too few free GPUs is a LaunchError naming the busy ones and the fixes") {
  CHECK_THROWS_WITH_AS(
      allotted(GpuBind::kList, with_busy(2, std::nullopt, {"0"}), 2, "node7"),
      doctest::Contains("host node7: 2 ranks need as many free GPUs, but only 1 of its 2 are "
                        "free; busy: GPU 0 (pid 42 python hold.py, user bob, 30000 MiB)"),
      LaunchError);
  CHECK_THROWS_WITH_AS(allotted(GpuBind::kList, with_busy(1, std::nullopt, {"0"}), 1, "n"),
                       doctest::Contains("--gpu-busy-threshold"), LaunchError);
}

}  // namespace
}  // namespace perseus::launch
