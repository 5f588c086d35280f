// Request's completion and the counts of threads waiting for it (which the engine's settle and
// deadlock check read).
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "lib/comm/error.h"
#include "lib/comm/operation.h"

namespace perseus::comm {
namespace {

// Polls cond for up to a few seconds: a thread that is about to wait gets there soon.
template <typename Cond>
bool soon(Cond cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!cond() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST_CASE("a thread in wait() is counted on its request and in threads_waiting() until done") {
  Request request;
  const int before = threads_waiting();
  CHECK_FALSE(request.waited_on());
  std::thread waiter([&] { request.wait(); });
  CHECK(soon([&] { return request.waited_on(); }));
  CHECK(threads_waiting() == before + 1);
  request.succeed();
  waiter.join();
  CHECK_FALSE(request.waited_on());
  CHECK(threads_waiting() == before);
}

TEST_CASE("wait_quietly() is counted too, and a failed request still uncounts its waiter") {
  Request request;
  const int before = threads_waiting();
  std::thread waiter([&] { request.wait_quietly(); });
  CHECK(soon([&] { return threads_waiting() == before + 1; }));
  request.fail(Code::kInvalidArgument, "mismatch");
  waiter.join();
  CHECK(threads_waiting() == before);
  CHECK_THROWS_WITH_AS(request.wait(), "mismatch", Error);
  CHECK(threads_waiting() == before);
}

TEST_CASE("a request done before anyone waits returns at once, uncounted") {
  Request request;
  request.succeed();
  const int before = threads_waiting();
  request.wait();
  CHECK(threads_waiting() == before);
  CHECK(request.done());
}

TEST_CASE("unnamed operations' names are read back only from libperseus's own format") {
  CHECK(unnamed_name(OpKind::kAllreduce, 7) == "allreduce.noname.7");
  CHECK(process_set_suffix(0).empty());
  CHECK(process_set_suffix(3) == " [process set 3]");
  CHECK(unnamed_number("allreduce.noname.7", OpKind::kAllreduce, 0) == 7u);
  CHECK(unnamed_number(
            unnamed_name(OpKind::kBroadcast, 18446744073709551615u) + process_set_suffix(2),
            OpKind::kBroadcast, 2) == 18446744073709551615u);
  // Another kind or set, a missing or extra suffix, a number that is not one: not unnamed.
  CHECK_FALSE(unnamed_number("allreduce.noname.7", OpKind::kBroadcast, 0));
  CHECK_FALSE(unnamed_number("allreduce.noname.7 [process set 2]", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("allreduce.noname.7 [process set 2]", OpKind::kAllreduce, 3));
  CHECK_FALSE(unnamed_number("allreduce.noname.7", OpKind::kAllreduce, 2));
  CHECK_FALSE(unnamed_number("allreduce.noname.", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("allreduce.noname.7x", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("allreduce.noname.-1", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("allreduce.noname.18446744073709551616", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("layer.noname.7", OpKind::kAllreduce, 0));
  CHECK_FALSE(unnamed_number("x.allreduce.noname.7", OpKind::kAllreduce, 0));
}

}  // namespace
}  // namespace perseus::comm
