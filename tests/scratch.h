// Scratch space for tests and benchmarks: a temporary directory removed
// with everything in it, a small private tmpfs to fill, and the shared-memory
// files a killed tierkvd leaves behind.
#ifndef TIERKV_TESTS_SCRATCH_H_
#define TIERKV_TESTS_SCRATCH_H_

#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace tierkv {

// A fresh directory "<root>/<prefix>.XXXXXX"; removed, contents and all,
// on destruction. Aborts when it cannot be made (nothing can run without).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix,
                   const std::string& root = "/tmp") {
    std::string pattern = root + "/" + prefix + ".XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Mounts a tmpfs of `bytes` at `dir` (made if missing) in a mount
// namespace of this process's own, which the processes it starts inherit:
// a small filesystem to fill. Empty when done, else why not (for
// GTEST_SKIP: it needs root and a kernel that lets it unshare). Call it
// while the process has one thread (ctest runs each test in its own).
inline std::string MountTmpfs(const std::string& dir, uint64_t bytes) {
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  if (unshare(CLONE_NEWNS) != 0) {
    return std::string("unshare(CLONE_NEWNS) refused: ") + strerror(errno);
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return std::string("making / private refused: ") + strerror(errno);
  }
  const std::string size = "size=" + std::to_string(bytes);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0) {
    return std::string("mounting a tmpfs refused: ") + strerror(errno);
  }
  return "";
}

// Removes /dev/shm/tierkv.<store>.*: the segments and lock of a store whose
// tierkvd was killed.
inline void RemoveStoreSegments(const std::string& store) {
  const std::string prefix = "tierkv." + store + ".";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(prefix)) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_SCRATCH_H_
