#include "lib/launch/planning/slurm_hostlist.h"

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_syntax.h"

namespace perseus::launch {
namespace {

constexpr int kMaxCount = 65536;
constexpr size_t kMaxDigits = 18;  // fits an unsigned long long with room to spare

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_control(char c) {
  auto byte = static_cast<unsigned char>(c);
  return byte < 0x20 || byte == 0x7f;
}

std::string quote(std::string_view text) {
  std::string shown = "'";
  for (char c : text) shown += is_control(c) ? "\\x" + hex_byte(c).substr(2) : std::string(1, c);
  return shown + "'";
}

// Where a message comes from and what it is about.
struct Source {
  std::string_view origin;
  std::string_view value;

  [[noreturn]] void fail(const std::string &message) const {
    throw InputError(std::string(origin) + " " + quote(value) + ": " + message);
  }
};

// The value's top-level pieces between commas (commas inside brackets belong to their group).
std::vector<std::string_view> split_entries(std::string_view value) {
  std::vector<std::string_view> entries;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i == value.size() || (value[i] == ',' && depth == 0)) {
      entries.push_back(value.substr(start, i - start));
      start = i + 1;
    } else if (value[i] == '[') {
      ++depth;
    } else if (value[i] == ']' && depth > 0) {
      --depth;
    }
  }
  return entries;
}

unsigned long long to_number(std::string_view digits, std::string_view entry, const Source &src) {
  if (digits.empty() || digits.size() > kMaxDigits) {
    src.fail("entry " + quote(entry) + " has " +
             (digits.empty() ? std::string("an empty number") : "a number of over 18 digits") +
             " in brackets; write numbers and ranges such as [1-4,7]");
  }
  unsigned long long number = 0;
  for (char c : digits) number = number * 10 + static_cast<unsigned>(c - '0');
  return number;
}

// The names one bracket group stands for: "1-3,07" -> 1 2 3 07.
std::vector<std::string> expand_group(std::string_view group, std::string_view entry,
                                      const Source &src, size_t budget) {
  std::vector<std::string> names;
  if (group.empty()) src.fail("entry " + quote(entry) + " has empty brackets; write [1-4,7]");
  size_t start = 0;
  for (size_t i = 0; i <= group.size(); ++i) {
    if (i < group.size() && group[i] != ',') continue;
    const std::string_view item = group.substr(start, i - start);
    start = i + 1;
    for (char c : item) {
      if (!is_digit(c) && c != '-') {
        src.fail("entry " + quote(entry) + " has " + describe(c) +
                 " in brackets, where only numbers and ranges go; write e.g. [1-4,7]");
      }
    }
    const size_t dash = item.find('-');
    const std::string_view low_text = item.substr(0, dash);
    const std::string_view high_text =
        dash == std::string_view::npos ? low_text : item.substr(dash + 1);
    if (high_text.find('-') != std::string_view::npos) {
      src.fail("entry " + quote(entry) + " has the range " + quote(item) +
               " with two '-'; write a range as LOW-HIGH, e.g. [1-4]");
    }
    const unsigned long long low = to_number(low_text, entry, src);
    const unsigned long long high = to_number(high_text, entry, src);
    if (high < low) {
      src.fail("the range " + std::string(item) + " in entry " + quote(entry) +
               " runs backwards; write the lower number first, e.g. [" + std::string(high_text) +
               "-" + std::string(low_text) + "]");
    }
    if (high - low >= budget - names.size()) {
      src.fail("entry " + quote(entry) + " stands for more than " + std::to_string(kMaxSlurmHosts) +
               " hosts; perseusrun runs at most that many");
    }
    const size_t width = low_text.size();
    for (unsigned long long n = low;; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      names.push_back(std::move(digits));
      if (n == high) break;
    }
  }
  return names;
}

// One entry's names, appended to `out`.
void expand_entry(std::string_view entry, const Source &src, std::vector<std::string> &out) {
  if (entry.empty()) {
    src.fail("has an empty entry (two commas in a row, or one at an end); drop it");
  }
  // The entry as literal pieces and groups: parts[i] is a list of alternatives.
  std::vector<std::vector<std::string>> parts;
  size_t i = 0;
  while (i < entry.size()) {
    const char c = entry[i];
    if (c == '[') {
      const size_t close = entry.find(']', i + 1);
      const size_t nested = entry.find('[', i + 1);
      if (close == std::string_view::npos) {
        src.fail("entry " + quote(entry) + " opens '[' without closing it; write e.g. n[1-4]");
      }
      if (nested != std::string_view::npos && nested < close) {
        src.fail("entry " + quote(entry) + " has brackets inside brackets; write e.g. n[1-4]");
      }
      parts.push_back(expand_group(entry.substr(i + 1, close - i - 1), entry, src,
                                   kMaxSlurmHosts - out.size()));
      i = close + 1;
    } else if (c == ']') {
      src.fail("entry " + quote(entry) + " closes ']' that no '[' opened; write e.g. n[1-4]");
    } else if (is_name_char(c)) {
      size_t end = i;
      while (end < entry.size() && is_name_char(entry[end])) ++end;
      parts.push_back({std::string(entry.substr(i, end - i))});
      i = end;
    } else {
      src.fail("entry " + quote(entry) + " has " + describe(c) +
               "; a host name has letters, digits, '-', '.' and '_', and ranges go in brackets "
               "as in gpu[01-04]");
    }
  }
  size_t total = 1;
  for (const auto &alternatives : parts) {
    if (alternatives.size() > (kMaxSlurmHosts - out.size()) / total) {
      src.fail("entry " + quote(entry) + " stands for more than " + std::to_string(kMaxSlurmHosts) +
               " hosts; perseusrun runs at most that many");
    }
    total *= alternatives.size();
  }
  // Count through the product like an odometer, the last part fastest.
  std::vector<size_t> at(parts.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    std::string name;
    for (size_t p = 0; p < parts.size(); ++p) name += parts[p][at[p]];
    out.push_back(std::move(name));
    for (size_t p = parts.size(); p-- > 0;) {
      if (++at[p] < parts[p].size()) break;
      at[p] = 0;
    }
  }
}

int to_count(std::string_view digits, std::string_view item, const Source &src,
             std::string_view what) {
  bool ok = !digits.empty() && digits.size() <= 6;
  for (char c : digits) ok = ok && is_digit(c);
  const long long count = ok ? std::stoll(std::string(digits)) : 0;
  if (!ok || count < 1 || count > kMaxCount) {
    src.fail("entry " + quote(item) + ": " + std::string(what) +
             " must be a number from 1 to 65536; Slurm writes entries as N or N(xK), e.g. "
             "8(x4),4");
  }
  return static_cast<int>(count);
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view value, std::string_view origin) {
  const Source src{origin, value};
  if (value.empty()) src.fail("names no host; run inside a Slurm allocation, or give -H");
  std::vector<std::string> names;
  for (std::string_view entry : split_entries(value)) expand_entry(entry, src, names);
  return names;
}

std::vector<int> expand_slurm_tasks_per_node(std::string_view value, std::string_view origin) {
  const Source src{origin, value};
  if (value.empty()) src.fail("gives no count; Slurm writes it as N or N(xK), e.g. 8(x4),4");
  std::vector<int> counts;
  size_t start = 0;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i < value.size() && value[i] != ',') continue;
    const std::string_view item = value.substr(start, i - start);
    start = i + 1;
    const size_t open = item.find('(');
    int repeat = 1;
    if (open != std::string_view::npos) {
      if (item.size() < open + 4 || item.substr(open, 2) != "(x" || item.back() != ')') {
        src.fail("entry " + quote(item) +
                 " is not N or N(xK); Slurm writes entries as N or N(xK), e.g. 8(x4),4");
      }
      repeat = to_count(item.substr(open + 2, item.size() - open - 3), item, src, "K of N(xK)");
    }
    const int count = to_count(item.substr(0, open), item, src, "the count");
    if (static_cast<size_t>(repeat) > kMaxSlurmHosts - counts.size()) {
      src.fail("stands for more than " + std::to_string(kMaxSlurmHosts) +
               " nodes; perseusrun runs at most that many");
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
  }
  return counts;
}

std::vector<HostSpec> slurm_allocation_hosts(std::string_view nodelist,
                                             std::string_view tasks_per_node) {
  const std::vector<std::string> names = expand_slurm_hostlist(nodelist, "SLURM_JOB_NODELIST");
  const std::vector<int> counts =
      expand_slurm_tasks_per_node(tasks_per_node, "SLURM_TASKS_PER_NODE");
  if (counts.size() != names.size()) {
    throw InputError("SLURM_TASKS_PER_NODE " + quote(tasks_per_node) + " gives counts for " +
                     std::to_string(counts.size()) + " nodes, but SLURM_JOB_NODELIST " +
                     quote(nodelist) + " names " + std::to_string(names.size()) +
                     "; run perseusrun inside the allocation that set them (salloc, sbatch), or "
                     "name the hosts with -H");
  }
  std::vector<HostSpec> hosts;
  hosts.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    hosts.push_back(HostSpec{"", names[i], counts[i], {}, kSlurmAllocationOrigin});
  }
  return hosts;
}

}  // namespace perseus::launch
