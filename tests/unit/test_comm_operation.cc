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

}  // namespace
}  // namespace perseus::comm
