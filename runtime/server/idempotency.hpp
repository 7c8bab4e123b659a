#pragma once

// Idempotent retries (docs/api.md, "Idempotent retries"): the answers to
// requests that carried an `Idempotency-Key`, so that a retry with the same
// key and request gets the first answer instead of doing the work again.
//
// A key is claimed before its request runs. While it runs, retries with the
// same key wait for its answer; once it answered with a success, the answer
// is kept (in `idempotency.db` beside the data directory's other files, in
// PostgreSQL with a `--store`, or in memory with `--data :memory:`) for the retention time and replayed to
// every retry. An error answer is handed to the retries that waited for it
// and then forgotten, so a later retry runs again. The same key with a
// different request (method, path or body) is refused.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/runtime/storage.hpp"

namespace spindle {

class sql_connection;
class sql_query;

namespace http {

/// A reply as it was sent: whole, or a stream's chunks joined.
struct stored_reply {
  int status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

class idempotency_store {
public:
  /// The longest key accepted (as Stripe's).
  static constexpr size_t max_key_bytes = 255;

  /// Opens `idempotency.db` in the data directory of `storage` (creating
  /// or migrating it), or keeps everything in memory for ":memory:".
  static caf::expected<std::unique_ptr<idempotency_store>>
  open(const storage_options& storage, std::chrono::seconds retention);

  ~idempotency_store();

  /// An error message if `key` is not a valid key (1 to 255 printable
  /// ASCII characters, no spaces), else empty.
  static std::string check_key(std::string_view key);

  /// A fingerprint of a request: SHA-256 of its method, path and body.
  static std::string fingerprint(std::string_view method,
                                 std::string_view path,
                                 std::string_view body);

  enum class claim_result {
    run,      // the caller runs the request, then `finish`es the key
    replay,   // `reply` holds the answer to replay
    waiting,  // `ready` runs with the answer once the running one ends
    mismatch, // the key belongs to another request
  };

  /// Claims `key` for a request with `fingerprint`. May read the database:
  /// call it off the event loops.
  claim_result claim(const std::string& key, const std::string& fingerprint,
                     stored_reply& reply,
                     std::function<void(const stored_reply&)> ready);

  /// The claimed request answered with `reply`: a success (2xx) is stored
  /// durably and kept for the retention time; any other answer is
  /// forgotten. Either way the waiting retries get `reply`. Writes the
  /// database: call it off the event loops. An error means the answer
  /// could not be stored (the waiters still got it).
  caf::error finish(const std::string& key, const stored_reply& reply);

  /// Drops the answers older than the retention time.
  void prune();

  /// Drops every answer kept under a key starting with `prefix` (a
  /// deleted tenant's, "TENANT~"), running requests aside. Errors:
  /// storage_failure.
  caf::error forget_prefix(const std::string& prefix);

  /// Keys kept now (in memory and, for a data directory, in the file).
  uint64_t size();

  std::chrono::seconds retention() const noexcept {
    return retention_;
  }

private:
  struct entry {
    std::string fingerprint;
    bool running = true;
    std::vector<std::function<void(const stored_reply&)>> waiting;
    // In-memory mode: the stored answer and when it was stored.
    std::optional<stored_reply> reply;
    std::chrono::steady_clock::time_point stored_at;
  };

  idempotency_store(std::unique_ptr<sql_connection> db,
                    std::chrono::seconds retention);

  std::optional<std::pair<std::string, stored_reply>>
  read(const std::string& key);
  void prune_locked();
  // The statement `slot` holds, prepared with `sql` on first use.
  sql_query* query(std::unique_ptr<sql_query>& slot, const char* sql);

  std::mutex mx_;
  std::unique_ptr<sql_connection> db_; // null: in memory
  std::unique_ptr<sql_query> read_, write_, prune_, count_;
  std::chrono::seconds retention_;
  std::unordered_map<std::string, entry> keys_;
  uint64_t claims_ = 0;
};

} // namespace http
} // namespace spindle
