#pragma once
// Slurm's PMI2 client library and the PMIx client library, loaded at run time (dlopen) for
// bootstrapping a job that `srun --mpi=pmi2` started without perseusrun or MPI: the process
// manager's key-value space (KVS) carries what the ranks exchange. libperseus does not link it, so
// that it loads where Slurm is not installed.
//
// The KVS belongs to the job step: only its tasks reach it, through the socket slurmstepd hands
// each task (PMI_FD), and Slurm moves it between nodes itself; nothing of it is in the
// environment or on a command line. Values are at most 1024 bytes, keys 64 (PMI2's limits);
// put_bytes / get_bytes split longer binary values into hex chunks under numbered keys.
//
// Threads: one call at a time, from the thread that runs perseus_init. Every failing call
// throws Error(kRendezvous) naming the call, its return code and what to do.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace perseus::comm {

class Pmi2Library {
 public:
  // Opens `names` in order (the first that loads wins) and binds the functions used here.
  // Throws Error(kRendezvous) with `why_needed`, every name tried and dlerror's text.
  static Pmi2Library open(const std::vector<std::string> &names, const std::string &why_needed);

  const std::string &path() const { return path_; }
  // PMI2_Init, then the job's id; rank() and size() are valid after it.
  void init();
  int rank() const { return rank_; }
  int size() const { return size_; }
  // `bytes` under `key` (hex chunks "key/0", "key/1", ...), visible to the other tasks after the
  // next fence.
  void put_bytes(const std::string &key, const void *bytes, size_t size) const;
  // PMI2_KVS_Fence: collective over the step's tasks.
  void fence() const;
  // What task `source` put under `key`, exactly `size` bytes (a size mismatch throws).
  void get_bytes(int source, const std::string &key, void *bytes, size_t size) const;
  void finalize() const;

 private:
  struct Api {
    int (*init)(int *spawned, int *size, int *rank, int *appnum);
    int (*finalize)();
    int (*job_get_id)(char *jobid, int jobid_size);
    int (*kvs_put)(const char *key, const char *value);
    int (*kvs_fence)();
    int (*kvs_get)(const char *jobid, int source, const char *key, char *value, int max_value,
                   int *value_length);
  };

  Pmi2Library(std::string path, const Api &api) : path_(std::move(path)), api_(api) {}
  void check(int rc, const char *call) const;

  std::string path_;
  Api api_;
  std::string job_id_;
  int rank_ = 0;
  int size_ = 0;
};

// The PMIx client (libpmix.so.2), with the same use: init, put, fence, get, finalize. Only the
// PMIx standard's stable ABI is used, declared here rather than from pmix.h so that the build
// needs no PMIx headers: pmix_proc_t is a 256-byte namespace and a uint32 rank; pmix_value_t a
// uint16 type and, 8 bytes in, a union of 24 bytes (32 in all) whose string member is a char *
// and whose uint32 member is what PMIX_JOB_SIZE gives; pmix_info_t a 512-byte key, uint32
// directives and a value (552 bytes). Values are put as PMIX_STRING (hex) in the global scope,
// committed, fenced over the whole namespace with PMIX_COLLECT_DATA (so that every value is
// local when got), and got from the rank that put them.
class PmixLibrary {
 public:
  static PmixLibrary open(const std::vector<std::string> &names, const std::string &why_needed);

  const std::string &path() const { return path_; }
  void init();
  int rank() const { return rank_; }
  int size() const { return size_; }
  void put_bytes(const std::string &key, const void *bytes, size_t size) const;
  void fence() const;
  void get_bytes(int source, const std::string &key, void *bytes, size_t size) const;
  void finalize() const;

  struct Proc {
    char nspace[256];
    uint32_t rank;
  };
  struct Value {
    uint16_t type;
    union {
      bool flag;
      char *string;
      uint32_t uint32;
      unsigned char bytes[24];
    } data;
  };
  // pmix_info_t: a 512-byte key, uint32 directives, a value.
  struct Info {
    char key[512];
    uint32_t flags;
    Value value;
  };

 private:
  struct Api {
    int (*init)(Proc *proc, void *info, size_t ninfo);
    int (*finalize)(const void *info, size_t ninfo);
    int (*put)(uint8_t scope, const char *key, Value *value);
    int (*commit)();
    int (*fence)(const Proc *procs, size_t nprocs, const Info *info, size_t ninfo);
    int (*get)(const Proc *proc, const char *key, const void *info, size_t ninfo, Value **value);
    void (*value_destruct)(Value *value);  // null before PMIx 4: the value is then kept
  };
  void release(Value *value) const;

  PmixLibrary(std::string path, const Api &api) : path_(std::move(path)), api_(api) {}
  void check(int rc, const char *call) const;

  std::string path_;
  Api api_;
  Proc self_{};
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace perseus::comm
