#pragma once
// perseusrun's command line: mpirun's spelling, single-dash long options included
// ("-np 4", "-hostfile f", "-x NAME"), options up to the first word that is not one (the
// program), everything after it the program's own.

#include <string>
#include <vector>

#include "lib/launch/launch_config.h"

namespace perseus::app {

enum class Mode { kLaunch, kAgent, kHelp, kVersion };

struct CommandLine {
  Mode mode = Mode::kLaunch;
  launch::LaunchConfig config;
};

// `args` without argv[0]. Bad input throws launch::InputError whose message names the value
// and the fix.
CommandLine parse_command_line(const std::vector<std::string> &args);

std::string help_text();
std::string version_text();

}  // namespace perseus::app
