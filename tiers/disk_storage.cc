// The disk tier's production storage: a RocksDB (BlobDB) database, its
// options, and RocksDB's statuses translated into tierkv's.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

// ---------------------------------------------------------------------------
// RocksDB storage.

// RocksDB's Status, as a tierkv Status saying what to do about it.
Status FromRocks(const rocksdb::Status& s, std::string_view what,
                 const std::string& path) {
  if (s.ok()) return Status::Ok();
  std::string msg =
      std::string(what) + " in RocksDB store " + path + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) {
    return Status::DataLoss(msg +
                            "; the store's files are damaged: remove the "
                            "directory to start with an empty disk tier");
  }
  if (s.IsNoSpace()) {
    return Status::ResourceExhausted(
        msg + "; free disk space or lower the disk tier's capacity");
  }
  if (s.IsIOError()) {
    if (msg.find("lock") != std::string::npos) {
      return Status::FailedPrecondition(
          msg + "; another process (a running tierkvd?) has this store open");
    }
    if (msg.find("ermission denied") != std::string::npos) {
      return Status::PermissionDenied(msg +
                                      "; check the directory's owner and mode");
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

class RocksDbStorage final : public DiskStorage {
 public:
  RocksDbStorage(std::string path, rocksdb::DB* db, bool wal)
      : path_(std::move(path)), db_(db) {
    // See RocksDbStorageOptions::write_ahead_log.
    write_options_.disableWAL = !wal;
    // Every value carries its own checksums (verified by the tier), so
    // RocksDB's block and blob checksums would be a second pass over the
    // same bytes. Large values bypass the block cache.
    read_options_.verify_checksums = false;
    read_options_.fill_cache = false;
  }
  ~RocksDbStorage() override {
    // Close flushes memtables; with nobody to report to, a failure here
    // only loses unflushed blocks, which the next Open does not miss.
    rocksdb::Status ignored = db_->Close();
    (void)ignored;
  }

  Status Put(std::string_view key,
             std::span<const std::string_view> value_parts) override {
    return CallRocks("writing a block", path_, [&] {
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
    });
  }

  Status Get(std::string_view key, const ValueReader& read) override {
    rocksdb::PinnableSlice value;
    Status s = CallRocks("reading a block", path_, [&] {
      return db_->Get(read_options_, db_->DefaultColumnFamily(), ToSlice(key),
                      &value);
    });
    if (!s.ok()) return s;
    return read(std::string_view(value.data(), value.size()));
  }

  Status Delete(std::string_view key) override {
    return CallRocks("deleting a block", path_,
                     [&] { return db_->Delete(write_options_, ToSlice(key)); });
  }

  Status ForEach(const Visitor& visit) override {
    rocksdb::ReadOptions options = read_options_;
    options.readahead_size = size_t{4} << 20;
    std::unique_ptr<rocksdb::Iterator> it;
    Status status = CallRocks("scanning the store", path_, [&] {
      it.reset(db_->NewIterator(options));
      it->SeekToFirst();
      return it->status();
    });
    while (status.ok() && it->Valid()) {
      status = visit(std::string_view(it->key().data(), it->key().size()),
                     std::string_view(it->value().data(), it->value().size()));
      if (!status.ok()) return status;
      status = CallRocks("scanning the store", path_, [&] {
        it->Next();
        return it->status();
      });
    }
    return status;
  }

  Status Flush() override {
    return CallRocks("flushing memtables", path_, [&] {
      rocksdb::FlushOptions options;
      options.wait = true;
      return db_->Flush(options);
    });
  }

  uint64_t FileBytes() override {
    return IntProperty(rocksdb::DB::Properties::kLiveSstFilesSize) +
           IntProperty(rocksdb::DB::Properties::kLiveBlobFileSize);
  }

 private:
  uint64_t IntProperty(const std::string& name) {
    uint64_t value = 0;
    return db_->GetIntProperty(name, &value) ? value : 0;
  }

  const std::string path_;
  const std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
};

rocksdb::Options RocksOptions(const RocksDbStorageOptions& o) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // Payloads arrive compressed by the tier's own codec.
  options.compression = rocksdb::kNoCompression;
  options.write_buffer_size = o.write_buffer_bytes;
  options.max_write_buffer_number = 2;
  options.keep_log_file_num = 4;
  options.enable_blob_files = o.blob_files;
  options.min_blob_size = 4096;  // Every block; never the tiny ones.
  options.blob_compression_type = rocksdb::kNoCompression;
  // Deleted (evicted) blocks' blob files are reclaimed by compaction.
  options.enable_blob_garbage_collection = true;
  rocksdb::BlockBasedTableOptions table;
  table.checksum = rocksdb::kXXH3;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
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
  rocksdb::DB* db = nullptr;
  TIERKV_RETURN_IF_ERROR(CallRocks("opening", options.path, [&] {
    return rocksdb::DB::Open(RocksOptions(options), options.path, &db);
  }));
  return std::unique_ptr<DiskStorage>(std::make_unique<RocksDbStorage>(
      options.path, db, options.write_ahead_log));
}

}  // namespace tierkv
