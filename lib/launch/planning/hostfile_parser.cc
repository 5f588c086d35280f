#include "lib/launch/planning/hostfile_parser.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_syntax.h"

namespace perseus::launch {
namespace {

constexpr int kMinCount = 1;
constexpr int kMaxCount = 65536;
constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
constexpr size_t kMaxFileBytes = 64 << 20;
constexpr std::string_view kNameChars = "letters, digits, '-', '.' and '_'";

// One line of the file, as the messages need it.
struct Line {
  std::string_view file;
  size_t number = 0;      // from 1
  std::string_view text;  // without the line end
};

// A field of a line: a run of characters between spaces and tabs.
struct Token {
  std::string_view text;
  size_t offset = 0;  // in the line, from 0
};

// The keywords already given on a line, to reject repeats and check slots against max_slots.
struct Given {
  std::optional<Token> slots;
  std::optional<Token> max_slots;
};

bool is_control(char c) {
  auto byte = static_cast<unsigned char>(c);
  return (byte < 0x20 && c != '\t') || byte == 0x7f;
}

bool is_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

std::string quote(std::string_view text) { return "'" + std::string(text) + "'"; }

std::string echo(std::string_view text) {
  std::string shown(text);
  for (char &c : shown) {
    if (is_control(c)) c = '?';
  }
  return shown;
}

[[noreturn]] void fail(const Line &line, size_t offset, const std::string &message) {
  throw InputError(std::string(line.file) + ":" + std::to_string(line.number) + ":" +
                   std::to_string(offset + 1) + ": " + message + "\n" + echo(line.text) + "\n" +
                   std::string(offset, ' ') + "^");
}

void check_characters(const Line &line) {
  for (size_t i = 0; i < line.text.size(); ++i) {
    char c = line.text[i];
    if (c == '\0') {
      fail(line, i,
           "NUL byte in the line; a hostfile is plain text: remove it (is this a binary?)");
    }
    if (is_control(c)) {
      fail(line, i,
           "control character " + hex_byte(c) +
               " in the line; remove it (fields are separated by spaces or tabs)");
    }
  }
}

std::vector<Token> split_fields(std::string_view text) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == '\t') {
      ++i;
      continue;
    }
    size_t end = text.find_first_of(" \t", i);
    if (end == std::string_view::npos) end = text.size();
    tokens.push_back({text.substr(i, end - i), i});
    i = end;
  }
  return tokens;
}

// A host with ':' that is not an IPv6 address, like "node1:4".
[[noreturn]] void fail_colon(const Line &line, size_t offset, std::string_view host, size_t colon) {
  std::string_view count = host.substr(colon + 1);
  if (colon > 0 && is_digits(count)) {
    fail(line, offset + colon,
         quote(host) + " is not a host name (':' is only for IPv6 addresses); write '" +
             std::string(host.substr(0, colon)) + " slots=" + std::string(count) + "'");
  }
  fail(line, offset + colon,
       quote(host) + " is neither a host name nor an IPv6 address; host names use " +
           std::string(kNameChars));
}

// Checks "[v6]" starting at `offset`; returns the address without brackets.
std::string check_bracketed(const Line &line, size_t offset, std::string_view host) {
  size_t close = host.find(']');
  if (close == std::string_view::npos) {
    fail(line, offset,
         "'[' without ']' in " + quote(host) + "; write an IPv6 address as [addr], e.g. [fe80::1]");
  }
  std::string_view inner = host.substr(1, close - 1);
  if (close + 1 != host.size()) {
    fail(line, offset + close + 1,
         "unexpected " + quote(host.substr(close + 1)) +
             " after ']'; give slots as a keyword, e.g. '" +
             std::string(host.substr(0, close + 1)) + " slots=2'");
  }
  if (!is_ipv6(inner)) {
    fail(line, offset + 1,
         quote(inner) + " is not an IPv6 address; brackets are only for IPv6 addresses");
  }
  return std::string(inner);
}

// Checks "[v6]", "v6" or a host name starting at `offset`; returns the host without brackets.
std::string check_host(const Line &line, size_t offset, std::string_view host) {
  if (host.front() == '[') return check_bracketed(line, offset, host);
  if (is_ipv6(host)) return std::string(host);
  size_t bracket = host.find_first_of("[]");
  if (bracket != std::string_view::npos) {
    fail(line, offset + bracket,
         "unbalanced " + describe(host[bracket]) + " in " + quote(host) +
             "; brackets go around a whole IPv6 address, e.g. [fe80::1]");
  }
  size_t colon = host.find(':');
  if (colon != std::string_view::npos) fail_colon(line, offset, host, colon);
  for (size_t i = 0; i < host.size(); ++i) {
    if (!is_name_char(host[i])) {
      fail(line, offset + i,
           describe(host[i]) + " is not allowed in a host name; host names use " +
               std::string(kNameChars));
    }
  }
  return std::string(host);
}

void check_user(const Line &line, const Token &token, std::string_view user) {
  if (user.empty()) {
    fail(line, token.offset,
         "empty user name before '@' in " + quote(token.text) +
             "; write user@host, or only the host for the default user");
  }
  for (size_t i = 0; i < user.size(); ++i) {
    if (!is_name_char(user[i])) {
      fail(line, token.offset + i,
           describe(user[i]) + " is not allowed in a user name; user names use " +
               std::string(kNameChars));
    }
  }
}

// Reads "[user@]host" into `spec`.
void parse_host(const Line &line, const Token &token, HostSpec &spec) {
  std::string_view text = token.text;
  size_t at = text.find('@');
  size_t host_start = 0;
  if (at != std::string_view::npos) {
    size_t second = text.find('@', at + 1);
    if (second != std::string_view::npos) {
      fail(line, token.offset + second,
           "second '@' in " + quote(text) + "; write user@host with one '@'");
    }
    check_user(line, token, text.substr(0, at));
    spec.user = std::string(text.substr(0, at));
    host_start = at + 1;
  }
  std::string_view host = text.substr(host_start);
  if (host.empty()) {
    fail(line, token.offset + host_start,
         "no host name after " + quote(text) + "; write " + std::string(text) + "host, e.g. " +
             std::string(text) + "node1");
  }
  spec.host = check_host(line, token.offset + host_start, host);
}

std::string unknown_keyword(std::string_view key, std::string_view value) {
  std::string lower(key.substr(0, 32));
  for (char &c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  std::string_view guess = "slots";
  size_t best = edit_distance(lower, "slots");
  for (std::string_view other : {"count", "max_slots", "max-slots"}) {
    size_t distance = edit_distance(lower, other);
    if (distance < best) {
      best = distance;
      guess = other.starts_with("max") ? "max_slots" : "slots";
    }
  }
  std::string message = "unknown keyword " + quote(key) + "; ";
  if (best <= 2) {
    std::string shown = is_digits(value) ? std::string(value) : guess == "slots" ? "N" : "M";
    return message + "did you mean '" + std::string(guess) + "=" + shown + "'?";
  }
  return message + "the keywords are slots=N and max_slots=M";
}

int parse_count(const Line &line, size_t offset, std::string_view key, std::string_view value) {
  std::string range =
      "a whole number from " + std::to_string(kMinCount) + " to " + std::to_string(kMaxCount);
  if (value.empty()) {
    fail(line, offset,
         quote(std::string(key) + "=") + " has no value; write '" + std::string(key) +
             "=N' with N " + range);
  }
  std::string_view digits = value.starts_with('-') ? value.substr(1) : value;
  if (!is_digits(digits)) {
    fail(line, offset,
         std::string(key) + " value " + quote(value) + " is not a number; write " + range +
             ", e.g. '" + std::string(key) + "=4'");
  }
  long long count = 0;
  for (char c : digits) {
    count = count * 10 + (c - '0');
    if (count > kMaxCount) break;
  }
  if (digits.size() != value.size() || count < kMinCount || count > kMaxCount) {
    fail(line, offset,
         std::string(key) + " value " + quote(value) + " is out of range; write " + range);
  }
  return static_cast<int>(count);
}

// A field after the host that is not key=value.
[[noreturn]] void fail_not_keyword(const Line &line, const Token &token) {
  std::string_view text = token.text;
  if (is_digits(text)) {
    fail(line, token.offset,
         quote(text) + " after the host name is not a keyword; write 'slots=" + std::string(text) +
             "'");
  }
  if (text == "slots" || text == "count" || text == "max_slots" || text == "max-slots") {
    fail(line, token.offset,
         quote(text) + " has no '=value'; write '" + std::string(text) +
             "=N' with no spaces around '='");
  }
  fail(line, token.offset,
       "second host name " + quote(text) + " on the line; put each host on a line of its own");
}

void parse_keyword(const Line &line, const Token &token, HostSpec &spec, Given &given) {
  size_t equals = token.text.find('=');
  if (equals == std::string_view::npos) fail_not_keyword(line, token);
  std::string_view key = token.text.substr(0, equals);
  std::string_view value = token.text.substr(equals + 1);
  bool is_max = key == "max_slots" || key == "max-slots";
  if (!is_max && key != "slots" && key != "count") {
    fail(line, token.offset, unknown_keyword(key, value));
  }
  std::optional<Token> &first = is_max ? given.max_slots : given.slots;
  if (first) {
    fail(line, token.offset,
         quote(token.text) + " sets " + (is_max ? "max_slots" : "slots") + " again (after " +
             quote(first->text) + " at column " + std::to_string(first->offset + 1) +
             "); keep one");
  }
  first = token;
  int count = parse_count(line, token.offset + equals + 1, key, value);
  (is_max ? spec.max_slots : spec.slots) = count;
}

std::optional<HostSpec> parse_line(const Line &line) {
  check_characters(line);
  std::vector<Token> tokens = split_fields(line.text.substr(0, line.text.find('#')));
  if (tokens.empty()) return std::nullopt;
  if (tokens[0].text.find('=') != std::string_view::npos) {
    fail(line, tokens[0].offset,
         "the line starts with " + quote(tokens[0].text) +
             " where a host name belongs; write the host name first, e.g. 'node1 " +
             std::string(tokens[0].text) + "'");
  }
  HostSpec spec;
  spec.origin = std::string(line.file) + ":" + std::to_string(line.number);
  parse_host(line, tokens[0], spec);
  Given given;
  for (size_t i = 1; i < tokens.size(); ++i) parse_keyword(line, tokens[i], spec, given);
  if (spec.slots && spec.max_slots && *spec.slots > *spec.max_slots) {
    fail(line, given.slots->offset,
         quote(given.slots->text) + " is more than " + quote(given.max_slots->text) +
             "; lower the slots or raise max_slots");
  }
  return spec;
}

struct FileCloser {
  void operator()(std::FILE *file) const { std::fclose(file); }
};

[[noreturn]] void fail_read(const std::string &path, int error) {
  throw InputError("cannot read hostfile " + quote(path) + ": " +
                   std::generic_category().message(error) + "; check the path given to --hostfile");
}

std::string read_text(const std::string &path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail_read(path, errno);
  std::string text;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    text.append(buffer, got);
    if (text.size() > kMaxFileBytes) {
      throw InputError("hostfile " + quote(path) + " is larger than " +
                       std::to_string(kMaxFileBytes >> 20) +
                       " MiB; is it the right file? a hostfile has one host per line");
    }
  }
  if (std::ferror(file.get())) fail_read(path, errno);
  return text;
}

}  // namespace

std::vector<HostSpec> parse_hostfile(std::string_view text, const std::string &filename) {
  if (text.starts_with(kByteOrderMark)) text.remove_prefix(kByteOrderMark.size());
  std::vector<HostSpec> specs;
  size_t number = 0;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view raw = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (raw.ends_with('\r')) raw.remove_suffix(1);
    if (auto spec = parse_line(Line{filename, ++number, raw})) specs.push_back(std::move(*spec));
  }
  return specs;
}

std::vector<HostSpec> read_hostfile(const std::string &path) {
  std::vector<HostSpec> specs = parse_hostfile(read_text(path), path);
  if (specs.empty()) {
    throw InputError("hostfile " + quote(path) +
                     " has no hosts; add one host per line, e.g. 'node1 slots=4'");
  }
  return specs;
}

}  // namespace perseus::launch
