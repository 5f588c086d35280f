#pragma once
// Open MPI's hostfile format:
//
//   # comment                    (also after an entry: "node1 slots=4  # fast one")
//   node1 slots=4 max_slots=8    (max-slots and max_slots are both accepted)
//   alice@10.0.0.2 slots=2
//   node3                        (bare: slots decided when merging, see host_merge.h)
//   fe80::1 slots=2              (IPv6 as written; "[fe80::1]" is accepted too)
//
// Blank lines are skipped. Counts are integers from 1 to 65536 written in decimal; slots must
// not exceed max_slots on the same line. "count=N" is another name for slots=N (old Open MPI).
// A host name uses letters, digits, '-', '.' and '_'; anything with ':' must be an IPv6 address
// ("node1:4" is an error that suggests "node1 slots=4"). Fields are separated by spaces and tabs.
// A '\r' just before a line end (CRLF files) and a UTF-8 byte order mark are ignored.
//
// Errors throw InputError whose message is exactly three lines, with no trailing newline:
//   <file>:<line>:<column>: <what is wrong>; <how to fix it>
//   <the line as written, tabs kept>
//   <spaces up to the column, then '^'>
// Columns count bytes from 1; the caret line is spaces even where the echoed line has tabs. A
// NUL byte or any other control character except tab is an error at its column; in the echoed
// line it is shown as '?'.

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

// Parses hostfile text. `filename` is used only in messages and in HostSpec::origin
// ("<filename>:<line>").
std::vector<HostSpec> parse_hostfile(std::string_view text, const std::string &filename);

// Reads and parses a file. An unreadable file throws InputError naming the path and the
// system's reason. A file with no entries, or over 64 MiB, throws InputError too.
std::vector<HostSpec> read_hostfile(const std::string &path);

}  // namespace perseus::launch
