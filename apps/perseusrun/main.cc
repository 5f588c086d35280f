// perseusrun: parses the command line and hands over to lib/launch. One top-level catch maps
// every failure to a documented exit code (docs/USAGE.md).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/perseusrun/command_line.h"
#include "lib/launch/agent/agent.h"
#include "lib/launch/errors.h"
#include "lib/launch/launcher/checker.h"
#include "lib/launch/launcher/launcher.h"

namespace {

std::string own_path() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  return n > 0 ? std::string(path.data(), static_cast<size_t>(n)) : "perseusrun";
}

int run(int argc, char **argv) {
  using namespace perseus;
  app::CommandLine line = app::parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
  switch (line.mode) {
    case app::Mode::kAgent:
      return launch::run_agent();
    case app::Mode::kHelp:
      fputs(app::help_text().c_str(), stdout);
      return launch::kExitSuccess;
    case app::Mode::kVersion:
      fputs(app::version_text().c_str(), stdout);
      return launch::kExitSuccess;
    case app::Mode::kLaunch:
      break;
  }
  line.config.agent_program = own_path();
  if (line.config.working_directory.empty()) {
    std::vector<char> cwd(4096);
    if (getcwd(cwd.data(), cwd.size())) line.config.working_directory = cwd.data();
  }
  if (line.config.check_only) return launch::run_check(line.config);
  return launch::run_launcher(line.config);
}

}  // namespace

int main(int argc, char **argv) {
  using namespace perseus::launch;
  try {
    return run(argc, argv);
  } catch (const InputError &error) {
    fprintf(stderr, "perseusrun: error: %s\n", error.what());
    return kExitUsage;
  } catch (const LaunchError &error) {
    fprintf(stderr, "perseusrun: error: %s\n", error.what());
    return error.exit_code();
  } catch (const std::exception &error) {
    fprintf(stderr, "perseusrun: error: %s\n", error.what());
    return kExitLaunchFailure;
  }
}
