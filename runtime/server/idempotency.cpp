#include "idempotency.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "core/digest.hpp"
#include "spindle/messages/error.hpp"
#include "storage/database.hpp"
#include "storage/postgres/postgres.hpp"
#include "storage/sql_connection.hpp"
#include "storage/state_store.hpp"

namespace spindle::http {

namespace {

using json = nlohmann::json;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

std::string headers_text(
  const std::vector<std::pair<std::string, std::string>>& headers) {
  json out = json::array();
  for (auto& [name, value] : headers)
    out.push_back({name, value});
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<std::pair<std::string, std::string>>
headers_of(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  auto parsed = json::parse(text, nullptr, false);
  if (!parsed.is_array())
    return out;
  for (auto& h : parsed)
    if (h.is_array() && h.size() == 2 && h[0].is_string()
        && h[1].is_string())
      out.emplace_back(h[0].get<std::string>(), h[1].get<std::string>());
  return out;
}

bool success(int status) {
  return status >= 200 && status < 300;
}

// How often a claim prunes expired answers.
constexpr uint64_t prune_every = 1024;

} // namespace

idempotency_store::idempotency_store(std::unique_ptr<sql_connection> db,
                                     std::chrono::seconds retention)
  : db_(std::move(db)), retention_(retention) {
}

idempotency_store::~idempotency_store() = default;

caf::expected<std::unique_ptr<idempotency_store>>
idempotency_store::open(const storage_options& storage,
                        std::chrono::seconds retention) {
  std::unique_ptr<sql_connection> db;
  if (storage.on_postgres()) {
    auto opened = open_postgres(storage.store);
    if (!opened)
      return opened.error();
    db = std::move(*opened);
  } else if (!storage.files_in_memory()) {
    auto opened = database::open(idempotency_database_path(storage),
                                 storage.sync);
    if (!opened)
      return opened.error();
    db = sqlite_connection(std::move(*opened));
  }
  std::unique_ptr<idempotency_store> out{
    new idempotency_store(std::move(db), retention)};
  out->prune();
  return out;
}

std::string idempotency_store::check_key(std::string_view key) {
  if (key.empty())
    return "the Idempotency-Key header is empty";
  if (key.size() > max_key_bytes)
    return "the Idempotency-Key header is longer than "
           + std::to_string(max_key_bytes) + " bytes";
  for (char c : key)
    if (c < 0x21 || c > 0x7e)
      return "the Idempotency-Key header may hold only printable ASCII "
             "characters without spaces";
  return {};
}

std::string idempotency_store::fingerprint(std::string_view method,
                                           std::string_view path,
                                           std::string_view body) {
  std::string input;
  input.reserve(method.size() + path.size() + body.size() + 2);
  input.append(method).append(1, ' ').append(path).append(1, '\n');
  input.append(body);
  return sha256_hex(input);
}

sql_query* idempotency_store::query(std::unique_ptr<sql_query>& slot,
                                    const char* sql) {
  if (!slot) {
    auto q = db_->prepare(sql);
    if (!q) {
      spdlog::warn("idempotency: {}", describe(q.error()));
      return nullptr;
    }
    slot = std::move(*q);
  }
  return slot.get();
}

std::optional<std::pair<std::string, stored_reply>>
idempotency_store::read(const std::string& key) {
  auto* stmt = query(
    read_, "SELECT fingerprint, status, content_type, headers, body "
           "FROM idempotency_keys WHERE key = ?1 AND created_ms >= ?2;");
  if (stmt == nullptr)
    return std::nullopt;
  stmt->bind(1, sql_value::of(key));
  stmt->bind(2, sql_value::of(now_ms() - retention_.count() * 1000));
  auto row = stmt->step();
  if (!row || !*row) {
    if (!row)
      spdlog::warn("idempotency: cannot read keys: {}",
                   describe(row.error()));
    stmt->reset();
    return std::nullopt;
  }
  stored_reply reply;
  reply.status = static_cast<int>(stmt->column(1).integer);
  reply.content_type = stmt->column(2).text;
  reply.headers = headers_of(stmt->column(3).text);
  reply.body = stmt->column(4).text;
  auto fingerprint = stmt->column(0).text;
  stmt->reset();
  return std::make_pair(std::move(fingerprint), std::move(reply));
}

idempotency_store::claim_result
idempotency_store::claim(const std::string& key,
                         const std::string& fingerprint, stored_reply& reply,
                         std::function<void(const stored_reply&)> ready) {
  std::lock_guard<std::mutex> guard{mx_};
  if (++claims_ % prune_every == 0)
    prune_locked();
  if (auto i = keys_.find(key); i != keys_.end()) {
    auto& e = i->second;
    if (e.fingerprint != fingerprint)
      return claim_result::mismatch;
    if (e.running) {
      e.waiting.push_back(std::move(ready));
      return claim_result::waiting;
    }
    if (e.reply
        && std::chrono::steady_clock::now() - e.stored_at < retention_) {
      reply = *e.reply;
      return claim_result::replay;
    }
    keys_.erase(i); // expired
  } else if (db_) {
    if (auto stored = read(key)) {
      if (stored->first != fingerprint)
        return claim_result::mismatch;
      reply = std::move(stored->second);
      return claim_result::replay;
    }
  }
  entry e;
  e.fingerprint = fingerprint;
  keys_.emplace(key, std::move(e));
  return claim_result::run;
}

caf::error idempotency_store::finish(const std::string& key,
                                     const stored_reply& reply) {
  caf::error err;
  std::vector<std::function<void(const stored_reply&)>> waiting;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto i = keys_.find(key);
    if (i == keys_.end())
      return caf::none;
    if (success(reply.status) && db_) {
      // The body is text (JSON, or a stream's events): a TEXT value in
      // both databases (SQLite's column is declared BLOB, which takes it).
      auto* stmt = query(
        write_, "INSERT INTO idempotency_keys(key, fingerprint, status, "
                "content_type, headers, body, created_ms) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                "ON CONFLICT(key) DO UPDATE SET "
                "fingerprint = excluded.fingerprint, "
                "status = excluded.status, "
                "content_type = excluded.content_type, "
                "headers = excluded.headers, body = excluded.body, "
                "created_ms = excluded.created_ms;");
      if (stmt != nullptr) {
        stmt->bind(1, sql_value::of(key));
        stmt->bind(2, sql_value::of(i->second.fingerprint));
        stmt->bind(3, sql_value::of(static_cast<int64_t>(reply.status)));
        stmt->bind(4, sql_value::of(reply.content_type));
        stmt->bind(5, sql_value::of(headers_text(reply.headers)));
        stmt->bind(6, sql_value::of(reply.body));
        stmt->bind(7, sql_value::of(now_ms()));
        err = stmt->run();
      } else {
        err = make_error(errc::storage_failure,
                         "idempotency keys cannot be written");
      }
    }
    waiting = std::move(i->second.waiting);
    if (success(reply.status) && !db_) {
      i->second.running = false;
      i->second.reply = reply;
      i->second.stored_at = std::chrono::steady_clock::now();
      i->second.waiting.clear();
    } else {
      // Stored in the file (read from there from now on), or an error:
      // forgotten, so that a later retry runs again.
      keys_.erase(i);
    }
  }
  for (auto& w : waiting)
    w(reply);
  return err;
}

void idempotency_store::prune() {
  std::lock_guard<std::mutex> guard{mx_};
  prune_locked();
}

void idempotency_store::prune_locked() {
  auto horizon = std::chrono::steady_clock::now() - retention_;
  for (auto i = keys_.begin(); i != keys_.end();)
    if (!i->second.running && i->second.stored_at < horizon)
      i = keys_.erase(i);
    else
      ++i;
  if (db_)
    if (auto* stmt = query(
          prune_, "DELETE FROM idempotency_keys WHERE created_ms < ?1;")) {
      stmt->bind(1, sql_value::of(now_ms() - retention_.count() * 1000));
      if (auto err = stmt->run())
        spdlog::warn("idempotency: cannot prune keys: {}", describe(err));
    }
}

caf::error idempotency_store::forget_prefix(const std::string& prefix) {
  if (prefix.empty())
    return make_error(errc::invalid_argument, "an empty prefix is every key");
  std::lock_guard<std::mutex> guard{mx_};
  for (auto i = keys_.begin(); i != keys_.end();)
    if (!i->second.running && i->first.compare(0, prefix.size(), prefix) == 0)
      i = keys_.erase(i);
    else
      ++i;
  if (!db_)
    return caf::none;
  auto upper = prefix;
  upper.back() = static_cast<char>(upper.back() + 1);
  auto q = db_->prepare(
    "DELETE FROM idempotency_keys WHERE key >= ?1 AND key < ?2;");
  if (!q)
    return q.error();
  (*q)->bind(1, sql_value::of(prefix));
  (*q)->bind(2, sql_value::of(upper));
  return (*q)->run();
}

uint64_t idempotency_store::size() {
  std::lock_guard<std::mutex> guard{mx_};
  uint64_t n = keys_.size();
  if (db_)
    if (auto* stmt = query(count_, "SELECT count(*) FROM idempotency_keys;")) {
      auto row = stmt->step();
      if (row && *row)
        n += static_cast<uint64_t>(stmt->column(0).integer);
      stmt->reset();
    }
  return n;
}

} // namespace spindle::http
