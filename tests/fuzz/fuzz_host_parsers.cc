// libFuzzer target for the host parsers: the input is read as a hostfile, as the value of -H, and
// as Slurm's host list and tasks-per-node values (split at the first '|' for an allocation), and as
// --host-discovery-script's output.
// InputError is the expected failure; a crash, another exception, a sanitizer report or a broken
// invariant (abort) is a finding. On success the hosts are merged and placed, and the results
// checked. Run: fuzz_host_parsers -max_total_time=60 CORPUS_COPY tests/fuzz/corpus/host_parsers

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_discovery.h"
#include "lib/launch/planning/host_list_parser.h"
#include "lib/launch/planning/host_merge.h"
#include "lib/launch/planning/host_spec.h"
#include "lib/launch/planning/hostfile_parser.h"
#include "lib/launch/planning/placement.h"
#include "lib/launch/planning/slurm_hostlist.h"

namespace {

using perseus::launch::Host;
using perseus::launch::HostSpec;
using perseus::launch::InputError;
using perseus::launch::MapBy;
using perseus::launch::Placement;
using perseus::launch::PlacementHost;
using perseus::launch::PlacementRequest;

constexpr int kMaxCount = 65536;
constexpr long long kMaxRanksTried = 4096;  // keeps each run fast
constexpr std::string_view kFile = "fuzz.txt";

void require(bool condition, const char *what) {
  if (condition) return;
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

bool in_range(const std::optional<int> &count) {
  return !count || (*count >= 1 && *count <= kMaxCount);
}

bool has_control(std::string_view text, std::string_view allowed) {
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 || byte == 0x7f) && allowed.find(c) == std::string_view::npos) return true;
  }
  return false;
}

// A one-line message (-H, merging, placement): no line break or control character.
void check_one_line(std::string_view message) {
  require(!message.empty(), "empty message");
  require(!has_control(message, ""), "control character in a one-line message");
  require(message.find("; ") != std::string_view::npos, "message without a fix");
}

// A hostfile message: "<file>:<line>:<col>: ...; ...", the line, the caret under the column.
void check_hostfile_message(std::string_view message) {
  require(!has_control(message, "\t\n"), "control character in a hostfile message");
  size_t first_end = message.find('\n');
  require(first_end != std::string_view::npos, "hostfile message of one line");
  size_t second_end = message.find('\n', first_end + 1);
  require(second_end != std::string_view::npos, "hostfile message of two lines");
  require(message.find('\n', second_end + 1) == std::string_view::npos, "more than 3 lines");
  std::string_view first = message.substr(0, first_end);
  require(first.starts_with(std::string(kFile) + ":"), "message does not start with the file");
  require(first.find("; ") != std::string_view::npos, "hostfile message without a fix");
  size_t line_end = first.find(':', kFile.size() + 1);
  require(line_end != std::string_view::npos, "no column in the location");
  size_t column = std::strtoul(std::string(first.substr(line_end + 1)).c_str(), nullptr, 10);
  require(column >= 1, "column below 1");
  std::string_view caret = message.substr(second_end + 1);
  require(caret == std::string(column - 1, ' ') + "^", "caret not under the column");
}

void check_specs(const std::vector<HostSpec> &specs, bool from_hostfile) {
  for (const HostSpec &spec : specs) {
    require(!spec.host.empty(), "empty host");
    require(!spec.origin.empty(), "empty origin");
    require(in_range(spec.slots) && in_range(spec.max_slots), "count out of range");
    require(!spec.slots || !spec.max_slots || *spec.slots <= *spec.max_slots, "slots > max");
    require(!has_control(spec.host + spec.user, ""), "control character in a host or user");
    if (!from_hostfile) require(spec.slots.has_value() && !spec.max_slots, "-H sets no max");
  }
}

void check_placement(const Placement &placement, const std::vector<PlacementHost> &hosts,
                     long long np) {
  require(placement.size() == np, "wrong number of ranks");
  std::vector<int> on_host(hosts.size(), 0);
  for (int i = 0; i < placement.size(); ++i) {
    const auto &place = placement.ranks[i];
    require(place.rank == i, "rank out of order");
    require(place.host_index >= 0 && place.host_index < static_cast<int>(hosts.size()), "host");
    require(place.local_rank == on_host[place.host_index]++, "local_rank");
    require(place.node_rank >= 0 && place.node_rank < static_cast<int>(placement.nodes.size()),
            "node_rank");
    require(placement.nodes[place.node_rank] == place.host_index, "node of the rank");
    require(place.cross_rank >= 0 && place.cross_rank < place.cross_size, "cross_rank");
  }
  for (const auto &place : placement.ranks) {
    require(place.local_size == on_host[place.host_index], "local_size");
    const std::optional<int> &max = hosts[place.host_index].max_slots;
    require(!max || place.local_size <= *max, "ranks over max_slots");
  }
}

void place(const std::vector<Host> &merged, uint32_t seed) {
  std::vector<PlacementHost> hosts;
  long long slots = 0;
  for (const Host &host : merged) {
    require(host.slots >= 1 && host.slots <= kMaxCount, "merged slots out of range");
    require(!host.max_slots || host.slots <= *host.max_slots, "merged slots over max_slots");
    hosts.push_back({host.slots, host.max_slots});
    slots += host.slots;
  }
  PlacementRequest request;
  request.npernode = static_cast<int>(seed % 4);
  request.map_by = (seed >> 2) % 2 ? MapBy::kNode : MapBy::kSlot;
  request.oversubscribe = (seed >> 3) % 2;
  request.np = static_cast<int>((seed >> 4) % 64);
  long long capacity =
      request.npernode > 0 ? request.npernode * static_cast<long long>(hosts.size()) : slots;
  if (request.np == 0 && capacity > kMaxRanksTried) request.np = 1;
  try {
    Placement placement = perseus::launch::place_ranks(hosts, request);
    check_placement(placement, hosts, request.np > 0 ? request.np : placement.size());
  } catch (const InputError &error) {
    check_one_line(error.what());
  }
}

void merge_and_place(const std::vector<HostSpec> &specs, uint32_t seed) {
  for (std::optional<int> gpus : {std::optional<int>(), std::optional<int>(8)}) {
    try {
      auto bare = [gpus](const HostSpec &) { return gpus; };
      std::vector<Host> hosts = perseus::launch::merge_hosts(specs, bare);
      require(hosts.size() <= specs.size(), "more hosts than mentions");
      place(hosts, seed);
    } catch (const InputError &error) {
      check_one_line(error.what());
    }
  }
}

bool all_name_chars(std::string_view name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

void fuzz_slurm(std::string_view text, uint32_t seed) {
  using perseus::launch::kMaxSlurmHosts;
  try {
    const std::vector<std::string> names =
        perseus::launch::expand_slurm_hostlist(text, "SLURM_JOB_NODELIST");
    require(!names.empty() && names.size() <= kMaxSlurmHosts, "Slurm host count");
    for (const std::string &name : names) {
      require(!name.empty() && all_name_chars(name), "Slurm host name characters");
    }
  } catch (const InputError &error) {
    check_one_line(error.what());
  }
  try {
    const std::vector<int> counts =
        perseus::launch::expand_slurm_tasks_per_node(text, "SLURM_TASKS_PER_NODE");
    require(!counts.empty() && counts.size() <= kMaxSlurmHosts, "Slurm node count");
    for (int count : counts) require(count >= 1 && count <= kMaxCount, "Slurm task count");
  } catch (const InputError &error) {
    check_one_line(error.what());
  }
  const size_t bar = text.find('|');
  if (bar == std::string_view::npos) return;
  try {
    std::vector<HostSpec> specs =
        perseus::launch::slurm_allocation_hosts(text.substr(0, bar), text.substr(bar + 1));
    check_specs(specs, false);
    if (specs.size() <= 64) merge_and_place(specs, seed);
  } catch (const InputError &error) {
    check_one_line(error.what());
  }
}

uint32_t seed_of(std::string_view text) {
  uint32_t hash = 2166136261u;
  for (char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
  return hash;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  uint32_t seed = seed_of(text);
  try {
    std::vector<HostSpec> specs = perseus::launch::parse_hostfile(text, std::string(kFile));
    check_specs(specs, true);
    merge_and_place(specs, seed);
  } catch (const InputError &error) {
    check_hostfile_message(error.what());
  }
  try {
    std::vector<HostSpec> specs = perseus::launch::parse_host_list(text);
    require(!specs.empty(), "-H gave no hosts");
    check_specs(specs, false);
    merge_and_place(specs, seed);
  } catch (const InputError &error) {
    check_one_line(error.what());
  }
  fuzz_slurm(text, seed);
  try {  // as --host-discovery-script's output
    std::vector<HostSpec> specs = perseus::launch::parse_discovered_hosts(text, "discover.sh");
    check_specs(specs, false);
    if (!specs.empty()) merge_and_place(specs, seed);
  } catch (const InputError &error) {
    require(std::string_view(error.what()).find("--host-discovery-script discover.sh: line ") == 0,
            "a discovery error that does not name the script and line");
  }
  return 0;
}
