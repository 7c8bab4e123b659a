#include "fault_vfs.hpp"

#include <chrono>
#include <cstring>
#include <thread>

#include <sqlite3.h>

namespace spindle::test {

namespace {

sqlite3_vfs* real_vfs = nullptr;
sqlite3_vfs shim_vfs;

struct shim_file {
  sqlite3_file base;
  sqlite3_file* real; // right after this struct, in SQLite's allocation
  bool faulty;
};

fault_vfs& faults() {
  return fault_vfs::install();
}

sqlite3_file* real_of(sqlite3_file* f) {
  return reinterpret_cast<shim_file*>(f)->real;
}

bool faulty(sqlite3_file* f) {
  return reinterpret_cast<shim_file*>(f)->faulty;
}

int shim_close(sqlite3_file* f) {
  auto real = real_of(f);
  return real->pMethods != nullptr ? real->pMethods->xClose(real) : SQLITE_OK;
}

int shim_read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  auto real = real_of(f);
  return real->pMethods->xRead(real, buf, n, off);
}

int shim_write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  if (faulty(f) && faults().fail_writes.load()) {
    ++faults().injected;
    return SQLITE_IOERR_WRITE;
  }
  auto real = real_of(f);
  return real->pMethods->xWrite(real, buf, n, off);
}

int shim_truncate(sqlite3_file* f, sqlite3_int64 size) {
  if (faulty(f) && faults().fail_writes.load()) {
    ++faults().injected;
    return SQLITE_IOERR_TRUNCATE;
  }
  auto real = real_of(f);
  return real->pMethods->xTruncate(real, size);
}

int shim_sync(sqlite3_file* f, int flags) {
  auto& fv = faults();
  if (faulty(f)) {
    if (auto ms = fv.sync_delay_ms.load(); ms > 0) {
      ++fv.injected;
      ++fv.syncing;
      std::this_thread::sleep_for(std::chrono::milliseconds{ms});
      --fv.syncing;
    }
    if (fv.fail_syncs.load()) {
      ++fv.injected;
      return SQLITE_IOERR_FSYNC;
    }
  }
  auto real = real_of(f);
  return real->pMethods->xSync(real, flags);
}

int shim_file_size(sqlite3_file* f, sqlite3_int64* size) {
  auto real = real_of(f);
  return real->pMethods->xFileSize(real, size);
}

int shim_lock(sqlite3_file* f, int level) {
  auto real = real_of(f);
  return real->pMethods->xLock(real, level);
}

int shim_unlock(sqlite3_file* f, int level) {
  auto real = real_of(f);
  return real->pMethods->xUnlock(real, level);
}

int shim_check_reserved(sqlite3_file* f, int* out) {
  auto real = real_of(f);
  return real->pMethods->xCheckReservedLock(real, out);
}

int shim_file_control(sqlite3_file* f, int op, void* arg) {
  auto real = real_of(f);
  return real->pMethods->xFileControl(real, op, arg);
}

int shim_sector_size(sqlite3_file* f) {
  auto real = real_of(f);
  return real->pMethods->xSectorSize(real);
}

int shim_device_characteristics(sqlite3_file* f) {
  auto real = real_of(f);
  return real->pMethods->xDeviceCharacteristics(real);
}

int shim_shm_map(sqlite3_file* f, int page, int size, int extend,
                 void volatile** out) {
  auto real = real_of(f);
  return real->pMethods->xShmMap(real, page, size, extend, out);
}

int shim_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  auto real = real_of(f);
  return real->pMethods->xShmLock(real, offset, n, flags);
}

void shim_shm_barrier(sqlite3_file* f) {
  auto real = real_of(f);
  real->pMethods->xShmBarrier(real);
}

int shim_shm_unmap(sqlite3_file* f, int del) {
  auto real = real_of(f);
  return real->pMethods->xShmUnmap(real, del);
}

int shim_fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
  auto real = real_of(f);
  return real->pMethods->xFetch(real, off, n, out);
}

int shim_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  auto real = real_of(f);
  return real->pMethods->xUnfetch(real, off, p);
}

const sqlite3_io_methods shim_methods = {
  3,
  shim_close,
  shim_read,
  shim_write,
  shim_truncate,
  shim_sync,
  shim_file_size,
  shim_lock,
  shim_unlock,
  shim_check_reserved,
  shim_file_control,
  shim_sector_size,
  shim_device_characteristics,
  shim_shm_map,
  shim_shm_lock,
  shim_shm_barrier,
  shim_shm_unmap,
  shim_fetch,
  shim_unfetch,
};

int shim_open(sqlite3_vfs*, const char* name, sqlite3_file* f,
              int flags, int* out_flags) {
  auto s = reinterpret_cast<shim_file*>(f);
  s->real = reinterpret_cast<sqlite3_file*>(s + 1);
  s->faulty = faults().matches(name);
  s->base.pMethods = nullptr;
  auto rc = real_vfs->xOpen(real_vfs, name, s->real, flags, out_flags);
  // The default (unix) VFS's files speak version 3; a file whose methods
  // are older would not be asked for what it lacks.
  if (s->real->pMethods != nullptr)
    s->base.pMethods = &shim_methods;
  return rc;
}

} // namespace

fault_vfs& fault_vfs::install() {
  static fault_vfs* self = [] {
    auto out = new fault_vfs;
    // spindle opens its files through "unix-excl" (database.cpp). The shim
    // takes that name: registered after the default VFS, it comes before
    // the real one in SQLite's list, so every open by name finds it.
    real_vfs = sqlite3_vfs_find("unix-excl");
    shim_vfs = *real_vfs; // the same functions, but for opening files
    shim_vfs.pNext = nullptr;
    shim_vfs.szOsFile = static_cast<int>(sizeof(shim_file))
                        + real_vfs->szOsFile;
    shim_vfs.xOpen = shim_open;
    sqlite3_vfs_register(&shim_vfs, 0);
    return out;
  }();
  return *self;
}

void fault_vfs::match(std::string part) {
  std::lock_guard<std::mutex> guard{mtx_};
  match_ = std::move(part);
}

bool fault_vfs::matches(const char* path) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return match_.empty() || (path != nullptr && std::strstr(path, match_.c_str()));
}

void fault_vfs::heal() {
  fail_writes = false;
  fail_syncs = false;
  sync_delay_ms = 0;
}

} // namespace spindle::test
