#include "lib/launch/shell_quote.h"

namespace perseus::launch {

std::string shell_quote(const std::string &text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace perseus::launch
