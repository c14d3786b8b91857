// The disk tier's production storage: a RocksDB database (the index of
// record: one small record per block) and the value file beside it (the
// blocks' bytes), their options, and RocksDB's and the kernel's errors
// translated into tierkv's.
#include <fcntl.h>
#include <limits.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/debug.h>
#include <rocksdb/write_batch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ipc/unique_fd.h"
#include "src/mutex.h"
#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

// ---------------------------------------------------------------------------
// RocksDB storage.

// Paths of the store's files that a RocksDB message names (SST, blob, log
// and MANIFEST files), in the order named, without repeats.
std::vector<std::string> FilesNamedIn(std::string_view msg) {
  std::vector<std::string> files;
  size_t pos = 0;
  while (pos < msg.size()) {
    const size_t end = msg.find_first_of(" :,;'\"", pos);
    std::string_view word =
        msg.substr(pos, end == msg.npos ? msg.npos : end - pos);
    const bool file = word.ends_with(".sst") || word.ends_with(".blob") ||
                      word.ends_with(".log") ||
                      word.find("MANIFEST-") != word.npos;
    if (file && std::find(files.begin(), files.end(), word) == files.end()) {
      files.emplace_back(word);
    }
    if (end == msg.npos) break;
    pos = end + 1;
  }
  return files;
}

// RocksDB's Status, as a tierkv Status saying what to do about it.
Status FromRocks(const rocksdb::Status& s, std::string_view what,
                 const std::string& path) {
  if (s.ok()) return Status::Ok();
  std::string msg =
      std::string(what) + " in RocksDB store " + path + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption() || s.IsPathNotFound()) {
    return Status::DataLoss(
        msg +
        "; the store's files are damaged or missing: move the directory "
        "aside (RocksDB's ldb repair may salvage it), or start with "
        "--disk-reset to drop its contents");
  }
  if (s.IsNoSpace()) {
    return Status::ResourceExhausted(
        msg + "; free disk space or lower the disk tier's capacity");
  }
  if (s.IsIOError()) {
    // RocksDB's own words (ours name blocks, which contain "lock").
    const std::string rocks = s.ToString();
    // First: opening the LOCK file fails this way too.
    if (rocks.find("ermission denied") != std::string::npos ||
        rocks.find("Read-only file system") != std::string::npos) {
      return Status::PermissionDenied(
          msg +
          "; check the directory's owner and mode, and that tierkvd may "
          "write there (systemd: ReadWritePaths= for a --disk-dir outside "
          "its StateDirectory)");
    }
    // Taking the LOCK file's lock: another process holds it.
    if (rocks.find("While lock file") != std::string::npos ||
        rocks.find("lock hold by current process") != std::string::npos) {
      return Status::AlreadyExists(
          msg + "; another process (a running tierkvd?) has this store open");
    }
    return Status::Unavailable(msg + "; check the disk and the filesystem");
  }
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(msg));
  if (s.IsNotSupported()) return Status::Unimplemented(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut() || s.IsIncomplete()) {
    return Status::Unavailable(std::move(msg) + "; retrying may help");
  }
  return Status::Internal(std::move(msg));
}

// Runs `fn` (returning rocksdb::Status) and converts its result; RocksDB's
// C++ API reports through Status, but allocation can still throw.
template <typename Fn>
Status CallRocks(std::string_view what, const std::string& path, Fn&& fn) {
  try {
    return FromRocks(fn(), what, path);
  } catch (const std::exception& e) {
    return Status::Internal(std::string(what) + " in RocksDB store " + path +
                            " threw: " + e.what());
  }
}

rocksdb::Slice ToSlice(std::string_view s) { return {s.data(), s.size()}; }

std::string ValueFilePath(const std::string& path) {
  return path + "/" + std::string(kDiskValueFileName);
}

StatusOr<uint64_t> FreeBytesAt(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) {
    const int err = errno;
    std::string msg = "disk tier directory " + path + ": " + std::strerror(err);
    if (err == ENOENT) return Status::NotFound(msg + " (removed while in use)");
    return Status::Unavailable(std::move(msg));
  }
  return uint64_t{st.f_bavail} * st.f_frsize;
}

// An errno from the value file, as a Status saying what to do about it.
Status FromErrno(int err, std::string_view what, const std::string& file) {
  std::string msg =
      std::string(what) + " value file " + file + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) {
    return Status::ResourceExhausted(
        msg + "; free disk space or lower the disk tier's capacity");
  }
  if (err == EACCES || err == EPERM || err == EROFS) {
    return Status::PermissionDenied(msg +
                                    "; check the directory's owner and mode");
  }
  return Status::Unavailable(msg + "; check the disk and the filesystem");
}

// FromErrno for a read of the value file: short of memory, or a network
// filesystem's server slow to answer, the bytes may well read back later
// (ResourceExhausted or DeadlineExceeded: IsTransientReadError).
Status FromReadErrno(int err, const std::string& file) {
  if (err == ENOMEM || err == ENOBUFS || err == EAGAIN || err == ETIMEDOUT) {
    std::string msg = "reading the value file " + file + ": " +
                      std::strerror(err) + "; retrying may help";
    return err == ETIMEDOUT ? Status::DeadlineExceeded(std::move(msg))
                            : Status::ResourceExhausted(std::move(msg));
  }
  return FromErrno(err, "reading the", file);
}

class RocksDbStorage final : public DiskStorage {
 public:
  // `read_only`: why the database was opened read-only; OK if it was not.
  // `values_fd`: the value file, opened for writing unless read-only; -1
  // when a read-only store has none (every read of it then fails).
  // `lock_fd`: the store directory's lock (LockStoreDirectory), held for
  // the storage's life.
  RocksDbStorage(const RocksDbStorageOptions& options, rocksdb::DB* db,
                 int values_fd, Status read_only, int lock_fd)
      : path_(options.path),
        values_path_(ValueFilePath(options.path)),
        db_(db),
        values_fd_(values_fd),
        lock_fd_(lock_fd),
        reserved_(RocksDbReservedBytes(options)),
        read_only_(std::move(read_only)) {
    // See RocksDbStorageOptions::write_ahead_log.
    write_options_.disableWAL = !options.write_ahead_log;
    // Every record carries its own checksum (verified by the tier), so
    // RocksDB's block checksums would be a second pass over the same
    // bytes. Open's scan (ForEach) verifies them once.
    read_options_.verify_checksums = false;
    read_options_.fill_cache = false;
  }
  ~RocksDbStorage() override {
    // With the write-ahead log, Close writes nothing (see RocksOptions:
    // avoid_flush_during_shutdown), so nothing is written after a write
    // error; the tier's Flush has flushed the memtables of a healthy store
    // before. Without the log, Close flushes them; after a write error
    // RocksDB has stopped the database and skips that flush. With nobody to
    // report to, a failure here only loses unflushed blocks, which the next
    // Open does not miss.
    rocksdb::Status ignored = db_->Close();
    (void)ignored;
    if (values_fd_ >= 0) close(values_fd_);
    if (lock_fd_ >= 0) close(lock_fd_);  // Last: the store is let go.
  }

  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    while (!bytes.empty()) {
      const ssize_t n = pwrite(values_fd_, bytes.data(), bytes.size(),
                               static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return ValueFileWriteError(n < 0 ? errno : EIO, "writing to the");
      }
      bytes.remove_prefix(static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }

  Status ReadPayload(uint64_t offset,
                     std::span<const std::span<std::byte>> outs) override {
    if (values_fd_ < 0) {
      return Status::DataLoss("the store has no value file " + values_path_);
    }
    std::vector<iovec> iov;
    iov.reserve(outs.size());
    for (std::span<std::byte> out : outs) {
      if (!out.empty()) iov.push_back({out.data(), out.size()});
    }
    size_t first = 0;  // iov[first..] is still to read.
    while (first < iov.size()) {
      const int count =
          static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      const ssize_t n =
          preadv(values_fd_, &iov[first], count, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return FromReadErrno(errno, values_path_);
      if (n == 0) {
        return Status::DataLoss("value file " + values_path_ +
                                " ends before offset " +
                                std::to_string(offset + 1));
      }
      offset += static_cast<uint64_t>(n);
      for (size_t left = static_cast<size_t>(n); left > 0;) {
        const size_t step = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
        iov[first].iov_len -= step;
        left -= step;
        if (iov[first].iov_len == 0) ++first;
      }
    }
    return Status::Ok();
  }

  Status ReleasePayload(uint64_t offset, uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    if (bytes == 0) return Status::Ok();
    if (fallocate(values_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0 ||
        errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      // A filesystem without holes keeps the bytes: only space is lost.
      return Status::Ok();
    }
    return ValueFileWriteError(errno, "releasing space in the");
  }

  Status TruncatePayloads(uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    struct stat st {};
    if (fstat(values_fd_, &st) == 0 &&
        static_cast<uint64_t>(st.st_size) <= bytes) {
      return Status::Ok();
    }
    if (ftruncate(values_fd_, static_cast<off_t>(bytes)) != 0) {
      return Checked(FromErrno(errno, "truncating the", values_path_));
    }
    return Status::Ok();
  }

  Status Put(std::string_view key,
             std::span<const std::string_view> value_parts) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    return Checked(CallRocks("writing a block", path_, [&] {
      std::vector<rocksdb::Slice> parts;
      size_t bytes = key.size();
      for (std::string_view part : value_parts) {
        parts.push_back(ToSlice(part));
        bytes += part.size();
      }
      const rocksdb::Slice k = ToSlice(key);
      rocksdb::WriteBatch batch(bytes + 64);
      rocksdb::Status s = batch.Put(
          rocksdb::SliceParts(&k, 1),
          rocksdb::SliceParts(parts.data(), static_cast<int>(parts.size())));
      return s.ok() ? db_->Write(write_options_, &batch) : s;
    }));
  }

  Status Get(std::string_view key, const ValueReader& read) override {
    return GetWith(read_options_, key, read);
  }

  Status Delete(std::string_view key) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    // Always logged (see write_ahead_log): a removal must survive a kill.
    return Checked(CallRocks("deleting a block", path_, [&] {
      return db_->Delete(rocksdb::WriteOptions(), ToSlice(key));
    }));
  }

  Status DeleteBatch(std::span<const std::string> keys) override {
    TIERKV_RETURN_IF_ERROR(Writable());
    return Checked(CallRocks("deleting blocks", path_, [&] {
      rocksdb::WriteBatch batch;
      for (const std::string& key : keys) {
        rocksdb::Status s = batch.Delete(ToSlice(key));
        if (!s.ok()) return s;
      }
      return db_->Write(rocksdb::WriteOptions(), &batch);
    }));
  }

  // Verifies every SST file whole first (DataLoss naming a damaged one: its
  // keys cannot be listed past the damage), then lists the keys (from the
  // SSTs and memtables, no values read) and reads each value with its
  // checksums verified: a damaged record then fails its own key only,
  // where an iterator would stop at it and hide every key after it. A
  // damaged record is visited as empty (the tier drops it) and its file
  // recorded.
  // The listing (RocksDB's GetAllKeyVersions) ends at the first block it
  // cannot read and reports OK, hence the SST check before it.
  Status ForEach(const Visitor& visit) override {
    TIERKV_RETURN_IF_ERROR(VerifySsts());
    rocksdb::ReadOptions verified;
    verified.verify_checksums = true;
    verified.fill_cache = false;
    std::string last;
    bool first = true;
    // Records are small: a header and the block's token ids.
    const size_t batch = 4096;
    while (true) {
      std::vector<rocksdb::KeyVersion> versions;
      TIERKV_RETURN_IF_ERROR(CallRocks("listing the store's keys", path_, [&] {
        return rocksdb::GetAllKeyVersions(db_.get(), ToSlice(last),
                                          rocksdb::Slice(), batch, &versions);
      }));
      bool progressed = false;
      for (const rocksdb::KeyVersion& v : versions) {
        if (!first && v.user_key <= last) continue;  // Seen (or older).
        first = false;
        last = v.user_key;
        progressed = true;
        TIERKV_RETURN_IF_ERROR(VisitVerified(verified, v, visit));
      }
      if (versions.size() < batch) return Status::Ok();
      if (!progressed) {
        // One key with more versions than a batch: skip past it.
        last.push_back('\0');
        first = true;
      }
    }
  }

  // The value file first: a record made durable by the flush then points
  // at bytes that are durable too. (Records flushed earlier by RocksDB
  // itself may precede their bytes to the disk; a machine crash then leaves
  // a record whose bytes fail their checksum when read: dropped, never
  // served.)
  Status Flush() override {
    TIERKV_RETURN_IF_ERROR(Writable());
    if (fdatasync(values_fd_) != 0) {
      return Checked(FromErrno(errno, "syncing the", values_path_));
    }
    return Checked(CallRocks("flushing memtables", path_, [&] {
      rocksdb::FlushOptions options;
      options.wait = true;
      return db_->Flush(options);
    }));
  }

  // The value file by the space it takes (holes are free), the rest by
  // size.
  uint64_t FileBytes() override {
    struct stat st {};
    const uint64_t values = values_fd_ >= 0 && fstat(values_fd_, &st) == 0
                                ? uint64_t{512} * st.st_blocks
                                : 0;
    return IndexBytes() + values;
  }

  uint64_t IndexBytes() override {
    std::error_code ec;
    uint64_t total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(path_, ec)) {
      if (entry.path().filename() == kDiskValueFileName) continue;
      std::error_code size_ec;
      const uint64_t size = entry.file_size(size_ec);
      if (!size_ec) total += size;
    }
    return total;
  }

  StatusOr<uint64_t> ValueFileBytes() override {
    if (values_fd_ < 0) return uint64_t{0};  // Read-only, none written.
    struct stat st {};
    if (fstat(values_fd_, &st) != 0) {
      return FromErrno(errno, "reading the size of the", values_path_);
    }
    return static_cast<uint64_t>(st.st_size);
  }

  StatusOr<uint64_t> FreeBytes() override { return FreeBytesAt(path_); }
  uint64_t ReservedBytes() override { return reserved_; }

  Status Writable() override {
    if (!read_only_.ok()) return read_only_;
    MutexLock lock(&mu_);
    return write_error_;
  }

  std::vector<std::string> DamagedFiles() override {
    MutexLock lock(&mu_);
    return damaged_files_;
  }

 private:
  Status GetWith(const rocksdb::ReadOptions& options, std::string_view key,
                 const ValueReader& read) {
    rocksdb::PinnableSlice value;
    Status s = CallRocks("reading a block", path_, [&] {
      return db_->Get(options, db_->DefaultColumnFamily(), ToSlice(key),
                      &value);
    });
    if (!s.ok()) return s;
    return read(std::string_view(value.data(), value.size()));
  }

  Status VerifySsts() {
    // The files are read by name, and a compaction RocksDB started on open
    // (after recovering the log, say) may replace and delete them
    // meanwhile: a file gone for that reason is not damage. Deletions wait
    // until the check is over. (A read-only database compacts nothing and
    // cannot pause them: NotSupported.)
    const rocksdb::Status paused = db_->DisableFileDeletions();
    if (!paused.ok() && !paused.IsNotSupported()) {
      return FromRocks(paused, "pausing file deletions", path_);
    }
    std::vector<rocksdb::LiveFileMetaData> files;
    db_->GetLiveFilesMetaData(&files);
    const rocksdb::Options options = db_->GetOptions();
    rocksdb::ReadOptions verified;
    verified.verify_checksums = true;
    verified.fill_cache = false;
    Status s;
    for (const rocksdb::LiveFileMetaData& file : files) {
      const std::string sst = file.directory + "/" + file.relative_filename;
      s = CallRocks("verifying SST file " + sst, path_, [&] {
        return rocksdb::VerifySstFileChecksum(
            options, rocksdb::EnvOptions(options), verified, sst,
            file.largest_seqno);
      });
      if (!s.ok()) break;
    }
    if (!paused.ok()) return s;
    // Not forced: a deletion pause anyone else holds stays.
    Status resumed = CallRocks("resuming file deletions", path_, [&] {
      return db_->EnableFileDeletions(/*force=*/false);
    });
    return !s.ok() ? s : resumed;
  }

  // Reads the value of `newest` (a key's newest version) and visits it.
  Status VisitVerified(const rocksdb::ReadOptions& verified,
                       const rocksdb::KeyVersion& newest,
                       const Visitor& visit) {
    const std::string& key = newest.user_key;
    std::optional<Status> visited;
    Status s = GetWith(verified, key, [&](std::string_view value) {
      visited = visit(key, value);
      return Status::Ok();
    });
    if (visited.has_value()) return *visited;
    if (s.code() == StatusCode::kNotFound) return Status::Ok();  // Deleted.
    if (s.code() != StatusCode::kDataLoss) return s;
    std::vector<std::string> files = FilesNamedIn(s.message());
    if (files.empty()) files.push_back(s.message());
    RecordDamage(std::move(files));
    return visit(key, std::string_view());
  }

  void RecordDamage(std::vector<std::string> files) {
    MutexLock lock(&mu_);
    for (std::string& file : files) {
      if (std::find(damaged_files_.begin(), damaged_files_.end(), file) ==
          damaged_files_.end()) {
        damaged_files_.push_back(std::move(file));
      }
    }
  }

  // A value file write's errno, latched (Checked) unless it only found the
  // filesystem full: RocksDB never saw that write (WritePayload).
  Status ValueFileWriteError(int err, std::string_view what) {
    Status s = FromErrno(err, what, values_path_);
    if (err == ENOSPC || err == EDQUOT) return s;
    return Checked(std::move(s));
  }

  // Latches the first write error: RocksDB is not written again after it.
  Status Checked(Status s) {
    if (s.ok() || s.code() == StatusCode::kInvalidArgument) return s;
    MutexLock lock(&mu_);
    if (write_error_.ok()) write_error_ = s;
    return s;
  }

  const std::string path_;
  const std::string values_path_;
  const std::unique_ptr<rocksdb::DB> db_;
  const int values_fd_;
  const int lock_fd_;
  const uint64_t reserved_;
  const Status read_only_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
  Mutex mu_;
  Status write_error_ TIERKV_GUARDED_BY(mu_);
  std::vector<std::string> damaged_files_ TIERKV_GUARDED_BY(mu_);
};

// RocksDB's warnings and errors, on stderr, prefixed "rocksdb:". Not through
// tierkvd's spdlog log (the tiers do not depend on spdlog): with --log-file
// they stay on stderr (the journal under systemd).
class StderrLogger final : public rocksdb::Logger {
 public:
  StderrLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    std::fprintf(stderr, "rocksdb: %s\n", line);
  }
};

rocksdb::Options RocksOptions(const RocksDbStorageOptions& o) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // Payloads arrive compressed by the tier's own codec.
  options.compression = rocksdb::kNoCompression;
  options.write_buffer_size = o.write_buffer_bytes;
  options.max_write_buffer_number = 2;
  // Not a LOG file in the store's directory: on a full filesystem its
  // writes fail, and RocksDB's next log line after that trips an assertion.
  options.info_log = std::make_shared<StderrLogger>();
  // With the write-ahead log, what a memtable holds survives without a
  // flush on close (the next open replays the log), and a close then
  // writes nothing: after a write error, RocksDB must not be written again.
  options.avoid_flush_during_shutdown = o.write_ahead_log;
  // The MANIFEST stays small (a few records per flush or compaction): the
  // default 4 MiB preallocation would take a small filesystem's reserve.
  options.manifest_preallocation_size = 64 << 10;
  rocksdb::BlockBasedTableOptions table;
  table.checksum = rocksdb::kXXH3;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

}  // namespace

uint64_t RocksDbReservedBytes(const RocksDbStorageOptions& options) {
  return 2 * uint64_t{options.write_buffer_bytes} + (uint64_t{1} << 20);
}

namespace {

// RocksDB's refusal to open a damaged store names the MANIFEST, or a
// missing SST by its legacy .ldb name: adds which SSTs are damaged (read
// whole with their checksums) or missing, so the operator knows what broke.
Status NameDamagedSsts(Status s, const RocksDbStorageOptions& options) {
  if (s.code() != StatusCode::kDataLoss) return s;
  std::vector<std::string> damaged;
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(options.path, ec)) {
    if (entry.path().extension() != ".sst") continue;
    rocksdb::SstFileReader reader(RocksOptions(options));
    rocksdb::Status checked = reader.Open(entry.path().string());
    if (checked.ok()) checked = reader.VerifyChecksum();
    if (!checked.ok()) damaged.push_back(entry.path().filename().string());
  }
  const std::string& msg = s.message();
  for (size_t at = msg.find(".ldb"); at != std::string::npos;
       at = msg.find(".ldb", at + 1)) {
    size_t start = at;
    while (start > 0 &&
           std::isdigit(static_cast<unsigned char>(msg[start - 1]))) {
      --start;
    }
    if (start < at)
      damaged.push_back(msg.substr(start, at - start) + ".sst (missing)");
  }
  if (damaged.empty()) return s;
  std::string names;
  for (const std::string& name : damaged) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return Status::DataLoss(msg + " [damaged SST files: " + names + "]");
}

StatusOr<rocksdb::DB*> OpenWritable(const RocksDbStorageOptions& options) {
  // Made here, as RocksDB would (mode 0755, the parent must exist), so that
  // RocksDB does not log a missing directory as an error first. A failure
  // is RocksDB's to report.
  mkdir(options.path.c_str(), 0755);
  rocksdb::DB* db = nullptr;
  Status s = CallRocks("opening", options.path, [&] {
    return rocksdb::DB::Open(RocksOptions(options), options.path, &db);
  });
  if (!s.ok()) return NameDamagedSsts(s, options);
  return db;
}

bool HasDatabase(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path + "/CURRENT", ec);
}

// Opens the value file of the store at `path`: for writing (made if
// missing), or read-only, where a missing file is -1 (a store that never
// wrote one has no record that points into it).
StatusOr<int> OpenValueFile(const std::string& path, bool read_only) {
  const std::string file = ValueFilePath(path);
  const int fd = read_only ? open(file.c_str(), O_RDONLY | O_CLOEXEC)
                           : open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC,
                                  0666);  // Less the umask, as RocksDB's.
  if (fd < 0) {
    if (read_only && errno == ENOENT) return -1;
    return FromErrno(errno, "opening the", file);
  }
  if (!read_only) {
    // The file's directory entry made durable, as RocksDB does for its
    // own files: otherwise a machine crash could keep the records that a
    // Flush made durable and lose the file they point into.
    const int dir = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool synced = dir >= 0 && fsync(dir) == 0;
    const int err = errno;
    if (dir >= 0) close(dir);
    if (!synced) {
      close(fd);
      return FromErrno(err, "syncing the directory of the", file);
    }
  }
  return fd;
}

// tierkv's own lock on a store's directory (flock), taken before RocksDB
// opens the store in either mode and held while it is open: RocksDB takes
// its LOCK file only when it opens a store writable, so a second tierkvd
// that found the filesystem nearly full would otherwise open, read-only,
// a store another process writes, and serve what that one overwrites. -1
// when the directory does not exist yet (a new store: RocksDB makes it), or
// where its filesystem cannot lock a directory so (NFS and CIFS emulate
// flock with byte-range locks, which need a file open for writing): there
// RocksDB's LOCK alone refuses a second writable open.
StatusOr<int> LockStoreDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    const int err = errno;
    std::string msg = "disk tier directory " + path + ": " + std::strerror(err);
    if (err == EACCES || err == EPERM) {
      return Status::PermissionDenied(msg +
                                      "; check the directory's owner and mode");
    }
    return Status::Unavailable(std::move(msg));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      return Status::AlreadyExists(
          "disk tier " + path +
          ": another process (a running tierkvd?) has this store open");
    }
    if (err == EBADF || err == ENOLCK || err == EOPNOTSUPP || err == EINVAL) {
      return -1;
    }
    return Status::Unavailable("locking the disk tier directory " + path +
                               ": " + std::strerror(err));
  }
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<DiskStorage>> OpenRocksDbStorage(
    const RocksDbStorageOptions& options) {
  if (options.path.empty()) {
    return Status::InvalidArgument("disk tier: storage path is empty");
  }
  if (options.write_buffer_bytes < (size_t{1} << 20)) {
    return Status::InvalidArgument(
        "disk tier: write_buffer_bytes must be at least 1 MiB");
  }
  const uint64_t reserve = RocksDbReservedBytes(options);
  TIERKV_ASSIGN_OR_RETURN(const int locked, LockStoreDirectory(options.path));
  ipc::UniqueFd lock(locked);
  // Opening writes (a new MANIFEST and log, flushed memtables): on a nearly
  // full filesystem, open read-only rather than fail or crash in RocksDB.
  StatusOr<uint64_t> free_bytes = FreeBytesAt(options.path);
  const bool low =
      free_bytes.ok() && *free_bytes < reserve && HasDatabase(options.path);
  StatusOr<rocksdb::DB*> db = Status::ResourceExhausted("");
  if (!low) db = OpenWritable(options);
  // Without a database yet, there is nothing to serve read-only: a full
  // filesystem is the error.
  if (!low &&
      (db.ok() || db.status().code() != StatusCode::kResourceExhausted ||
       !HasDatabase(options.path))) {
    if (!db.ok()) return db.status();
    std::unique_ptr<rocksdb::DB> opened(*db);
    if (lock.get() < 0) {  // A new store: its directory exists now.
      TIERKV_ASSIGN_OR_RETURN(const int now, LockStoreDirectory(options.path));
      lock.reset(now);
    }
    TIERKV_ASSIGN_OR_RETURN(int fd, OpenValueFile(options.path, false));
    return std::unique_ptr<DiskStorage>(std::make_unique<RocksDbStorage>(
        options, opened.release(), fd, Status::Ok(), lock.release()));
  }
  const std::string why =
      low ? std::to_string(*free_bytes) + " bytes free, below the " +
                std::to_string(reserve) + " bytes RocksDB may need to write"
          : db.status().message();
  rocksdb::DB* read_only = nullptr;
  TIERKV_RETURN_IF_ERROR(CallRocks("opening read-only", options.path, [&] {
    return rocksdb::DB::OpenForReadOnly(RocksOptions(options), options.path,
                                        &read_only);
  }));
  std::unique_ptr<rocksdb::DB> opened(read_only);
  TIERKV_ASSIGN_OR_RETURN(int fd, OpenValueFile(options.path, true));
  return std::unique_ptr<DiskStorage>(std::make_unique<RocksDbStorage>(
      options, opened.release(), fd,
      Status::ResourceExhausted(
          "disk tier " + options.path + " opened read-only (" + why +
          "): it serves what it holds and stores nothing new; free space on "
          "its filesystem and restart"),
      lock.release()));
}

Status DestroyRocksDbStorage(const std::string& path) {
  // Not under another process that has the store open (read-only too).
  TIERKV_ASSIGN_OR_RETURN(const int locked, LockStoreDirectory(path));
  ipc::UniqueFd lock(locked);
  TIERKV_RETURN_IF_ERROR(CallRocks("destroying", path, [&] {
    return rocksdb::DestroyDB(path, rocksdb::Options());
  }));
  const std::string file = ValueFilePath(path);
  if (unlink(file.c_str()) != 0 && errno != ENOENT) {
    return FromErrno(errno, "removing the", file);
  }
  // DestroyDB leaves the directory when the value file was still in it.
  (void)rmdir(path.c_str());
  return Status::Ok();
}

}  // namespace tierkv
