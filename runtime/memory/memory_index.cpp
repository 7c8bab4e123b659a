// Long-term memory's bounded retrieval index (docs/memory.md, "Retrieval"):
// per scope and term, the document frequency and the newest
// memory_recent_per_term entries holding the term; a retrieval reads one
// such list per query term and ranks the entries in them with BM25.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <random>
#include <tuple>
#include <unordered_map>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/context_item.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/work.hpp"
#include "spindle/runtime/memory.hpp"
#include "storage/sql_connection.hpp"
#include "memory/memory_index.hpp"

namespace spindle {

namespace {

// One entry in a term's list.
struct posting {
  int64_t id = 0;
  uint64_t tf = 0;       // occurrences of the term in the entry
  uint64_t words = 0;    // the entry's length in indexed words
  uint64_t shortest = 0; // memory_shortest_cut of the entry
};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

inline bool get_varint(std::string_view& in, uint64_t& v) {
  if (!in.empty() && (static_cast<unsigned char>(in.front()) & 0x80) == 0) {
    v = static_cast<unsigned char>(in.front()); // most values: one byte
    in.remove_prefix(1);
    return true;
  }
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0)
      return true;
  }
  return false;
}

// A list is encoded newest first: the first ID whole, then each ID as its
// distance below the previous one, each followed by tf, words, shortest.
std::string encode(const std::vector<posting>& list) {
  count_work(work_kind::memory_postings_written, list.size());
  std::string out;
  out.reserve(list.size() * 6);
  int64_t prev = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    put_varint(out, static_cast<uint64_t>(i == 0 ? list[i].id
                                                 : prev - list[i].id));
    put_varint(out, list[i].tf);
    put_varint(out, list[i].words);
    put_varint(out, list[i].shortest);
    prev = list[i].id;
  }
  return out;
}

// Decodes into `out` (appending); a damaged tail is dropped.
void decode(std::string_view in, std::vector<posting>& out) {
  struct counted {
    std::vector<posting>& out;
    size_t before;
    ~counted() {
      count_work(work_kind::memory_postings_read, out.size() - before);
    }
  } counting{out, out.size()};
  int64_t prev = 0;
  bool first = true;
  while (!in.empty()) {
    uint64_t id = 0;
    posting p;
    if (!get_varint(in, id) || !get_varint(in, p.tf)
        || !get_varint(in, p.words) || !get_varint(in, p.shortest))
      return;
    p.id = first ? static_cast<int64_t>(id) : prev - static_cast<int64_t>(id);
    first = false;
    prev = p.id;
    out.push_back(p);
  }
}

// The scope an entry is indexed in, and a request looks in: a user's
// entries (of any thread), or the anonymous entries of one thread (D8).
std::pair<std::string_view, std::string_view>
scope_key(std::string_view user_id, std::string_view thread_id) {
  if (!user_id.empty())
    return {user_id, std::string_view{}};
  return {std::string_view{}, thread_id};
}

// FNV-1a over the scope's user, a NUL, and its thread: the same in every
// process and build, since a slot's number names a change to the other
// processes on one PostgreSQL database.
size_t change_slot(std::string_view user_id, std::string_view thread_id) {
  auto [user, thread] = scope_key(user_id, thread_id);
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::string_view text) {
    for (auto c : text) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ull;
    }
  };
  mix(user);
  h *= 0x100000001b3ull; // the NUL between them
  mix(thread);
  return static_cast<size_t>(h % memory_changes::slots);
}

// Whether a failed transaction lost a race with another one (PostgreSQL's
// deadlock and serialization failures, SQLSTATE 40P01 and 40001, whose
// messages these are) and may succeed when run again.
bool lost_a_race(const caf::error& err) {
  if (err.code() != static_cast<uint8_t>(errc::storage_failure))
    return false;
  auto text = describe(err);
  return text.find("deadlock detected") != std::string::npos
         || text.find("could not serialize access") != std::string::npos;
}

// One statement of memory's SQL: SQLite's own, whose columns are read in
// place (the readers' hot path), or a PostgreSQL one through its
// sql_connection, whose row is copied out at each step.
class mem_statement {
public:
  mem_statement() = default;
  explicit mem_statement(statement lite) : lite_(std::move(lite)) {
  }
  explicit mem_statement(std::unique_ptr<sql_query> pg) : pg_(std::move(pg)) {
  }

  mem_statement& bind(int index, int64_t value) {
    if (pg_)
      pg_->bind(index, sql_value::of(value));
    else
      lite_.bind(index, value);
    return *this;
  }
  mem_statement& bind(int index, std::string_view value) {
    if (pg_)
      pg_->bind(index, sql_value::of(std::string{value}));
    else
      lite_.bind(index, value);
    return *this;
  }
  // Bytes: a BLOB in SQLite; in PostgreSQL hex text, which the statement
  // decodes into BYTEA (a text parameter cannot carry a NUL byte, and the
  // encoded lists hold many).
  mem_statement& bind_blob(int index, std::string_view bytes) {
    if (!pg_) {
      lite_.bind_blob(index, bytes);
      return *this;
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string hex;
    hex.reserve(bytes.size() * 2);
    for (auto c : bytes) {
      auto b = static_cast<unsigned char>(c);
      hex += digits[b >> 4];
      hex += digits[b & 0xf];
    }
    pg_->bind(index, sql_value::of(std::move(hex)));
    return *this;
  }

  // Counted in work(): each row a statement reads.
  caf::expected<bool> step() {
    if (!pg_) {
      auto row = lite_.step();
      if (row && *row)
        count_work(work_kind::memory_rows_read, 1);
      return row;
    }
    row_.clear();
    auto row = pg_->step();
    if (row && *row) {
      count_work(work_kind::memory_rows_read, 1);
      for (int i = 0; i < pg_->column_count(); ++i)
        row_.push_back(pg_->column(i));
    }
    return row;
  }
  caf::error run() {
    return pg_ ? pg_->run() : lite_.run();
  }
  // A statement that writes a row (counted in work()).
  caf::error write() {
    count_work(work_kind::memory_rows_written, 1);
    return run();
  }
  void reset() {
    if (!pg_) {
      lite_.reset();
      return;
    }
    pg_->reset();
    row_.clear();
  }

  // A NULL column reads as 0 or "" on both.
  int64_t column_int64(int index) const {
    if (!pg_)
      return lite_.column_int64(index);
    auto* v = at(index);
    return v != nullptr && v->type == sql_value::kind::integer ? v->integer
                                                               : 0;
  }
  std::string column_text(int index) const {
    if (!pg_)
      return lite_.column_text(index);
    return std::string{column_view(index)};
  }
  // Valid until the next step or reset.
  std::string_view column_view(int index) const {
    if (!pg_)
      return lite_.column_view(index);
    auto* v = at(index);
    return v != nullptr && v->type == sql_value::kind::text
             ? std::string_view{v->text}
             : std::string_view{};
  }

private:
  const sql_value* at(int index) const {
    return index >= 0 && static_cast<size_t>(index) < row_.size()
             ? &row_[static_cast<size_t>(index)]
             : nullptr;
  }

  statement lite_;
  std::unique_ptr<sql_query> pg_;
  std::vector<sql_value> row_; // PostgreSQL's current row
};

// Where memory's statements run: a SQLite database (memory.db, or
// ":memory:"), or PostgreSQL (docs/memory.md, "On PostgreSQL").
struct memory_db {
  database* lite = nullptr;
  sql_connection* pg = nullptr;

  caf::expected<mem_statement> prepare(std::string_view sql) const {
    if (pg != nullptr) {
      auto q = pg->prepare(std::string{sql});
      if (!q)
        return q.error();
      return mem_statement{std::move(*q)};
    }
    auto stmt = lite->prepare(sql);
    if (!stmt)
      return stmt.error();
    return mem_statement{std::move(*stmt)};
  }

  // Rows the last statement changed.
  int64_t changes() const {
    return pg != nullptr ? pg->changes() : lite->changes();
  }
};

caf::error prepare_all(const memory_db& db,
                       std::initializer_list<std::pair<mem_statement*,
                                                       std::string_view>>
                         statements) {
  for (auto& [out, sql] : statements) {
    auto stmt = db.prepare(sql);
    if (!stmt)
      return stmt.error();
    *out = std::move(*stmt);
  }
  return caf::none;
}

// Resets a statement when a scope ends, however it ends.
struct resetting {
  mem_statement& stmt;
  ~resetting() {
    stmt.reset();
  }
};

// An entry as the index sees it.
// Values read from the database (by a reader, or by the writer of what
// it wrote), the least recently used dropped first past a byte budget.
template <class Key, class Value>
class lru_cache {
public:
  explicit lru_cache(size_t budget) : budget_(budget) {
  }

  Value* find(const Key& key) {
    auto i = index_.find(key);
    if (i == index_.end())
      return nullptr;
    order_.splice(order_.begin(), order_, i->second);
    return &i->second->second;
  }

  // Keeps `value` (moved from) unless its `cost` exceeds the whole budget
  // (then null, and `value` is left as it was). May drop any other value,
  // so a pointer from `find` or `put` is valid until the next `put`.
  Value* put(const Key& key, Value&& value) {
    auto size = cost(value);
    if (size > budget_)
      return nullptr;
    if (auto i = index_.find(key); i != index_.end()) {
      bytes_ -= cost(i->second->second);
      order_.erase(i->second);
      index_.erase(i);
    }
    while (bytes_ + size > budget_ && !order_.empty()) {
      bytes_ -= cost(order_.back().second);
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    bytes_ += size;
    return &order_.front().second;
  }

  void clear() {
    order_.clear();
    index_.clear();
    bytes_ = 0;
  }

private:
  using node_list = std::list<std::pair<Key, Value>>;
  size_t budget_;
  size_t bytes_ = 0;
  node_list order_;
  std::unordered_map<Key, typename node_list::iterator> index_;
};

// A term's row as the writer last wrote it: what the row holds while its
// scope's version is still `version`, the scope's version after that
// write (every change to a scope's lists raises its version, under the
// scope row's lock on PostgreSQL, so another process's change shows as a
// different version), unless the transaction rolled back (then the
// writer forgets everything it kept).
struct written_term {
  int64_t df = 0;
  std::string recent; // encoded
  int64_t version = 0;
};

size_t cost(const written_term& t) {
  return t.recent.size() + 96;
}

// What the writer keeps of the rows it wrote: a store's terms are mostly
// ones written recently (common words, a conversation's topic), and a
// kept row spares reading it back before rewriting it.
constexpr size_t writer_cache_bytes = 16u << 20;

struct entry_row {
  int64_t id;
  std::string user_id;
  std::string thread_id;
  std::string content;
};

// A scope's row as the writer found it (and, on PostgreSQL, locked it).
struct scope_row {
  int64_t id = 0; // 0: none
  int64_t version = 0;
};

// How many times a transaction that lost a race is run again.
constexpr int race_attempts = 5;

// The channel a writer on PostgreSQL notifies, after each commit, of the
// scopes it changed; every process's listener listens on it.
constexpr std::string_view notify_sql
  = "SELECT pg_notify('spindle_memory', ?1);";

} // namespace

// -- change counters ------------------------------------------------------------

memory_changes::memory_changes()
  : origin_((static_cast<uint64_t>(std::random_device{}()) << 32)
            ^ std::random_device{}()
            ^ static_cast<uint64_t>(
              std::chrono::steady_clock::now().time_since_epoch().count())) {
}

size_t memory_changes::slot(std::string_view user_id,
                            std::string_view thread_id) noexcept {
  return change_slot(user_id, thread_id);
}

void memory_changes::changed_slot(size_t slot) noexcept {
  counters_[slot % slots].fetch_add(1, std::memory_order_release);
}

void memory_changes::changed_all() noexcept {
  for (auto& c : counters_)
    c.fetch_add(1, std::memory_order_release);
}

bool memory_changes::complete() const noexcept {
  return complete_.load(std::memory_order_acquire);
}

void memory_changes::set_complete(bool value) noexcept {
  complete_.store(value, std::memory_order_release);
}

uint64_t memory_changes::seen(std::string_view user_id,
                              std::string_view thread_id) const noexcept {
  return counters_[change_slot(user_id, thread_id)].load(
    std::memory_order_acquire);
}

void memory_changes::changed(std::string_view user_id,
                             std::string_view thread_id) noexcept {
  counters_[change_slot(user_id, thread_id)].fetch_add(
    1, std::memory_order_release);
}

// -- the writer -------------------------------------------------------------

struct memory_writer::impl {
  memory_db db;
  std::shared_ptr<memory_changes> changes;
  // Scopes the current transaction stores into: their counters are
  // raised once it commits.
  std::vector<std::pair<std::string, std::string>> touched;
  mem_statement begin, commit, rollback; // SQLite's
  mem_statement insert_entry, find_scope, add_scope, grow_scope;
  mem_statement read_term, insert_term, update_term, set_indexed,
    read_indexed, unindexed;
  mem_statement highest_id, read_row, delete_row, delete_term, shrink_scope,
    clear_scope, delete_scope_terms, delete_user_rows, delete_thread_rows,
    tenant_scopes;
  // PostgreSQL's: a batch's IDs taken from memory_index_state under its
  // row lock, and the note of a commit to the other processes.
  mem_statement allocate_ids, notify;
  // The next entry's ID: above every ID ever stored, so that a deleted
  // entry's ID is never used again (a reader may still keep its text).
  // 0 until the first store reads it.
  int64_t next_id = 0;
  lru_cache<std::string, written_term> written{writer_cache_bytes};
  std::string cache_key;

  // The row of a scope (as scope_key names it), id 0 if it has none. On
  // PostgreSQL the row is locked until the transaction ends: every change
  // to a scope's entries, counts and lists is made under it, so two
  // processes never change one scope at once.
  caf::expected<scope_row> existing_scope(std::string_view user,
                                          std::string_view thread) {
    resetting r{find_scope};
    find_scope.bind(1, user).bind(2, thread);
    auto row = find_scope.step();
    if (!row)
      return row.error();
    if (!*row)
      return scope_row{};
    return scope_row{find_scope.column_int64(0), find_scope.column_int64(1)};
  }

  // The scope's row, created if missing (and locked, as existing_scope).
  caf::expected<scope_row> scope_of(std::string_view user,
                                    std::string_view thread) {
    auto found = existing_scope(user, thread);
    if (!found || found->id != 0)
      return found;
    // On PostgreSQL another process may create it at the same time: then
    // this waits for it and locks its row.
    resetting r{add_scope};
    add_scope.bind(1, user).bind(2, thread);
    auto row = add_scope.step();
    if (!row)
      return row.error();
    if (!*row)
      return make_error(errc::storage_failure,
                        "a new memory scope came back without its ID");
    return scope_row{add_scope.column_int64(0), add_scope.column_int64(1)};
  }

  // Adds entries (already in `memories`, in ascending ID order) to the
  // index: each scope's counts, and each term's frequency and list, read
  // and written once for all of them. Runs inside the caller's
  // transaction.
  // `mark_indexed`: raises indexed_through to the highest of them (the
  // IDs a batch took on PostgreSQL raised it already).
  caf::error index(const std::vector<entry_row>& rows,
                   bool mark_indexed = true) {
    std::map<std::pair<int64_t, std::string>, std::vector<posting>> lists;
    std::map<int64_t, std::pair<int64_t, int64_t>> grown; // entries, words
    std::map<std::pair<std::string, std::string>, scope_row> scopes;
    std::unordered_map<int64_t, int64_t> versions; // scope ID -> version
    int64_t highest = 0;
    for (auto& row : rows) {
      auto key = scope_key(row.user_id, row.thread_id);
      scopes.emplace(std::pair<std::string, std::string>{key.first,
                                                         key.second},
                     scope_row{});
    }
    // Locked in one order (by user, then thread) in every transaction, so
    // that two processes storing into the same scopes never deadlock.
    for (auto& [key, scope] : scopes) {
      auto found = scope_of(key.first, key.second);
      if (!found)
        return found.error();
      scope = *found;
      versions[scope.id] = scope.version;
      touched.emplace_back(key.first, key.second);
    }
    for (auto& row : rows) {
      auto key = scope_key(row.user_id, row.thread_id);
      auto scope = scopes
                     .find(std::pair<std::string, std::string>{key.first,
                                                               key.second})
                     ->second.id;
      auto words = memory_words(row.content);
      std::unordered_map<std::string, uint64_t> tf;
      for (auto& w : words)
        ++tf[w];
      auto shortest = memory_shortest_cut(row.content);
      auto& g = grown[scope];
      g.first += 1;
      g.second += static_cast<int64_t>(words.size());
      for (auto& [term, n] : tf)
        lists[{scope, term}].push_back(
          posting{row.id, n, words.size(), shortest});
      highest = std::max(highest, row.id);
    }
    std::vector<posting> list;
    for (auto& [key, added] : lists) {
      int64_t df = 0;
      bool exists = false;
      list.clear();
      // Newest first: the added entries (ascending IDs) reversed, then
      // the list as it was, cut to its bound.
      list.assign(added.rbegin(), added.rend());
      cache_key.assign(reinterpret_cast<const char*>(&key.first),
                       sizeof key.first);
      cache_key += key.second;
      auto version = versions[key.first];
      auto* kept = written.find(cache_key);
      if (kept != nullptr && kept->version == version) {
        df = kept->df;
        exists = true;
        decode(kept->recent, list);
      } else {
        resetting r{read_term};
        read_term.bind(1, key.first).bind(2, std::string_view{key.second});
        auto row = read_term.step();
        if (!row)
          return row.error();
        if (*row) {
          exists = true;
          df = read_term.column_int64(0);
          decode(read_term.column_view(1), list);
        }
      }
      if (list.size() > memory_recent_per_term)
        list.resize(memory_recent_per_term);
      // The scope's version once this transaction raises it (below).
      written_term now{df + static_cast<int64_t>(added.size()), encode(list),
                       version + 1};
      auto& write = exists ? update_term : insert_term;
      write.bind(1, key.first)
        .bind(2, std::string_view{key.second})
        .bind(3, now.df)
        .bind_blob(4, now.recent);
      if (auto err = write.write())
        return err;
      written.put(cache_key, std::move(now));
    }
    for (auto& [scope, g] : grown) {
      grow_scope.bind(1, scope).bind(2, g.first).bind(3, g.second);
      if (auto err = grow_scope.write())
        return err;
    }
    if (!mark_indexed)
      return caf::none;
    set_indexed.bind(1, highest);
    return set_indexed.write();
  }

  // Runs `body` in a write transaction: committed if it succeeds, rolled
  // back (nothing stored) if it fails. PostgreSQL's connection begins and
  // commits itself: it looks up the outcome of a commit whose answer was
  // lost (sql_connection::commit).
  //
  // On PostgreSQL the other processes' listeners are notified of the
  // scopes it changed, by a note that PostgreSQL delivers when (and only
  // if) it commits; and a transaction that lost a race (a deadlock, which
  // the lock order rules out between memory's own transactions, or a
  // serialization failure) is run again, up to race_attempts times.
  template <class F>
  caf::error transaction(F body) {
    for (int attempt = 1;; ++attempt) {
      auto err = transaction_once(body);
      if (!err || db.pg == nullptr || attempt == race_attempts
          || !lost_a_race(err))
        return err;
    }
  }

  // The note of a commit: the writer's origin, then the slots of the
  // scopes it changed.
  caf::error notify_touched() {
    if (db.pg == nullptr || touched.empty())
      return caf::none;
    std::string note = std::to_string(changes ? changes->origin() : 0);
    std::vector<size_t> slots;
    for (auto& [user, thread] : touched)
      slots.push_back(memory_changes::slot(user, thread));
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    for (auto slot : slots) {
      note += ' ';
      note += std::to_string(slot);
    }
    resetting r{notify};
    notify.bind(1, std::string_view{note});
    return notify.run();
  }

  template <class F>
  caf::error transaction_once(F& body) {
    touched.clear();
    if (auto err = db.pg != nullptr ? db.pg->begin() : begin.run())
      return err;
    auto err = body();
    if (!err)
      err = notify_touched();
    if (!err)
      err = db.pg != nullptr ? db.pg->commit() : commit.run();
    if (err) {
      // Undoes everything; its own failure adds nothing.
      if (db.pg != nullptr)
        db.pg->rollback();
      else
        rollback.run();
      written.clear(); // it may hold rows the rollback undid
      return err;
    }
    if (changes)
      for (auto& [user, thread] : touched)
        changes->changed(user, thread);
    return caf::none;
  }
};

memory_writer::memory_writer(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

caf::expected<uint64_t>
memory_writer::delete_scope(const std::string& user_id,
                            const std::string& thread_id) {
  auto& p = *impl_;
  // Not a structured binding: C++17 lambdas cannot capture one.
  auto key = scope_key(user_id, thread_id);
  auto user = key.first;
  auto thread = key.second;
  uint64_t deleted = 0;
  auto err = p.transaction([&]() -> caf::error {
    deleted = 0;
    // The scope's row first, locked on PostgreSQL (created there if
    // missing, so that a store another process commits meanwhile waits
    // for this deletion instead of slipping between its statements).
    auto scope = p.db.pg != nullptr ? p.scope_of(user, thread)
                                    : p.existing_scope(user, thread);
    if (!scope)
      return scope.error();
    auto& rows = user.empty() ? p.delete_thread_rows : p.delete_user_rows;
    rows.bind(1, user.empty() ? thread : user);
    if (auto failed = rows.run())
      return failed;
    deleted = static_cast<uint64_t>(p.db.changes());
    if (scope->id == 0)
      return caf::none; // never stored into
    p.delete_scope_terms.bind(1, scope->id);
    if (auto failed = p.delete_scope_terms.run())
      return failed;
    p.clear_scope.bind(1, scope->id);
    if (auto failed = p.clear_scope.run())
      return failed;
    p.touched.emplace_back(std::string{user}, std::string{thread});
    return caf::none;
  });
  p.written.clear(); // it may hold rows of the scope
  if (err)
    return err;
  return deleted;
}

caf::expected<std::vector<std::pair<std::string, std::string>>>
memory_writer::tenant_scopes(const std::string& prefix) {
  auto& p = *impl_;
  std::vector<std::pair<std::string, std::string>> out;
  resetting r{p.tenant_scopes};
  p.tenant_scopes.bind(1, std::string_view{prefix + "%"});
  for (;;) {
    auto row = p.tenant_scopes.step();
    if (!row)
      return row.error();
    if (!*row)
      break;
    out.emplace_back(p.tenant_scopes.column_text(0),
                     p.tenant_scopes.column_text(1));
  }
  return out;
}

caf::expected<uint64_t>
memory_writer::delete_entry(int64_t id, const std::string& tenant) {
  auto& p = *impl_;
  uint64_t deleted = 0;
  auto err = p.transaction([&]() -> caf::error {
    deleted = 0;
    std::string user_id, thread_id, content;
    {
      resetting r{p.read_row};
      // An end user's prefix holds the separator twice.
      std::string user;
      if (auto first = tenant.find(tenant_separator);
          first != std::string::npos
          && tenant.find(tenant_separator, first + 1) != std::string::npos)
        user = tenant.substr(0, tenant.size() - 1);
      p.read_row.bind(1, id)
        .bind(2, std::string_view{tenant})
        .bind(3, std::string_view{tenant + "%"})
        .bind(4, std::string_view{user});
      auto row = p.read_row.step();
      if (!row)
        return row.error();
      if (!*row)
        return caf::none;
      user_id = p.read_row.column_text(0);
      thread_id = p.read_row.column_text(1);
      content = p.read_row.column_text(2);
    }
    // The scope's row first (locked on PostgreSQL, see existing_scope),
    // then the entry: another process may have deleted it meanwhile.
    auto [user, thread] = scope_key(user_id, thread_id);
    auto found = p.existing_scope(user, thread);
    if (!found)
      return found.error();
    p.delete_row.bind(1, id);
    if (auto failed = p.delete_row.run())
      return failed;
    if (p.db.changes() == 0)
      return caf::none;
    deleted = 1;
    if (found->id == 0)
      return caf::none; // not indexed yet (catch_up indexes the rest)
    auto scope = found->id;
    auto words = memory_words(content);
    std::map<std::string, uint64_t> tf;
    for (auto& w : words)
      ++tf[w];
    std::vector<posting> list;
    for (auto& [term, n] : tf) {
      int64_t df = 0;
      list.clear();
      {
        resetting r{p.read_term};
        p.read_term.bind(1, scope).bind(2, std::string_view{term});
        auto row = p.read_term.step();
        if (!row)
          return row.error();
        if (!*row)
          continue;
        df = p.read_term.column_int64(0);
        decode(p.read_term.column_view(1), list);
      }
      list.erase(std::remove_if(list.begin(), list.end(),
                                [id](const posting& x) { return x.id == id; }),
                 list.end());
      if (df <= 1) {
        p.delete_term.bind(1, scope).bind(2, std::string_view{term});
        if (auto failed = p.delete_term.run())
          return failed;
        continue;
      }
      p.update_term.bind(1, scope)
        .bind(2, std::string_view{term})
        .bind(3, df - 1)
        .bind_blob(4, encode(list));
      if (auto failed = p.update_term.run())
        return failed;
    }
    p.shrink_scope.bind(1, scope).bind(2,
                                       static_cast<int64_t>(words.size()));
    if (auto failed = p.shrink_scope.run())
      return failed;
    p.touched.emplace_back(std::string{user}, std::string{thread});
    return caf::none;
  });
  p.written.clear(); // it may hold the rows just rewritten
  if (err)
    return err;
  return deleted;
}

memory_writer::~memory_writer() = default;

// The writer's SQL runs on both databases as it is, but for the bytes of
// a term's list (mem_statement::bind_blob).
caf::expected<std::unique_ptr<memory_writer>>
memory_writer::open(database& db, std::shared_ptr<memory_changes> changes) {
  return open_on(&db, nullptr, std::move(changes));
}

caf::expected<std::unique_ptr<memory_writer>>
memory_writer::open(sql_connection& conn,
                    std::shared_ptr<memory_changes> changes) {
  auto* lite = conn.sqlite();
  return open_on(lite, lite != nullptr ? nullptr : &conn, std::move(changes));
}

caf::expected<std::unique_ptr<memory_writer>>
memory_writer::open_on(database* lite, sql_connection* pg,
                       std::shared_ptr<memory_changes> changes) {
  auto p = std::make_unique<impl>();
  memory_db db{lite, pg};
  p->db = db;
  p->changes = std::move(changes);
  if (db.pg == nullptr)
    if (auto err = prepare_all(db, {{&p->begin, "BEGIN IMMEDIATE;"},
                                    {&p->commit, "COMMIT;"},
                                    {&p->rollback, "ROLLBACK;"}}))
      return err;
  std::string insert_term = db.pg != nullptr
                              ? "INSERT INTO memory_terms(scope, term, df, "
                                "recent) VALUES(?1, ?2, ?3, "
                                "decode(?4, 'hex'));"
                              : "INSERT INTO memory_terms(scope, term, df, "
                                "recent) VALUES(?1, ?2, ?3, ?4);";
  bool on_pg = db.pg != nullptr;
  // On PostgreSQL a scope's row is locked by the writer that reads it, and
  // created by one statement that waits for another process creating it
  // too; the index's state row is locked by catch_up, whose stores take
  // their IDs from it.
  std::string find_scope = on_pg ? "SELECT id, version FROM memory_scopes "
                                "WHERE user_id = ?1 AND thread_id = ?2 "
                                "FOR UPDATE;"
                              : "SELECT id, version FROM memory_scopes "
                                "WHERE user_id = ?1 AND thread_id = ?2;";
  std::string add_scope = on_pg ? "INSERT INTO memory_scopes(user_id, "
                               "thread_id) VALUES(?1, ?2) ON CONFLICT "
                               "(user_id, thread_id) DO UPDATE SET version "
                               "= memory_scopes.version RETURNING id, "
                               "version;"
                             : "INSERT INTO memory_scopes(user_id, "
                               "thread_id) VALUES(?1, ?2) RETURNING id, "
                               "version;";
  std::string read_indexed = on_pg ? "SELECT indexed_through FROM "
                                  "memory_index_state WHERE id = 0 "
                                  "FOR UPDATE;"
                                : "SELECT indexed_through FROM "
                                  "memory_index_state WHERE id = 0;";
  if (on_pg)
    if (auto err = prepare_all(
          db,
          {{&p->allocate_ids,
            // Above every ID ever stored or indexed, under the row's lock
            // until the batch commits: IDs are unique across processes
            // and increase in commit order.
            "UPDATE memory_index_state SET indexed_through = "
            "GREATEST(indexed_through, (SELECT COALESCE(max(id), 0) FROM "
            "memories)) + ?1 WHERE id = 0 RETURNING indexed_through;"},
           {&p->notify, notify_sql}}))
      return err;
  std::string update_term = db.pg != nullptr
                              ? "UPDATE memory_terms SET df = ?3, "
                                "recent = decode(?4, 'hex') "
                                "WHERE scope = ?1 AND term = ?2;"
                              : "UPDATE memory_terms SET df = ?3, "
                                "recent = ?4 WHERE scope = ?1 AND term = ?2;";
  auto err = prepare_all(
    db,
    {{&p->insert_entry, "INSERT INTO memories(user_id, thread_id, content, "
                        "created_ms, id) VALUES(?1, ?2, ?3, ?4, ?5);"},
     {&p->highest_id, "SELECT max(h) FROM (SELECT max(id) AS h FROM "
                      "memories UNION ALL SELECT indexed_through AS h FROM "
                      "memory_index_state WHERE id = 0) AS highest;"},
     // ?2: "*" any tenant, "" the default tenant (unqualified IDs), a
     // tenant's prefix "TENANT~" with ?3 its LIKE pattern, or an end
     // user's "TENANT~USER~" with ?4 its user ID "TENANT~USER" (compared
     // whole, as a user ID may hold LIKE's wildcards).
     {&p->read_row, "SELECT user_id, thread_id, content FROM memories "
                    "WHERE id = ?1 AND (?2 = '*' "
                    "OR (?2 = '' AND user_id NOT LIKE '%~%' "
                    "    AND thread_id NOT LIKE '%~%') "
                    "OR (?4 = '' AND ?2 <> '' AND ?2 <> '*' "
                    "    AND (user_id LIKE ?3 "
                    "         OR (user_id = '' AND thread_id LIKE ?3))) "
                    "OR (?4 <> '' AND (user_id = ?4 OR (user_id = '' "
                    "    AND substr(thread_id, 1, length(?2)) = ?2))));"},
     {&p->delete_row, "DELETE FROM memories WHERE id = ?1;"},
     // The scopes of one tenant (?1: its prefix's LIKE pattern).
     {&p->tenant_scopes, "SELECT DISTINCT user_id, thread_id FROM memories "
                         "WHERE user_id LIKE ?1 "
                         "OR (user_id = '' AND thread_id LIKE ?1);"},
     {&p->delete_term, "DELETE FROM memory_terms "
                       "WHERE scope = ?1 AND term = ?2;"},
     {&p->shrink_scope, "UPDATE memory_scopes SET entries = entries - 1, "
                        "words = CASE WHEN words > ?2 THEN words - ?2 "
                        "ELSE 0 END, version = version + 1 WHERE id = ?1;"},
     {&p->clear_scope, "UPDATE memory_scopes SET entries = 0, words = 0, "
                       "version = version + 1 WHERE id = ?1;"},
     {&p->delete_scope_terms, "DELETE FROM memory_terms WHERE scope = ?1;"},
     {&p->delete_user_rows, "DELETE FROM memories WHERE user_id = ?1;"},
     {&p->delete_thread_rows, "DELETE FROM memories "
                              "WHERE user_id = '' AND thread_id = ?1;"},
     {&p->find_scope, find_scope},
     {&p->add_scope, add_scope},
     {&p->grow_scope, "UPDATE memory_scopes SET entries = entries + ?2, "
                      "words = words + ?3, version = version + 1 "
                      "WHERE id = ?1;"},
     {&p->read_term, "SELECT df, recent FROM memory_terms "
                     "WHERE scope = ?1 AND term = ?2;"},
     {&p->insert_term, insert_term},
     {&p->update_term, update_term},
     {&p->set_indexed, "UPDATE memory_index_state SET indexed_through = "
                       "CASE WHEN indexed_through > ?1 THEN indexed_through "
                       "ELSE ?1 END WHERE id = 0;"},
     {&p->read_indexed, read_indexed},
     {&p->unindexed, "SELECT id, user_id, thread_id, content FROM memories "
                     "WHERE id > ?1 ORDER BY id LIMIT ?2;"}});
  if (err)
    return err;
  return std::unique_ptr<memory_writer>{new memory_writer(std::move(p))};
}

caf::expected<int64_t> memory_writer::store(const std::string& content,
                                            const std::vector<std::string>&
                                              tags) {
  auto scope = parse_memory_tags(tags);
  if (!scope)
    return scope.error();
  auto ids = store_all({memory_entry{content, std::move(*scope)}});
  if (!ids)
    return ids.error();
  return ids->front();
}

caf::error memory_writer::check(const memory_entry& e) {
  if (e.content.empty())
    return make_error(errc::invalid_argument,
                      "content of a memory must not be empty");
  if (e.content.size() > max_memory_content)
    return make_error(errc::too_large,
                      "content has " + std::to_string(e.content.size())
                        + " bytes; a memory holds at most "
                        + std::to_string(max_memory_content));
  if (e.scope.user_id.empty() && e.scope.thread_id.empty())
    return make_error(errc::invalid_argument,
                      "a memory belongs to a user or a thread");
  if (!e.scope.user_id.empty())
    if (auto err = validate_user_id(e.scope.user_id))
      return err;
  if (!e.scope.thread_id.empty())
    if (auto err = validate_thread_id(e.scope.thread_id))
      return err;
  return {};
}

caf::error memory_writer::accepts(const memory_entry& e) const {
  if (auto err = check(e))
    return err;
  // A PostgreSQL text holds neither a NUL character nor bytes that are
  // not UTF-8. Refused before the transaction: the database refusing it
  // there would fail the whole batch it is in.
  if (impl_->db.pg == nullptr)
    return {};
  if (e.content.find('\0') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "content has a NUL character, which a memory on "
                      "PostgreSQL cannot hold");
  if (!is_valid_utf8(e.content))
    return make_error(errc::invalid_argument,
                      "content is not valid UTF-8, which a memory on "
                      "PostgreSQL needs");
  return {};
}

caf::expected<std::vector<int64_t>>
memory_writer::store_all(const std::vector<memory_entry>& entries) {
  for (auto& e : entries)
    if (auto err = accepts(e))
      return err;
  auto& p = *impl_;
  std::vector<int64_t> ids;
  auto err = p.transaction([&]() -> caf::error {
    ids.clear();
    std::vector<entry_row> rows;
    rows.reserve(entries.size());
    auto now = unix_time_ms();
    bool on_pg = p.db.pg != nullptr;
    if (on_pg) {
      // Other processes store into the same database: the batch's IDs come
      // from it, the lock on their row held until the batch commits.
      resetting r{p.allocate_ids};
      p.allocate_ids.bind(1, static_cast<int64_t>(entries.size()));
      auto row = p.allocate_ids.step();
      if (!row)
        return row.error();
      if (!*row)
        return make_error(errc::storage_failure,
                          "memory_index_state has no row to take IDs from");
      p.next_id = p.allocate_ids.column_int64(0)
                  - static_cast<int64_t>(entries.size()) + 1;
    } else if (p.next_id == 0) {
      resetting r{p.highest_id};
      auto row = p.highest_id.step();
      if (!row)
        return row.error();
      p.next_id = (*row ? p.highest_id.column_int64(0) : 0) + 1;
    }
    for (auto& e : entries) {
      auto id = p.next_id++;
      p.insert_entry.bind(1, std::string_view{e.scope.user_id})
        .bind(2, std::string_view{e.scope.thread_id})
        .bind(3, std::string_view{e.content})
        .bind(4, now)
        .bind(5, id);
      if (auto failed = p.insert_entry.write())
        return failed;
      ids.push_back(id);
      rows.push_back(entry_row{id, e.scope.user_id, e.scope.thread_id,
                               e.content});
    }
    return p.index(rows, !on_pg);
  });
  if (err)
    return err;
  return ids;
}

caf::expected<uint64_t> memory_writer::catch_up(size_t batch) {
  auto& p = *impl_;
  uint64_t total = 0;
  for (;;) {
    size_t got = 0;
    auto err = p.transaction([&]() -> caf::error {
      int64_t through = 0;
      {
        resetting r{p.read_indexed};
        auto row = p.read_indexed.step();
        if (!row)
          return row.error();
        if (*row)
          through = p.read_indexed.column_int64(0);
      }
      std::vector<entry_row> rows;
      {
        resetting r{p.unindexed};
        p.unindexed.bind(1, through).bind(2, static_cast<int64_t>(batch));
        for (;;) {
          auto row = p.unindexed.step();
          if (!row)
            return row.error();
          if (!*row)
            break;
          rows.push_back(entry_row{p.unindexed.column_int64(0),
                                   p.unindexed.column_text(1),
                                   p.unindexed.column_text(2),
                                   p.unindexed.column_text(3)});
        }
      }
      got = rows.size();
      return rows.empty() ? caf::none : p.index(rows);
    });
    if (err)
      return err;
    total += got;
    if (got < batch)
      return total;
  }
}

// -- the reader -------------------------------------------------------------

namespace {

// BM25's usual parameters: term frequency saturation and length
// normalisation.
constexpr double bm25_k1 = 1.2;
constexpr double bm25_b = 0.75;

struct scored {
  int64_t id;
  double score;
  uint64_t shortest;
};

// A candidate's place in the ranking: its score as a float (never
// negative, so its bits order as the float does), its ID for ties, and
// its index in the retrieval's candidates.
struct ranked_key {
  uint32_t score;
  uint32_t index;
  int64_t id;
};

// Sorts by score, lowest first, and among equal scores by ID: a
// least-significant-digit radix sort over the bytes of the score that
// differ between keys (one retrieval's scores share their high bytes),
// with the histograms of all bytes counted in one pass, then the runs of
// equal scores among the highest `top` put in ID order. No comparison
// decides a branch but in those runs. `spare` is the other buffer.
void rank_sort(std::vector<ranked_key>& keys, std::vector<ranked_key>& spare,
               size_t top) {
  uint32_t count[4][256] = {};
  for (auto& k : keys) {
    ++count[0][k.score & 0xff];
    ++count[1][(k.score >> 8) & 0xff];
    ++count[2][(k.score >> 16) & 0xff];
    ++count[3][k.score >> 24];
  }
  spare.resize(keys.size());
  for (unsigned byte = 0; byte < 4; ++byte) {
    auto& c = count[byte];
    // A byte all keys share leaves the order as it is.
    if (c[(keys.front().score >> (8 * byte)) & 0xff] == keys.size())
      continue;
    uint32_t sum = 0;
    for (auto& slot : c) {
      auto here = slot;
      slot = sum;
      sum += here;
    }
    for (auto& k : keys)
      spare[c[(k.score >> (8 * byte)) & 0xff]++] = k;
    keys.swap(spare);
  }
  // Ties: every run of one score that reaches into the highest `top`,
  // whole (a run across the boundary decides by ID which of it is in),
  // by ID.
  auto end = keys.size();
  auto from = end - std::min(end, top);
  while (end > from) {
    auto begin = end - 1;
    while (begin > 0 && keys[begin - 1].score == keys[end - 1].score)
      --begin;
    if (end - begin > 1)
      std::sort(keys.begin() + static_cast<long>(begin),
                keys.begin() + static_cast<long>(end),
                [](const ranked_key& x, const ranked_key& y) {
                  return x.id < y.id;
                });
    end = begin;
  }
}

// A slot of a retrieval's table from entry to candidate.
struct table_slot {
  uint32_t generation = 0; // the retrieval that filled it; 0: never
  uint32_t index = 0;      // in the retrieval's candidates
};

// An entry as a reader read it: its scope columns, its content
// whitespace normalised, and the content's hash (for the snippet's
// duplicate check).
struct cached_entry {
  std::string user_id;
  std::string thread_id;
  std::string content;
  size_t hash = 0;
  /// The tokens of the entry as a snippet's line, "- {content}\n", and as
  /// its last line, "- {content}" (when the reader counts tokens).
  uint32_t line_tokens = 0;
  uint32_t last_tokens = 0;
  /// The same for the entry cut at `cut` bytes, the last cut a snippet
  /// made of it (0: none yet): a snippet's last entry is mostly cut, and
  /// mostly where it was cut before.
  uint32_t cut = 0;
  uint32_t cut_line_tokens = 0;
  uint32_t cut_last_tokens = 0;
};

// A snippet's tokens, line by line: its pattern splits the text at every
// "\n- " (no piece crosses from one line into the next: a line's last
// piece takes the newline at most, and "-" followed by a space is a piece
// of its own), so the snippet's count is the sum of its lines' counts, the
// last one without its newline. A test checks this against the
// tokenizer over random entries.
struct snippet_tokens {
  uint64_t lines = 0;
  uint64_t last_line = 0;
  uint64_t last_alone = 0;

  void add(uint64_t line, uint64_t alone) {
    lines += line;
    last_line = line;
    last_alone = alone;
  }
  uint64_t total() const {
    return lines - last_line + last_alone;
  }
};

// "- {text}\n" and "- {text}" counted.
std::pair<uint32_t, uint32_t> line_tokens(const token_counter& counter,
                                          std::string_view text) {
  std::string line;
  line.reserve(text.size() + 3);
  line += "- ";
  line += text;
  auto alone = counter.count_text(line);
  line += '\n';
  auto with_newline = counter.count_text(line);
  constexpr size_t most = UINT32_MAX;
  return {static_cast<uint32_t>(std::min(with_newline, most)),
          static_cast<uint32_t>(std::min(alone, most))};
}

size_t cost(const cached_entry& e) {
  return e.user_id.size() + e.thread_id.size() + e.content.size() + 128;
}

// A term's list in one scope as a reader read it, scored: valid while the
// scope holds `entries` entries (every store in a scope adds one, in the
// transaction that changes its lists). Empty: the scope has no entry with
// the term.
struct cached_list {
  int64_t version = 0; // the scope's, when the list was read
  std::vector<scored> hits; // newest first
};

size_t cost(const cached_list& l) {
  return l.hits.size() * sizeof(scored) + 128;
}

// A scope's row as a reader read it, valid while the scope's counter in
// memory_changes stands where it stood before the read.
struct cached_scope {
  uint64_t seen = 0;
  bool exists = false;
  int64_t id = 0;
  int64_t entries = 0;
  int64_t version = 0;
  double average_words = 1.0;
};

size_t cost(const cached_scope&) {
  return 160;
}

// What a reader keeps. An entry never changes once stored (spindle never
// updates one, and never gives a deleted entry's ID to another, in any
// process on the database), so a kept entry is never stale; a kept list is checked
// against its scope's version (raised by every store and deletion), and a
// kept scope against its change counter, on every use. Retrievals only ever read the newest entries of each term, which
// keeps the set they need small.
struct reader_caches {
  explicit reader_caches(size_t bytes)
    : entries(bytes / 3 * 2), lists(bytes / 3), scopes(bytes / 24) {
  }
  lru_cache<int64_t, cached_entry> entries;
  lru_cache<std::string, cached_list> lists;
  lru_cache<std::string, cached_scope> scopes;
};

} // namespace

struct memory_reader::impl {
  impl(std::shared_ptr<const memory_changes> c, size_t bytes)
    : changes(std::move(c)), keep(bytes) {
  }

  mem_statement find_scope, read_term, read_entry, list_user, list_thread;
  bool on_postgres = false;
  std::shared_ptr<const memory_changes> changes;
  /// Counts snippets' tokens (null: not counted).
  std::shared_ptr<const token_counter> counter;
  memory_retrieval_cost cost;
  reader_caches keep;
  // Where a value too large for its cache (or with no cache) is kept for
  // the retrieval that read it.
  cached_entry uncached_entry;
  cached_list uncached_list;
  // Reused between retrievals: no allocation once they have grown.
  std::vector<posting> list;
  std::string key;
  std::vector<table_slot> table;  // entry -> candidate, while summing
  uint32_t generation = 0;        // the retrieval's mark in `table`
  std::vector<scored> candidates; // one per entry
  std::vector<ranked_key> order;  // the ranking, worst first
  std::vector<ranked_key> sorting; // the radix sort's other buffer
  // Set by `retrieve_kept`: a retrieval that would run a statement stops
  // and says so in `missed` instead.
  bool kept_only = false;
  bool missed = false;

  // The scope of a request: kept, or read (and kept).
  caf::expected<cached_scope> scope_of(const memory_query& q) {
    auto [user, thread] = scope_key(q.user_id, q.thread_id);
    uint64_t seen = 0;
    if (changes) {
      key.assign(user);
      key += '\0';
      key += thread;
      seen = changes->seen(user, thread);
      // While another process's changes may go uncounted (its notes are
      // not heard), no kept row is trusted.
      if (auto kept = keep.scopes.find(key);
          kept && kept->seen == seen && changes->complete())
        return *kept;
    }
    if (kept_only) {
      missed = true;
      return cached_scope{};
    }
    cached_scope out;
    out.seen = seen;
    resetting r{find_scope};
    find_scope.bind(1, user).bind(2, thread);
    auto row = find_scope.step();
    ++cost.statements;
    if (!row)
      return row.error();
    if (*row) {
      out.exists = true;
      out.id = find_scope.column_int64(0);
      out.entries = find_scope.column_int64(1);
      out.version = find_scope.column_int64(3);
      auto words = find_scope.column_int64(2);
      if (out.entries > 0 && words > 0)
        out.average_words = static_cast<double>(words)
                            / static_cast<double>(out.entries);
    }
    if (changes)
      keep.scopes.put(key, cached_scope{out});
    return out;
  }

  // Reads a term's list of a scope and scores its entries.
  caf::expected<cached_list> read_list(int64_t scope, const std::string& term,
                                       int64_t scope_entries,
                                       int64_t scope_version,
                                       double average_words) {
    cached_list out;
    out.version = scope_version;
    resetting r{read_term};
    read_term.bind(1, scope).bind(2, std::string_view{term});
    auto row = read_term.step();
    ++cost.statements;
    if (!row)
      return row.error();
    ++cost.lists_read;
    if (!*row)
      return out;
    auto df = static_cast<double>(read_term.column_int64(0));
    list.clear();
    decode(read_term.column_view(1), list);
    auto n = static_cast<double>(scope_entries);
    auto idf = std::log(1.0 + (n - df + 0.5) / (df + 0.5));
    out.hits.reserve(list.size());
    for (auto& p : list) {
      auto tf = static_cast<double>(p.tf);
      auto norm = 1.0 - bm25_b
                  + bm25_b * static_cast<double>(p.words) / average_words;
      out.hits.push_back(scored{p.id,
                                idf * tf * (bm25_k1 + 1)
                                  / (tf + bm25_k1 * norm),
                                p.shortest});
    }
    return out;
  }

  caf::expected<memory_snippet> ranked_snippet(const memory_query& q,
                                               const std::vector<std::string>&
                                                 terms) {
    auto scope = scope_of(q);
    if (!scope)
      return scope.error();
    if (missed)
      return memory_snippet{};
    if (!scope->exists)
      return memory_snippet{}; // nothing stored in this scope
    // One candidate per entry, its score summed over the lists it is in
    // (in the order of the terms): an open-addressing table maps an entry
    // to its candidate, one probe per hit. Its slots carry the
    // retrieval's number, so a new retrieval starts without clearing it.
    candidates.clear();
    size_t slots = 16;
    while (slots < terms.size() * memory_recent_per_term * 2)
      slots *= 2;
    if (table.size() < slots || ++generation == 0) {
      table.assign(std::max(slots, table.size()), table_slot{});
      generation = 1;
    }
    auto mask = slots - 1;
    for (auto& term : terms) {
      key.assign(reinterpret_cast<const char*>(&scope->id), sizeof scope->id);
      key += term;
      auto kept = keep.lists.find(key);
      if (kept == nullptr || kept->version != scope->version) {
        if (kept_only) {
          missed = true;
          return memory_snippet{};
        }
        auto read = read_list(scope->id, term, scope->entries,
                              scope->version, scope->average_words);
        if (!read)
          return read.error();
        kept = keep.lists.put(key, std::move(*read));
        if (kept == nullptr) {
          uncached_list = std::move(*read);
          kept = &uncached_list;
        }
      }
      if (kept->hits.empty())
        continue;
      ++cost.terms;
      cost.postings += kept->hits.size();
      for (auto& hit : kept->hits) {
        auto h = static_cast<size_t>(static_cast<uint64_t>(hit.id)
                                     * 0x9e3779b97f4a7c15ull >> 40)
                 & mask;
        for (;; h = (h + 1) & mask) {
          auto& slot = table[h];
          if (slot.generation != generation) {
            slot = table_slot{generation,
                              static_cast<uint32_t>(candidates.size())};
            candidates.push_back(hit);
            break;
          }
          if (candidates[slot.index].id == hit.id) {
            candidates[slot.index].score += hit.score;
            break;
          }
        }
      }
    }
    auto n = candidates.size();
    cost.candidates = n;
    if (n == 0)
      return memory_snippet{};
    // The ranking: best first, among equals the newest (the highest ID).
    uint64_t fits_none_below = ~uint64_t{0};
    order.clear();
    for (uint32_t i = 0; i < n; ++i) {
      auto& c = candidates[i];
      // Once the room left is below every candidate's shortest cut, no
      // further entry can be shown.
      if (c.shortest > 0)
        fits_none_below = std::min(fits_none_below, c.shortest);
      auto score = static_cast<float>(std::max(0.0, c.score));
      uint32_t bits = 0;
      std::memcpy(&bits, &score, sizeof bits);
      order.push_back(ranked_key{bits, i, c.id});
    }
    rank_sort(order, sorting, memory_max_ranked);
    auto ranked = std::min(n, memory_max_ranked);
    memory_snippet_builder snippet{static_cast<size_t>(q.max_chars)};
    snippet_tokens tokens;
    uint64_t matched = ranked;
    for (size_t i = 0; i < ranked; ++i) {
      auto room = snippet.room();
      if (room < fits_none_below)
        break;
      auto& c = candidates[order[n - 1 - i].index];
      // An entry that cannot be shown, not even its first sentence, is
      // not read: the snippet would skip it.
      if (c.shortest == 0 || c.shortest > room)
        continue;
      cached_entry* entry = keep.entries.find(c.id);
      if (entry == nullptr) {
        if (kept_only) {
          missed = true;
          return memory_snippet{};
        }
        auto read = read_entry_row(c.id);
        if (!read)
          return read.error();
        entry = *read;
      }
      // The columns, not the index, decide the scope (D8): an entry whose
      // columns say another scope is never shown.
      if (entry == nullptr || entry->user_id != q.user_id
          || (q.user_id.empty() && entry->thread_id != q.thread_id)) {
        --matched;
        continue;
      }
      auto taken = snippet.add_normalized(entry->content, entry->hash, c.id);
      if (taken == entry->content.size() && counter) {
        tokens.add(entry->line_tokens, entry->last_tokens);
      } else if (taken > 0 && counter) {
        if (entry->cut != taken) {
          std::tie(entry->cut_line_tokens, entry->cut_last_tokens)
            = line_tokens(*counter,
                          std::string_view{entry->content}.substr(0, taken));
          entry->cut = static_cast<uint32_t>(taken);
        }
        tokens.add(entry->cut_line_tokens, entry->cut_last_tokens);
      }
    }
    auto out = std::move(snippet).finish(matched);
    if (counter && !out.text.empty()) {
      out.tokens = tokens.total();
      out.token_encoding = static_cast<uint8_t>(counter->id());
    }
    return out;
  }

  // Reads an entry from the database into the cache; null if it is gone.
  caf::expected<cached_entry*> read_entry_row(int64_t id) {
    resetting r{read_entry};
    read_entry.bind(1, id);
    auto row = read_entry.step();
    ++cost.statements;
    if (!row)
      return row.error();
    ++cost.contents;
    if (!*row)
      return nullptr;
    // Kept as the snippet shows it: normalised once, not per retrieval.
    cached_entry e{read_entry.column_text(0), read_entry.column_text(1),
                   memory_normalized(read_entry.column_view(2)), 0};
    e.hash = std::hash<std::string_view>{}(e.content);
    if (counter)
      std::tie(e.line_tokens, e.last_tokens) = line_tokens(*counter,
                                                           e.content);
    if (auto kept = keep.entries.put(id, std::move(e)))
      return kept;
    uncached_entry = std::move(e);
    return &uncached_entry;
  }
};

memory_reader::memory_reader(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

memory_reader::~memory_reader() = default;

caf::expected<std::unique_ptr<memory_reader>>
memory_reader::open(database& db,
                    std::shared_ptr<const memory_changes> changes,
                    size_t cache_bytes) {
  return open_on(&db, nullptr, std::move(changes), cache_bytes);
}

caf::expected<std::unique_ptr<memory_reader>>
memory_reader::open(sql_connection& conn,
                    std::shared_ptr<const memory_changes> changes,
                    size_t cache_bytes) {
  auto* lite = conn.sqlite();
  return open_on(lite, lite != nullptr ? nullptr : &conn, std::move(changes),
                 cache_bytes);
}

// The reader's SQL runs on both databases as it is.
caf::expected<std::unique_ptr<memory_reader>>
memory_reader::open_on(database* lite, sql_connection* pg,
                       std::shared_ptr<const memory_changes> changes,
                       size_t cache_bytes) {
  auto p = std::make_unique<impl>(cache_bytes > 0 ? std::move(changes)
                                                  : nullptr,
                                  cache_bytes);
  p->on_postgres = pg != nullptr;
  auto err = prepare_all(
    memory_db{lite, pg},
    {{&p->find_scope, "SELECT id, entries, words, version "
                      "FROM memory_scopes "
                      "WHERE user_id = ?1 AND thread_id = ?2;"},
     {&p->list_user, "SELECT id, user_id, thread_id, content, created_ms "
                     "FROM memories WHERE user_id = ?1 AND id < ?2 "
                     "ORDER BY id DESC LIMIT ?3;"},
     {&p->list_thread, "SELECT id, user_id, thread_id, content, "
                       "created_ms FROM memories WHERE user_id = '' AND "
                       "thread_id = ?1 AND id < ?2 "
                       "ORDER BY id DESC LIMIT ?3;"},
     {&p->read_term, "SELECT df, recent FROM memory_terms "
                     "WHERE scope = ?1 AND term = ?2;"},
     {&p->read_entry, "SELECT user_id, thread_id, content FROM memories "
                      "WHERE id = ?1;"}});
  if (err)
    return err;
  return std::unique_ptr<memory_reader>{new memory_reader(std::move(p))};
}

caf::expected<memory_snippet>
memory_reader::retrieve(const memory_query& q) {
  auto& p = *impl_;
  p.cost = memory_retrieval_cost{};
  p.missed = false;
  if (auto err = validate_memory_query(q))
    return err;
  auto terms = memory_query_terms(q.query);
  // PostgreSQL holds only UTF-8 entries, whose words are UTF-8 too: a term
  // that is not matches nothing there (and could not be sent as a text).
  if (p.on_postgres)
    terms.erase(std::remove_if(terms.begin(), terms.end(),
                               [](const std::string& t) {
                                 return !is_valid_utf8(t);
                               }),
                terms.end());
  if (terms.empty() || q.max_chars == 0)
    return memory_snippet{};
  // Each statement reads its own snapshot: the scope's count is read
  // first, so a list read later may be newer than the count it is kept
  // with (then read again next time), never older.
  return p.ranked_snippet(q, terms);
}

std::optional<caf::expected<memory_snippet>>
memory_reader::retrieve_kept(const memory_query& q) {
  auto& p = *impl_;
  p.kept_only = true;
  auto got = retrieve(q);
  p.kept_only = false;
  if (p.missed)
    return std::nullopt;
  return got;
}

void memory_reader::count_tokens(
  std::shared_ptr<const token_counter> counter) {
  impl_->counter = std::move(counter);
}

const memory_retrieval_cost& memory_reader::last_cost() const noexcept {
  return impl_->cost;
}

caf::expected<memory_listing>
memory_reader::list(const memory_list_request& r) {
  if (auto err = validate_memory_list_request(r))
    return err;
  auto& p = *impl_;
  auto& stmt = r.user_id.empty() ? p.list_thread : p.list_user;
  resetting reset{stmt};
  auto before = r.before > 0 ? r.before : std::numeric_limits<int64_t>::max();
  // One more than asked: whether a next page exists.
  stmt.bind(1, std::string_view{r.user_id.empty() ? r.thread_id : r.user_id})
    .bind(2, before)
    .bind(3, static_cast<int64_t>(r.limit + 1));
  memory_listing out;
  for (;;) {
    auto row = stmt.step();
    if (!row)
      return row.error();
    if (!*row)
      break;
    if (out.entries.size() == r.limit) {
      out.next_before = out.entries.back().id;
      break;
    }
    out.entries.push_back(memory_record{stmt.column_int64(0),
                                        stmt.column_text(1),
                                        stmt.column_text(2),
                                        stmt.column_text(3),
                                        stmt.column_int64(4)});
  }
  return out;
}

} // namespace spindle
