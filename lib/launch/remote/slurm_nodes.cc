#include "lib/launch/remote/slurm_nodes.h"

#include <cstdio>
#include <sstream>

#include "lib/launch/shell_quote.h"

namespace perseus::launch {

std::vector<std::string> srun_agent_command(const std::string &node, const std::string &program) {
  return {
      "srun",
      "--nodes=1",
      "--ntasks=1",
      "--nodelist=" + node,
      // Beside the job's other steps (the other hosts' agents), with every CPU and GPU of the
      // job on the node: the agent's ranks are the job's work, not one CPU's worth. (Slurm binds
      // the task to the step's CPUs, which --whole makes all of the job's on the node.)
      "--overlap",
      "--whole",
      // The agent's frames are binary: no line buffering on the way.
      "--unbuffered",
      "--kill-on-bad-exit=1",
      "--mpi=none",
      "--quiet",
      "--job-name=perseus-agent",
      program,
      "--agent",
  };
}

std::map<std::string, std::string> slurm_node_addresses(const std::vector<std::string> &nodes) {
  std::map<std::string, std::string> addresses;
  if (nodes.empty()) return addresses;
  std::string list;
  for (const std::string &node : nodes) list += (list.empty() ? "" : ",") + node;
  const std::string command =
      "sinfo --noheader --Node --format='%N %o' --nodes=" + shell_quote(list) + " 2>/dev/null";
  FILE *out = popen(command.c_str(), "r");
  if (out == nullptr) return addresses;
  std::string text;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, out)) > 0;) text.append(buffer, n);
  pclose(out);
  std::istringstream lines(text);
  for (std::string name, address; lines >> name >> address;) addresses.emplace(name, address);
  return addresses;
}

}  // namespace perseus::launch
