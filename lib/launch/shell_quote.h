#pragma once
// Quoting for the one command line perseusrun sends to a remote login shell (the agent's
// path). Everything else travels over the channel's stdin, never through a shell.

#include <string>

namespace perseus::launch {

// 'text' with every ' written as '\'' : a POSIX shell reads it back byte for byte.
std::string shell_quote(const std::string &text);

}  // namespace perseus::launch
