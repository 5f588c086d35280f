#include <doctest/doctest.h>

#include <string>

#include "lib/launch/agent/job_cgroup.h"

namespace perseus::launch {
namespace {

// Excerpts of /proc/self/mountinfo from a hybrid host (this one), a plain v2 host and a
// container that sees a subtree of the hierarchy.
const char *const kHybrid =
    "25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
    "cgroup2 rw,nsdelegate\n"
    "35 33 0:30 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n";
const char *const kPlain =
    "30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "31 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
const char *const kSubtree =
    "612 611 0:29 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n";

TEST_CASE("parse_cgroup2_mount finds the v2 hierarchy") {
  const auto hybrid = parse_cgroup2_mount(kHybrid);
  REQUIRE(hybrid.has_value());
  CHECK(hybrid->mount_point == "/sys/fs/cgroup/unified");
  CHECK(hybrid->root == "/");
  const auto plain = parse_cgroup2_mount(kPlain);
  REQUIRE(plain.has_value());
  CHECK(plain->mount_point == "/sys/fs/cgroup");
  const auto subtree = parse_cgroup2_mount(kSubtree);
  REQUIRE(subtree.has_value());
  CHECK(subtree->root == "/docker/abc");
}

TEST_CASE("parse_cgroup2_mount decodes octal escapes and refuses v1 only") {
  const auto spaced = parse_cgroup2_mount("40 1 0:29 / /mnt/my\\040cgroups rw - cgroup2 none rw\n");
  REQUIRE(spaced.has_value());
  CHECK(spaced->mount_point == "/mnt/my cgroups");
  CHECK(parse_cgroup2_mount("35 33 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw\n") ==
        std::nullopt);
  CHECK(parse_cgroup2_mount("") == std::nullopt);
  CHECK(parse_cgroup2_mount("garbage - cgroup2") == std::nullopt);
}

TEST_CASE("parse_unified_cgroup reads the 0:: line") {
  CHECK(parse_unified_cgroup("9:name=systemd:/\n4:memory:/x/y\n0::/\n") ==
        std::optional<std::string>("/"));
  CHECK(parse_unified_cgroup("0::/user.slice/user-0.slice/session-3.scope\n") ==
        std::optional<std::string>("/user.slice/user-0.slice/session-3.scope"));
  CHECK(parse_unified_cgroup("4:memory:/x\n") == std::nullopt);
  CHECK(parse_unified_cgroup("0::\n") == std::nullopt);
}

TEST_CASE("cgroup_folder joins the mount and the path, minus the mount's root") {
  CHECK(cgroup_folder({"/sys/fs/cgroup/unified", "/"}, "/") ==
        std::optional<std::string>("/sys/fs/cgroup/unified"));
  CHECK(cgroup_folder({"/sys/fs/cgroup", "/"}, "/a.slice/b.scope") ==
        std::optional<std::string>("/sys/fs/cgroup/a.slice/b.scope"));
  CHECK(cgroup_folder({"/sys/fs/cgroup", "/docker/abc"}, "/docker/abc/job") ==
        std::optional<std::string>("/sys/fs/cgroup/job"));
  CHECK(cgroup_folder({"/sys/fs/cgroup", "/docker/abc"}, "/docker/abc") ==
        std::optional<std::string>("/sys/fs/cgroup"));
  CHECK(cgroup_folder({"/sys/fs/cgroup", "/docker/abc"}, "/docker/abcd") == std::nullopt);
  CHECK(cgroup_folder({"/sys/fs/cgroup", "/docker/abc"}, "/other") == std::nullopt);
}

}  // namespace
}  // namespace perseus::launch
