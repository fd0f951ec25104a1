// fault_fs.h — a fault-injecting rocksdb::FileSystem for checkpoint tests (after RocksDB's
// fault_injection_fs.h): writes, syncs and reads of chosen files fail on command, as an I/O error
// or as "no space left on device".
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

namespace zps::server::testing {

struct Faults {
  std::atomic<bool> fail_append{false};     // Append on any new file → IOError
  std::atomic<bool> no_space{false};        // Append on any new file → NoSpace
  std::atomic<bool> fail_sync{false};       // Sync/Fsync → IOError
  std::atomic<bool> fail_blob_read{false};  // Read of *.blob files → IOError
  std::atomic<int> appends_seen{0};
};

class FaultWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultWritableFile(std::unique_ptr<rocksdb::FSWritableFile> f, Faults* faults)
      : FSWritableFileOwnerWrapper(std::move(f)), faults_(faults) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* dbg) override {
    if (auto s = Check(); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, o, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (auto s = Check(); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, o, info, dbg);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (faults_->fail_sync) return rocksdb::IOStatus::IOError("injected sync failure");
    return FSWritableFileOwnerWrapper::Sync(o, dbg);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (faults_->fail_sync) return rocksdb::IOStatus::IOError("injected fsync failure");
    return FSWritableFileOwnerWrapper::Fsync(o, dbg);
  }

 private:
  rocksdb::IOStatus Check() {
    ++faults_->appends_seen;
    if (faults_->no_space) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    if (faults_->fail_append) return rocksdb::IOStatus::IOError("injected write failure");
    return rocksdb::IOStatus::OK();
  }
  Faults* faults_;
};

class FaultRandomAccessFile : public rocksdb::FSRandomAccessFileOwnerWrapper {
 public:
  FaultRandomAccessFile(std::unique_ptr<rocksdb::FSRandomAccessFile> f, Faults* faults)
      : FSRandomAccessFileOwnerWrapper(std::move(f)), faults_(faults) {}
  rocksdb::IOStatus Read(uint64_t offset, size_t n, const rocksdb::IOOptions& o,
                         rocksdb::Slice* result, char* scratch,
                         rocksdb::IODebugContext* dbg) const override {
    if (faults_->fail_blob_read) return rocksdb::IOStatus::IOError("injected read failure");
    return FSRandomAccessFileOwnerWrapper::Read(offset, n, o, result, scratch, dbg);
  }

 private:
  Faults* faults_;
};

class FaultFs : public rocksdb::FileSystemWrapper {
 public:
  explicit FaultFs(Faults* faults)
      : FileSystemWrapper(rocksdb::FileSystem::Default()), faults_(faults) {}
  static const char* kClassName() { return "ZpsFaultFs"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> base;
    auto s = target()->NewWritableFile(f, o, &base, dbg);
    if (s.ok()) r->reset(new FaultWritableFile(std::move(base), faults_));
    return s;
  }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f, const rocksdb::FileOptions& o,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSRandomAccessFile> base;
    auto s = target()->NewRandomAccessFile(f, o, &base, dbg);
    if (!s.ok()) return s;
    const bool blob = f.size() > 5 && f.compare(f.size() - 5, 5, ".blob") == 0;
    if (blob) {
      r->reset(new FaultRandomAccessFile(std::move(base), faults_));
    } else {
      *r = std::move(base);
    }
    return s;
  }

 private:
  Faults* faults_;
};

/// An Env over FaultFs; keep it alive as long as the store.
struct FaultEnv {
  Faults faults;
  std::shared_ptr<rocksdb::FileSystem> fs = std::make_shared<FaultFs>(&faults);
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
};

}  // namespace zps::server::testing
