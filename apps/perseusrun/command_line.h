#pragma once
// perseusrun's command line: mpirun's spelling, single-dash long options included
// ("-np 4", "-hostfile f", "-x NAME"), options up to the first word that is not one (the
// program), everything after it the program's own.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/launch_config.h"

namespace perseus::app {

enum class Mode { kLaunch, kAgent, kHelp, kVersion };

struct CommandLine {
  Mode mode = Mode::kLaunch;
  launch::LaunchConfig config;
};

// Looks a variable up in perseusrun's environment.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string &)>;
EnvironmentLookup process_environment();

// `args` without argv[0]; `environment` gives what the cluster engine around perseusrun says
// (Slurm's job variables, Open MPI's default hostfile and rsh agent). Bad input throws
// launch::InputError whose message names the value and the fix.
CommandLine parse_command_line(const std::vector<std::string> &args,
                               const EnvironmentLookup &environment = process_environment());

std::string help_text();
std::string version_text();

}  // namespace perseus::app
