#include "lib/launch/planning/host_discovery.h"

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_list_parser.h"

namespace perseus::launch {

std::vector<HostSpec> parse_discovered_hosts(std::string_view output, const std::string &script) {
  std::vector<HostSpec> hosts;
  int number = 0;
  while (!output.empty()) {
    const size_t end = output.find('\n');
    std::string_view line = output.substr(0, end);
    output = end == std::string_view::npos ? std::string_view() : output.substr(end + 1);
    ++number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    try {
      for (HostSpec &spec : parse_host_list(line)) {
        spec.origin = "--host-discovery-script line " + std::to_string(number);
        hosts.push_back(std::move(spec));
      }
    } catch (const InputError &error) {
      throw InputError("--host-discovery-script " + script + ": line " + std::to_string(number) +
                       " of its output: " + error.what() +
                       " (the script must print one host a line, as host:slots)");
    }
  }
  return hosts;
}

}  // namespace perseus::launch
