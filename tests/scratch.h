// Scratch space for tests and benchmarks: a temporary directory removed
// with everything in it, and the shared-memory files a killed tierkvd
// leaves behind.
#ifndef TIERKV_TESTS_SCRATCH_H_
#define TIERKV_TESTS_SCRATCH_H_

#include <stdlib.h>

#include <cstdlib>
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
