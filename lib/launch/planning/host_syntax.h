#pragma once
// Small pieces the host-list and hostfile parsers (and the command line's "did you mean")
// share: which characters a host name may have, IPv6 literals, and how to show a bad byte.

#include <cstddef>
#include <string>
#include <string_view>

namespace perseus::launch {

// Letters, digits, '-', '.' and '_'.
bool is_name_char(char c);

// An IPv6 address as inet_pton reads it, optionally followed by "%zone".
bool is_ipv6(std::string_view text);

// "0xNN".
std::string hex_byte(char c);

// "'x'" for a printable character, "byte 0xNN" for anything else.
std::string describe(char c);

// Levenshtein distance, to suggest the closest name for a misspelled one.
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace perseus::launch
