#include "lib/launch/planning/host_list_parser.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_syntax.h"

namespace perseus::launch {
namespace {

constexpr int kMinCount = 1;
constexpr int kMaxCount = 65536;
constexpr std::string_view kNameChars = "letters, digits, '-', '.' and '_'";
constexpr std::string_view kExample = "e.g. -H node1:4,node2";

// The entry being read and the whole value, for messages.
struct Entry {
  std::string_view value;
  std::string_view text;
};

// A host as written in an entry, split from its slot count.
struct HostPart {
  std::string host;                       // without brackets
  std::string_view written;               // "user@host" or "[addr]" as written
  std::optional<std::string_view> count;  // the text after ':', if any
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_control(char c) {
  auto byte = static_cast<unsigned char>(c);
  return byte < 0x20 || byte == 0x7f;
}

// Quotes text for a one-line message: control characters are shown as \xNN.
std::string quote(std::string_view text) {
  std::string shown = "'";
  for (char c : text) {
    shown += is_control(c) ? "\\x" + hex_byte(c).substr(2) : std::string(1, c);
  }
  return shown + "'";
}

[[noreturn]] void fail(std::string_view value, const std::string &message) {
  throw InputError("-H " + quote(value) + ": " + message);
}

// The value with the empty entries (or the whitespace) dropped, to show as the fix.
std::string without_empty_entries(std::string_view value) {
  std::string fixed;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    if (end > start)
      fixed += (fixed.empty() ? "" : ",") + std::string(value.substr(start, end - start));
    start = end + 1;
  }
  return fixed;
}

// The value with whitespace trimmed from each entry; "" when some entry has it inside.
std::string trimmed_entries(std::string_view value) {
  std::string fixed;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view entry = value.substr(start, end - start);
    while (!entry.empty() && is_space(entry.front())) entry.remove_prefix(1);
    while (!entry.empty() && is_space(entry.back())) entry.remove_suffix(1);
    for (char c : entry) {
      if (is_space(c)) return "";
    }
    fixed += (start == 0 ? "" : ",") + std::string(entry);
    start = end + 1;
  }
  return fixed;
}

void check_bytes(const Entry &entry) {
  for (char c : entry.text) {
    if (c == '\0') {
      fail(entry.value, "entry " + quote(entry.text) + " contains a NUL byte; remove it");
    }
    if (is_space(c)) {
      std::string fixed = without_empty_entries(trimmed_entries(entry.value));
      fail(entry.value, "entry " + quote(entry.text) + " contains whitespace; " +
                            (fixed.empty() ? "remove it (hosts are separated by commas, " +
                                                 std::string(kExample) + ")"
                                           : "remove it: -H " + quote(fixed)));
    }
    if (is_control(c)) {
      fail(entry.value, "entry " + quote(entry.text) + " contains control character " +
                            hex_byte(c) + "; remove it");
    }
  }
}

void check_name(const Entry &entry, std::string_view name, std::string_view what) {
  for (char c : name) {
    if (!is_name_char(c)) {
      fail(entry.value, describe(c) + " is not allowed in the " + std::string(what) + " of " +
                            quote(entry.text) + "; it may use " + std::string(kNameChars));
    }
  }
}

HostPart split_bracketed(const Entry &entry, std::string_view rest) {
  size_t close = rest.find(']');
  if (close == std::string_view::npos) {
    fail(entry.value, "'[' without ']' in " + quote(entry.text) +
                          "; write an IPv6 address as [addr] or [addr]:N, e.g. [fe80::1]:2");
  }
  std::string_view inner = rest.substr(1, close - 1);
  if (!is_ipv6(inner)) {
    fail(entry.value, quote(inner) + " in " + quote(entry.text) +
                          " is not an IPv6 address; brackets are only for IPv6 addresses");
  }
  std::string_view after = rest.substr(close + 1);
  std::string_view written = entry.text.substr(0, entry.text.size() - after.size());
  if (after.empty()) return {std::string(inner), written, std::nullopt};
  if (after.front() != ':') {
    fail(entry.value, "unexpected " + quote(after) + " after ']' in " + quote(entry.text) +
                          "; write [addr] or [addr]:N, e.g. " + std::string(written) + ":2");
  }
  return {std::string(inner), written, after.substr(1)};
}

HostPart split_plain(const Entry &entry, std::string_view rest) {
  size_t bracket = rest.find_first_of("[]");
  if (bracket != std::string_view::npos) {
    fail(entry.value, "unbalanced " + describe(rest[bracket]) + " in " + quote(entry.text) +
                          "; brackets go around a whole IPv6 address, e.g. [fe80::1]:2");
  }
  size_t colon = rest.find(':');
  if (colon == std::string_view::npos) {
    check_name(entry, rest, "host name");
    return {std::string(rest), entry.text, std::nullopt};
  }
  if (rest.find(':', colon + 1) != std::string_view::npos) {
    if (is_ipv6(rest)) {
      std::string bracketed = "[" + std::string(rest) + "]";
      fail(entry.value, "IPv6 address " + quote(rest) + " needs brackets; write " + bracketed +
                            " or " + bracketed + ":N");
    }
    fail(entry.value, "entry " + quote(entry.text) + " has more than one ':'; write host:N, " +
                          "e.g. node1:4 (IPv6 addresses go in brackets: [fe80::1]:4)");
  }
  std::string_view name = rest.substr(0, colon);
  if (name.empty()) {
    fail(entry.value, "entry " + quote(entry.text) + " has no host name before ':'; write " +
                          "host:N, e.g. node1" + std::string(rest));
  }
  check_name(entry, name, "host name");
  std::string_view count = rest.substr(colon + 1);
  return {std::string(name), entry.text.substr(0, entry.text.size() - count.size() - 1), count};
}

int parse_count(const Entry &entry, const HostPart &part) {
  std::string_view text = *part.count;
  std::string written(part.written);
  std::string range =
      "with N from " + std::to_string(kMinCount) + " to " + std::to_string(kMaxCount);
  if (text.empty()) {
    fail(entry.value, "entry " + quote(entry.text) + " has no slot count after ':'; write " +
                          written + ":N " + range + ", or " + written + " for 1 slot");
  }
  long long count = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      fail(entry.value, "slot count " + quote(text) + " in " + quote(entry.text) +
                            " is not a number; write " + written + ":N " + range);
    }
    count = count * 10 + (c - '0');
    if (count > kMaxCount) break;
  }
  if (count < kMinCount || count > kMaxCount) {
    fail(entry.value, "slot count " + quote(text) + " in " + quote(entry.text) +
                          " is out of range; write " + written + ":N " + range);
  }
  return static_cast<int>(count);
}

HostSpec parse_entry(const Entry &entry) {
  check_bytes(entry);
  HostSpec spec;
  spec.origin = "-H";
  std::string_view rest = entry.text;
  size_t at = rest.find('@');
  if (at != std::string_view::npos) {
    if (rest.find('@', at + 1) != std::string_view::npos) {
      fail(entry.value, "entry " + quote(entry.text) + " has more than one '@'; write user@host");
    }
    if (at == 0) {
      fail(entry.value, "entry " + quote(entry.text) + " has an empty user name before '@'; " +
                            "write user@host, or only the host for the default user");
    }
    check_name(entry, rest.substr(0, at), "user name");
    spec.user = std::string(rest.substr(0, at));
    rest.remove_prefix(at + 1);
    if (rest.empty()) {
      fail(entry.value, "entry " + quote(entry.text) + " has no host name after '@'; write " +
                            std::string(entry.text) + "host, e.g. " + std::string(entry.text) +
                            "node1");
    }
  }
  HostPart part = rest.front() == '[' ? split_bracketed(entry, rest) : split_plain(entry, rest);
  spec.host = part.host;
  spec.slots = part.count ? parse_count(entry, part) : 1;
  return spec;
}

}  // namespace

std::vector<HostSpec> parse_host_list(std::string_view value) {
  std::string fixed = without_empty_entries(value);
  if (fixed.empty()) {
    fail(value, "no hosts given; write host[:slots] entries separated by commas, " +
                    std::string(kExample));
  }
  std::vector<HostSpec> specs;
  size_t start = 0;
  for (size_t number = 1; start <= value.size(); ++number) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    if (end == start) {
      fail(value, "entry " + std::to_string(number) + " is empty; remove the extra comma: -H " +
                      quote(fixed));
    }
    specs.push_back(parse_entry(Entry{value, value.substr(start, end - start)}));
    start = end + 1;
  }
  return specs;
}

}  // namespace perseus::launch
