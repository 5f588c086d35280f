// Raw NCCL all-reduce: the baseline Perseus's NCCL path is measured against (issue 6: within 3%
// of raw NCCL at 1 MB and up). One process drives every visible GPU (ncclCommInitAll), as
// nccl-tests' all_reduce_perf -g N does; float32 sum, out of place (--in-place for in place), from
// 8 B to 1 GiB, doubling. Prints a table, then one JSON line per size.
//
// NCCL and the CUDA runtime come through libperseus's dlopen tables (lib/comm/nccl), so this
// builds without nvcc or CUDA headers and runs wherever libcudart and libnccl.so.2 load.
//
// Times are host wall clock around `iters` back-to-back all-reduces on every GPU, ended by a
// stream synchronisation (nccl-tests' method); --blocking synchronises after every call instead.
// algbw = bytes / time; busbw = algbw * 2 (n - 1) / n, nccl-tests' bus bandwidth, which is 0 for
// one GPU (nothing crosses a link).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/nccl_api.h"

namespace perseus::comm::nccl {
namespace {

struct Options {
  size_t min_bytes = 8;
  size_t max_bytes = size_t{1} << 30;
  int gpus = 0;  // 0: every visible GPU
  int warmup = 5;
  int iters = 0;  // 0: by size (see iterations_for)
  bool in_place = false;
  bool blocking = false;  // synchronise after every call (a blocking API's cost)
};

struct Gpu {
  int device = 0;
  NcclComm comm = nullptr;
  CudaStream stream = nullptr;
  float *send = nullptr;
  float *recv = nullptr;
};

[[noreturn]] void usage(const char *program) {
  std::fprintf(stderr,
               "usage: %s [--min-bytes N] [--max-bytes N] [--gpus N] [--warmup N] [--iters N] "
               "[--in-place] [--blocking]\n",
               program);
  std::exit(2);
}

Options parse(int argc, char **argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] { return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0; };
    if (arg == "--min-bytes") {
      options.min_bytes = value();
    } else if (arg == "--max-bytes") {
      options.max_bytes = value();
    } else if (arg == "--gpus") {
      options.gpus = static_cast<int>(value());
    } else if (arg == "--warmup") {
      options.warmup = static_cast<int>(value());
    } else if (arg == "--iters") {
      options.iters = static_cast<int>(value());
    } else if (arg == "--in-place") {
      options.in_place = true;
    } else if (arg == "--blocking") {
      options.blocking = true;
    } else {
      usage(argv[0]);
    }
  }
  if (options.min_bytes < 4 || options.max_bytes < options.min_bytes) usage(argv[0]);
  return options;
}

// Enough repetitions that a size's time is well above the clock's and the launch jitter, and
// few enough that 1 GiB stays within seconds.
int iterations_for(size_t bytes, const Options &options) {
  if (options.iters > 0) return options.iters;
  if (bytes <= (size_t{1} << 20)) return 200;
  if (bytes <= (size_t{64} << 20)) return 50;
  return 20;
}

void nccl_check(const NcclApi &nccl, NcclResult result, const char *doing) {
  if (result != kNcclSuccess) {
    throw Error(Code::kCommunication, std::string(doing) + ": " + nccl.describe(result, nullptr));
  }
}

void run_all(const CudaApi &cuda, const NcclApi &nccl, std::vector<Gpu> &gpus, size_t count,
             bool in_place, bool blocking, int times) {
  for (int t = 0; t < times; ++t) {
    nccl_check(nccl, nccl.group_start(), "ncclGroupStart");
    for (Gpu &gpu : gpus) {
      const float *send = in_place ? gpu.recv : gpu.send;
      nccl_check(
          nccl,
          nccl.all_reduce(send, gpu.recv, count, kNcclFloat32, kNcclSum, gpu.comm, gpu.stream),
          "ncclAllReduce");
    }
    nccl_check(nccl, nccl.group_end(), "ncclGroupEnd");
    if (blocking) {
      for (Gpu &gpu : gpus) {
        cuda.check(cuda.stream_synchronize(gpu.stream), "cudaStreamSynchronize");
      }
    }
  }
  for (Gpu &gpu : gpus) cuda.check(cuda.stream_synchronize(gpu.stream), "cudaStreamSynchronize");
}

// Out of place, every GPU's send holds (its index + 1), so every element of recv must be
// n (n + 1) / 2, exactly in float32. Checks the first and the last element.
bool result_ok(const CudaApi &cuda, std::vector<Gpu> &gpus, size_t count) {
  const auto n = static_cast<float>(gpus.size());
  const float expected = n * (n + 1) / 2;
  for (Gpu &gpu : gpus) {
    float ends[2] = {0, 0};
    cuda.check(cuda.memcpy_async(&ends[0], gpu.recv, sizeof(float), kCudaMemcpyDefault, gpu.stream),
               "cudaMemcpyAsync");
    cuda.check(cuda.memcpy_async(&ends[1], gpu.recv + count - 1, sizeof(float), kCudaMemcpyDefault,
                                 gpu.stream),
               "cudaMemcpyAsync");
    cuda.check(cuda.stream_synchronize(gpu.stream), "cudaStreamSynchronize");
    if (ends[0] != expected || ends[1] != expected) return false;
  }
  return true;
}

void set_up(const CudaApi &cuda, const NcclApi &nccl, std::vector<Gpu> &gpus, size_t max_count) {
  std::vector<NcclComm> comms(gpus.size());
  std::vector<int> devices;
  for (const Gpu &gpu : gpus) devices.push_back(gpu.device);
  nccl_check(nccl, nccl.comm_init_all(comms.data(), static_cast<int>(gpus.size()), devices.data()),
             "ncclCommInitAll");
  std::vector<float> host(max_count);
  for (size_t i = 0; i < gpus.size(); ++i) {
    Gpu &gpu = gpus[i];
    gpu.comm = comms[i];
    cuda.check(cuda.set_device(gpu.device), "cudaSetDevice");
    cuda.check(cuda.stream_create_with_flags(&gpu.stream, kCudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    cuda.check(cuda.malloc(reinterpret_cast<void **>(&gpu.send), max_count * sizeof(float)),
               "cudaMalloc");
    cuda.check(cuda.malloc(reinterpret_cast<void **>(&gpu.recv), max_count * sizeof(float)),
               "cudaMalloc");
    std::fill(host.begin(), host.end(), static_cast<float>(i + 1));
    cuda.check(cuda.memcpy_async(gpu.send, host.data(), max_count * sizeof(float),
                                 kCudaMemcpyDefault, gpu.stream),
               "cudaMemcpyAsync");
    cuda.check(cuda.memset_async(gpu.recv, 0, max_count * sizeof(float), gpu.stream),
               "cudaMemsetAsync");
    cuda.check(cuda.stream_synchronize(gpu.stream), "cudaStreamSynchronize");
  }
}

void tear_down(const CudaApi &cuda, const NcclApi &nccl, std::vector<Gpu> &gpus) {
  for (Gpu &gpu : gpus) {
    cuda.set_device(gpu.device);
    nccl.comm_destroy(gpu.comm);
    cuda.free(gpu.send);
    cuda.free(gpu.recv);
    cuda.stream_destroy(gpu.stream);
  }
}

struct Row {
  size_t bytes;
  int iters;
  double time_us;
  double algbw;
  double busbw;
  bool ok;
};

int run(const Options &options) {
  const CudaApi &cuda = cuda_api();
  const NcclApi &nccl = nccl_api();
  int visible = 0;
  cuda.check(cuda.get_device_count(&visible), "cudaGetDeviceCount");
  const int n = options.gpus > 0 ? options.gpus : visible;
  if (n > visible) throw Error(Code::kInvalidArgument, "--gpus is more than the visible GPUs");
  std::vector<Gpu> gpus(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) gpus[static_cast<size_t>(i)].device = i;
  const size_t max_count = options.max_bytes / sizeof(float);
  set_up(cuda, nccl, gpus, max_count);

  std::printf(
      "# nccl_raw_allreduce: NCCL %s (%s), CUDA runtime %s, %d GPU(s), float32 sum, %s, %s\n",
      nccl.version_string().c_str(), nccl.library.c_str(), cuda.library.c_str(), n,
      options.in_place ? "in place" : "out of place",
      options.blocking ? "synchronised after each call" : "back to back");
  std::printf("%14s %8s %12s %12s %12s %6s\n", "bytes", "iters", "time_us", "algbw_GB/s",
              "busbw_GB/s", "check");
  std::vector<Row> rows;
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    const int iters = iterations_for(bytes, options);
    run_all(cuda, nccl, gpus, count, options.in_place, options.blocking, options.warmup);
    const auto start = std::chrono::steady_clock::now();
    run_all(cuda, nccl, gpus, count, options.in_place, options.blocking, iters);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    const double seconds = took.count() / iters;
    const double algbw = static_cast<double>(bytes) / seconds / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    const bool ok = options.in_place || result_ok(cuda, gpus, count);
    rows.push_back({bytes, iters, seconds * 1e6, algbw, busbw, ok});
    std::printf("%14zu %8d %12.2f %12.2f %12.2f %6s\n", bytes, iters, seconds * 1e6, algbw, busbw,
                options.in_place ? "-" : (ok ? "ok" : "WRONG"));
    std::fflush(stdout);
  }
  for (const Row &row : rows) {
    std::printf(
        "{\"bench\":\"nccl_raw_allreduce\",\"nccl\":\"%s\",\"gpus\":%d,\"dtype\":\"float32\","
        "\"in_place\":%s,\"blocking\":%s,\"bytes\":%zu,\"iters\":%d,\"time_us\":%.3f,\"algbw_"
        "gbps\":%.3f,"
        "\"busbw_gbps\":%.3f,\"correct\":%s}\n",
        nccl.version_string().c_str(), n, options.in_place ? "true" : "false",
        options.blocking ? "true" : "false", row.bytes, row.iters, row.time_us, row.algbw,
        row.busbw, row.ok ? "true" : "false");
  }
  tear_down(cuda, nccl, gpus);
  for (const Row &row : rows) {
    if (!row.ok) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace perseus::comm::nccl

int main(int argc, char **argv) {
  try {
    return perseus::comm::nccl::run(perseus::comm::nccl::parse(argc, argv));
  } catch (const perseus::comm::Error &error) {
    std::fprintf(stderr, "nccl_raw_allreduce: error: %s\n", error.what());
    return 1;
  }
}
