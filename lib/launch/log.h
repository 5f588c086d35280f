#pragma once
// perseusrun's own diagnostics (-v): spdlog on stderr, each line saying who is talking.

#include <string>

namespace perseus::launch {

// Sets the default logger: "perseusrun: [<host>:<pid>] <message>" on stderr; debug level when
// `verbose`, else warnings only.
void init_logging(bool verbose, const std::string &who);

}  // namespace perseus::launch
