// lib/comm/nccl/communicator: against fake CUDA and NCCL tables everywhere (timeouts, aborts,
// error texts, argument mapping), and against the real ones on a GPU (size 1: every operation on
// device buffers; size 2 with the second rank missing: the join's deadline).

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/nccl/communicator.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/nccl_api.h"
#include "tests/unit/fake_cuda.h"

namespace perseus::comm::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- Fakes: C function pointers, so their state is global; each test starts with reset(). ----

struct FakeState {
  NcclResult init_result = kNcclInProgress;
  NcclResult async_state = kNcclSuccess;  // what ncclCommGetAsyncError reports once joined
  int polls_until_joined = 3;
  int aborts = 0;
  int finalizes = 0;
  int destroys = 0;
  NcclDataType last_type = -1;
  NcclRedOp last_op = -1;
  int sends = 0;
  int recvs = 0;
  int memcpys = 0;
};
FakeState fake;
char fake_comm_storage;

NcclComm fake_comm() { return reinterpret_cast<NcclComm>(&fake_comm_storage); }

CudaApi fake_cuda() {
  CudaApi api = testing::fake_cuda<2>();
  api.memcpy_async = [](void *, const void *, size_t, int, CudaStream) {
    ++fake.memcpys;
    return kCudaSuccess;
  };
  return api;
}

NcclApi fake_nccl() {
  NcclApi api;
  api.get_unique_id = [](NcclUniqueId *id) {
    std::memset(id->internal, 'u', sizeof id->internal);
    return kNcclSuccess;
  };
  api.comm_init_rank_config = [](NcclComm *comm, int, NcclUniqueId, int, NcclConfig *config) {
    CHECK(config->blocking == 0);
    *comm = fake_comm();
    return fake.init_result;
  };
  api.comm_get_async_error = [](NcclComm, NcclResult *state) {
    if (fake.polls_until_joined > 0) {
      --fake.polls_until_joined;
      *state = kNcclInProgress;
    } else {
      *state = fake.async_state;
    }
    return kNcclSuccess;
  };
  api.comm_abort = [](NcclComm) {
    ++fake.aborts;
    return kNcclSuccess;
  };
  api.comm_finalize = [](NcclComm) {
    ++fake.finalizes;
    return kNcclSuccess;
  };
  api.comm_destroy = [](NcclComm) {
    ++fake.destroys;
    return kNcclSuccess;
  };
  api.all_reduce = [](const void *, void *, size_t, NcclDataType type, NcclRedOp op, NcclComm,
                      CudaStream) {
    fake.last_type = type;
    fake.last_op = op;
    return kNcclSuccess;
  };
  api.send = [](const void *, size_t, NcclDataType, int, NcclComm, CudaStream) {
    ++fake.sends;
    return kNcclSuccess;
  };
  api.recv = [](void *, size_t, NcclDataType, int, NcclComm, CudaStream) {
    ++fake.recvs;
    return kNcclSuccess;
  };
  api.group_start = [] { return kNcclSuccess; };
  api.group_end = [] { return kNcclSuccess; };
  api.get_error_string = [](NcclResult) {
    return "remote process exited or there was a network error";
  };
  api.get_last_error = [](NcclComm) { return "NET/Socket : peer 10.0.0.2 closed the connection"; };
  return api;
}

const CudaApi kFakeCuda = fake_cuda();
const NcclApi kFakeNccl = fake_nccl();

std::string echo(const std::string &mine) { return mine.empty() ? std::string(128, 'u') : mine; }

Clock::time_point in(milliseconds duration) { return Clock::now() + duration; }

TEST_CASE("a rank whose peers never join fails at the deadline, naming itself, and aborts") {
  fake = FakeState{};
  fake.polls_until_joined = 1 << 30;
  const auto start = Clock::now();
  try {
    Communicator comm(kFakeCuda, kFakeNccl, 1, 4, 1, echo, in(milliseconds(200)));
    FAIL("joined");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kTimeout);
    const std::string what = error.what();
    CHECK(what.find("rank 1 did not join the NCCL communicator within 0 s (4 ranks, CUDA device "
                    "1)") != std::string::npos);
    CHECK(what.find("PERSEUS_INIT_TIMEOUT") != std::string::npos);
  }
  CHECK(Clock::now() - start >= milliseconds(200));
  CHECK(Clock::now() - start < milliseconds(2000));
  CHECK(fake.aborts == 1);
}

TEST_CASE("rank 0 publishes a 128-byte id, the others fetch; a wrong id is refused") {
  fake = FakeState{};
  std::string published;
  {
    Communicator comm(
        kFakeCuda, kFakeNccl, 0, 2, 0,
        [&](const std::string &mine) {
          published = mine;
          return mine;
        },
        in(milliseconds(1000)));
  }
  CHECK(published == std::string(128, 'u'));
  CHECK(fake.finalizes == 1);
  CHECK(fake.destroys == 1);
  CHECK(fake.aborts == 0);

  fake = FakeState{};
  std::string asked = "unset";
  try {
    Communicator comm(
        kFakeCuda, kFakeNccl, 1, 2, 0,
        [&](const std::string &mine) {
          asked = mine;
          return std::string(12, 'x');
        },
        in(milliseconds(1000)));
    FAIL("joined");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kRendezvous);
    CHECK(std::string(error.what()).find("has 12 bytes, expected 128") != std::string::npos);
  }
  CHECK(asked.empty());
}

TEST_CASE("ranks and devices out of range are the caller's error") {
  fake = FakeState{};
  CHECK_THROWS_WITH_AS(Communicator(kFakeCuda, kFakeNccl, 2, 2, 0, echo, in(milliseconds(100))),
                       doctest::Contains("rank 2 is not in 0..1"), Error);
  CHECK_THROWS_WITH_AS(Communicator(kFakeCuda, kFakeNccl, 0, 2, 5, echo, in(milliseconds(100))),
                       doctest::Contains("this process sees 2 CUDA devices"), Error);
}

TEST_CASE("an asynchronous error aborts, names the cause, and fails every later call") {
  fake = FakeState{};
  Communicator comm(kFakeCuda, kFakeNccl, 0, 2, 0, echo, in(milliseconds(1000)));
  CHECK_NOTHROW(comm.check_async_error());
  fake.async_state = kNcclRemoteError;
  try {
    comm.check_async_error();
    FAIL("no error");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kCommunication);
    const std::string what = error.what();
    CHECK(what.find("NCCL rank 0 of 2 (CUDA device 0): asynchronous NCCL error: a peer failed or "
                    "was lost") != std::string::npos);
    CHECK(what.find("ncclRemoteError = 6") != std::string::npos);
    CHECK(what.find("peer 10.0.0.2 closed the connection") != std::string::npos);
  }
  CHECK(fake.aborts == 1);
  float buffer = 0;
  CHECK_THROWS_WITH_AS(
      comm.allreduce(&buffer, &buffer, 1, DataType::kFloat32, ReduceOp::kSum, nullptr),
      doctest::Contains("was aborted after: NCCL rank 0 of 2"), Error);
  comm.abort();  // idempotent
  CHECK(fake.aborts == 1);
}

TEST_CASE("types and ops map to NCCL's; alltoallv sends to peers and copies its own block") {
  fake = FakeState{};
  Communicator comm(kFakeCuda, kFakeNccl, 1, 3, 0, echo, in(milliseconds(1000)));
  float buffer[16] = {};
  comm.allreduce(buffer, buffer, 4, DataType::kBfloat16, ReduceOp::kAverage, nullptr);
  CHECK(fake.last_type == kNcclBfloat16);
  CHECK(fake.last_op == kNcclAvg);
  comm.allreduce(buffer, buffer, 4, DataType::kUint8, ReduceOp::kProduct, nullptr);
  CHECK(fake.last_type == kNcclUint8);
  CHECK(fake.last_op == kNcclProd);
  const size_t send_counts[] = {1, 2, 0};
  const size_t recv_counts[] = {3, 2, 1};
  comm.alltoallv(buffer, send_counts, buffer + 8, recv_counts, DataType::kFloat32, nullptr);
  CHECK(fake.sends == 1);  // to rank 0 (nothing to rank 2)
  CHECK(fake.recvs == 2);  // from ranks 0 and 2
  CHECK(fake.memcpys == 1);
  const size_t mismatched[] = {3, 5, 1};
  CHECK_THROWS_WITH_AS(
      comm.alltoallv(buffer, send_counts, buffer + 8, mismatched, DataType::kFloat32, nullptr),
      doctest::Contains("sends 2 elements to itself (rank 1) but expects 5"), Error);
  const size_t two[] = {1, 2};
  CHECK_THROWS_WITH_AS(comm.allgatherv(buffer, buffer, two, DataType::kFloat32, nullptr),
                       doctest::Contains("2 counts for 3 ranks"), Error);
}

TEST_CASE("one rank: an average goes to NCCL as a sum (a copy), every other op unchanged") {
  fake = FakeState{};
  fake.polls_until_joined = 0;
  Communicator alone(kFakeCuda, kFakeNccl, 0, 1, 0, echo, in(milliseconds(1000)));
  float buffer[8] = {};
  alone.allreduce(buffer, buffer + 4, 4, DataType::kFloat32, ReduceOp::kAverage, nullptr);
  CHECK(fake.last_op == kNcclSum);
  alone.allreduce(buffer, buffer, 4, DataType::kFloat16, ReduceOp::kMax, nullptr);
  CHECK(fake.last_op == kNcclMax);
  alone.allreduce(buffer, buffer, 4, DataType::kInt32, ReduceOp::kProduct, nullptr);
  CHECK(fake.last_op == kNcclProd);
  Communicator pair(kFakeCuda, kFakeNccl, 1, 2, 0, echo, in(milliseconds(1000)));
  pair.allreduce(buffer, buffer, 4, DataType::kFloat32, ReduceOp::kAverage, nullptr);
  CHECK(fake.last_op == kNcclAvg);
}

// ---- The real CUDA runtime and NCCL: on a GPU only (skipped elsewhere) ----

bool no_gpu() { return !nccl_available(nullptr); }

// Device buffer of `count` elements of T, with its host copy.
template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t count) : host(count) {
    REQUIRE(cuda_api().malloc(&device, count * sizeof(T) + 1) == kCudaSuccess);
  }
  ~DeviceBuffer() { cuda_api().free(device); }
  void upload(CudaStream stream) {
    REQUIRE(cuda_api().memcpy_async(device, host.data(), host.size() * sizeof(T),
                                    kCudaMemcpyDefault, stream) == kCudaSuccess);
  }
  void download(CudaStream stream) {
    REQUIRE(cuda_api().memcpy_async(host.data(), device, host.size() * sizeof(T),
                                    kCudaMemcpyDefault, stream) == kCudaSuccess);
    REQUIRE(cuda_api().stream_synchronize(stream) == kCudaSuccess);
  }
  std::vector<T> host;
  void *device = nullptr;
};

struct Stream {
  Stream() {
    REQUIRE(cuda_api().set_device(0) == kCudaSuccess);
    REQUIRE(cuda_api().stream_create_with_flags(&stream, kCudaStreamNonBlocking) == kCudaSuccess);
  }
  ~Stream() { cuda_api().stream_destroy(stream); }
  CudaStream stream = nullptr;
};

template <typename T>
void check_identity_ops(Communicator &comm, DataType type, CudaStream stream, size_t count = 1000) {
  DeviceBuffer<T> send(count);
  DeviceBuffer<T> recv(count);
  for (size_t i = 0; i < count; ++i) send.host[i] = static_cast<T>(i % 100);
  send.upload(stream);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    CAPTURE(name_of(op));
    comm.allreduce(send.device, recv.device, count, type, op, stream);
    recv.download(stream);
    CHECK(recv.host == send.host);
  }
}

TEST_CASE("one rank: every operation on device buffers gives its input back" *
          doctest::skip(no_gpu())) {
  Stream stream;
  Communicator comm(0, 1, 0, echo, in(milliseconds(30000)));
  check_identity_ops<uint8_t>(comm, DataType::kUint8, stream.stream);
  check_identity_ops<int8_t>(comm, DataType::kInt8, stream.stream);
  check_identity_ops<int32_t>(comm, DataType::kInt32, stream.stream);
  check_identity_ops<int64_t>(comm, DataType::kInt64, stream.stream);
  check_identity_ops<uint16_t>(comm, DataType::kFloat16, stream.stream);   // bits: 0..99 are
  check_identity_ops<uint16_t>(comm, DataType::kBfloat16, stream.stream);  // tiny subnormals
  check_identity_ops<float>(comm, DataType::kFloat32, stream.stream);
  check_identity_ops<double>(comm, DataType::kFloat64, stream.stream);
  // Sizes whose last elements NCCL's one-rank ncclAvg was seen to get wrong.
  check_identity_ops<float>(comm, DataType::kFloat32, stream.stream, 4913);
  check_identity_ops<double>(comm, DataType::kFloat64, stream.stream, 65537);
  check_identity_ops<uint16_t>(comm, DataType::kFloat16, stream.stream, (1 << 20) + 3);
  check_identity_ops<float>(comm, DataType::kFloat32, stream.stream, (1 << 20) + 3);
  check_identity_ops<double>(comm, DataType::kFloat64, stream.stream, (1 << 20) + 3);

  const size_t count = 777;
  DeviceBuffer<float> send(count);
  DeviceBuffer<float> recv(count);
  for (size_t i = 0; i < count; ++i) send.host[i] = static_cast<float>(i) * 0.5f - 7.0f;
  send.upload(stream.stream);
  const auto round_trip = [&](const char *what) {
    CAPTURE(what);
    recv.download(stream.stream);
    CHECK(recv.host == send.host);
    std::fill(recv.host.begin(), recv.host.end(), -1.0f);
    recv.upload(stream.stream);
  };
  comm.broadcast(send.device, recv.device, count, DataType::kFloat32, 0, stream.stream);
  round_trip("broadcast");
  comm.allgather(send.device, recv.device, count, DataType::kFloat32, stream.stream);
  round_trip("allgather");
  const size_t counts[] = {count};
  comm.allgatherv(send.device, recv.device, counts, DataType::kFloat32, stream.stream);
  round_trip("allgatherv");
  comm.reducescatter(send.device, recv.device, count, DataType::kFloat32, ReduceOp::kSum,
                     stream.stream);
  round_trip("reducescatter");
  comm.alltoallv(send.device, counts, recv.device, counts, DataType::kFloat32, stream.stream);
  round_trip("alltoallv");
  CHECK_NOTHROW(comm.check_async_error());
  CHECK_NOTHROW(comm.finalize(milliseconds(10000)));
}

TEST_CASE("two ranks with the second missing: the first times out naming itself" *
          doctest::skip(no_gpu())) {
  const auto start = Clock::now();
  try {
    Communicator comm(0, 2, 0, echo, in(milliseconds(3000)));
    FAIL("joined alone");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kTimeout);
    CHECK(std::string(error.what()).find("rank 0 did not join the NCCL communicator within") !=
          std::string::npos);
    MESSAGE(std::string(error.what()));
  }
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  MESSAGE("timed out and aborted in " << took.count() << " ms");
  CHECK(took < milliseconds(15000));
}

}  // namespace
}  // namespace perseus::comm::nccl
