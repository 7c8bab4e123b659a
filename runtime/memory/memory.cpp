#include "spindle/runtime/memory.hpp"

#include <atomic>
#include <chrono>
#include <charconv>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "storage/postgres/postgres.hpp"
#include "spindle/runtime/storage.hpp"
#include "storage/state_store.hpp"
#include "memory/memory_index.hpp"

namespace spindle {

namespace {

// Hears, on a connection of its own, the notes the memory writers of other
// processes on the same PostgreSQL database send as they commit (the slots
// of the scopes they changed), and raises this process's counters of those
// slots, so that its readers read those scopes again (docs/memory.md, "On
// PostgreSQL"). While it does not listen (its connection lost, until it
// listens again) the counters are not complete and the readers trust no
// kept scope row. Its thread stops when the last holder lets it go.
class memory_listener {
public:
  // Connects and listens before it returns. Errors: `storage_failure`
  // naming the redacted URL.
  static caf::expected<std::shared_ptr<memory_listener>>
  start(const std::string& url, std::shared_ptr<memory_changes> changes) {
    std::shared_ptr<memory_listener> out{
      new memory_listener(url, std::move(changes))};
    if (::pipe(out->wake_) != 0)
      return make_error(errc::storage_failure,
                        "cannot make the memory listener's pipe");
    ::fcntl(out->wake_[0], F_SETFL, O_NONBLOCK);
    if (auto err = out->listen())
      return err;
    out->changes_->set_complete(true);
    out->thread_ = std::thread{[p = out.get()] { p->run(); }};
    return out;
  }

  ~memory_listener() {
    if (thread_.joinable()) {
      char c = 0;
      [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
      thread_.join();
    }
    drop();
    for (auto fd : wake_)
      if (fd >= 0)
        ::close(fd);
  }

  memory_listener(const memory_listener&) = delete;
  memory_listener& operator=(const memory_listener&) = delete;

private:
  // How often an idle connection is asked whether it still answers, and
  // how long an answer may take before it counts as lost: a connection
  // that dies silently stops being trusted within about 3 s.
  static constexpr std::chrono::milliseconds heartbeat{1000};
  static constexpr std::chrono::milliseconds answer_within{2000};

  memory_listener(std::string url, std::shared_ptr<memory_changes> changes)
    : url_(std::move(url)), changes_(std::move(changes)) {
  }

  caf::error listen() {
    // The URL's own settings win over these (it comes last, expanded).
    const char* keys[] = {"connect_timeout",     "keepalives",
                          "keepalives_idle",     "keepalives_interval",
                          "keepalives_count",    "dbname",
                          nullptr};
    const char* values[] = {"5", "1", "5", "1", "3", url_.c_str(), nullptr};
    conn_ = PQconnectdbParams(keys, values, 1);
    auto fail = [this](const std::string& what) {
      std::string msg = conn_ != nullptr ? PQerrorMessage(conn_) : "";
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' '))
        msg.pop_back();
      drop();
      return make_error(errc::storage_failure,
                        redact_url(url_) + ": memory cannot " + what + ": "
                          + msg);
    };
    if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK)
      return fail("listen for other processes' changes");
    auto* r = PQexec(conn_, "LISTEN spindle_memory;");
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok || PQsetnonblocking(conn_, 1) != 0)
      return fail("listen for other processes' changes");
    return caf::none;
  }

  void drop() {
    if (conn_ != nullptr)
      PQfinish(conn_);
    conn_ = nullptr;
    asked_ = false;
  }

  // The connection is lost: changes may go unheard from now until it
  // listens again.
  void lost() {
    changes_->set_complete(false);
    drop();
    spdlog::warn("memory: lost the connection that hears other processes' "
                 "changes to {}; reading every scope again until it is back",
                 redact_url(url_));
  }

  // Waits for the connection's socket (if any) or the stop pipe, at most
  // `timeout`; false when asked to stop.
  bool wait(std::chrono::milliseconds timeout, bool& readable) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0},
                     {conn_ != nullptr ? PQsocket(conn_) : -1, POLLIN, 0}};
    auto n = ::poll(fds, conn_ != nullptr ? 2 : 1,
                    static_cast<int>(timeout.count()));
    readable = n > 0 && conn_ != nullptr && (fds[1].revents != 0);
    return !(n > 0 && fds[0].revents != 0);
  }

  void take(const char* note) {
    // "ORIGIN SLOT SLOT ...": a process's own notes are skipped, its
    // writer raised its counters already.
    std::string_view text{note};
    auto next = [&text](uint64_t& v) {
      while (!text.empty() && text.front() == ' ')
        text.remove_prefix(1);
      if (text.empty())
        return false;
      auto [end, ec] = std::from_chars(text.data(),
                                       text.data() + text.size(), v);
      if (ec != std::errc{})
        return false;
      text.remove_prefix(static_cast<size_t>(end - text.data()));
      return true;
    };
    uint64_t origin = 0;
    if (!next(origin)) {
      changes_->changed_all();
      return;
    }
    if (origin == changes_->origin())
      return;
    for (uint64_t slot = 0; next(slot);)
      changes_->changed_slot(static_cast<size_t>(slot));
    if (!text.empty())
      changes_->changed_all(); // a note this build does not read
  }

  void run() {
    auto backoff = std::chrono::milliseconds{100};
    auto since = std::chrono::steady_clock::now(); // last sign of life
    for (;;) {
      if (conn_ == nullptr) {
        bool readable = false;
        if (!wait(backoff, readable))
          return;
        if (listen()) {
          backoff = std::min(backoff * 2, std::chrono::milliseconds{2000});
          continue;
        }
        // Changes committed while it did not listen were not heard.
        changes_->changed_all();
        changes_->set_complete(true);
        backoff = std::chrono::milliseconds{100};
        since = std::chrono::steady_clock::now();
        spdlog::info("memory: hears other processes' changes to {} again",
                     redact_url(url_));
      }
      bool readable = false;
      if (!wait(heartbeat, readable))
        return;
      auto now = std::chrono::steady_clock::now();
      if (readable) {
        if (PQconsumeInput(conn_) == 0) {
          lost();
          continue;
        }
        since = now;
        while (PQisBusy(conn_) == 0) {
          auto* r = PQgetResult(conn_);
          if (r == nullptr) {
            asked_ = false; // the heartbeat answered
            break;
          }
          PQclear(r);
        }
        while (auto* n = PQnotifies(conn_)) {
          take(n->extra);
          PQfreemem(n);
        }
      }
      if (PQstatus(conn_) != CONNECTION_OK) {
        lost();
        continue;
      }
      if (asked_ && now - asked_at_ > answer_within) {
        lost();
        continue;
      }
      if (!asked_ && now - since >= heartbeat) {
        if (PQsendQuery(conn_, "SELECT 1;") == 0) {
          lost();
          continue;
        }
        PQflush(conn_);
        asked_ = true;
        asked_at_ = now;
      }
    }
  }

  std::string url_;
  std::shared_ptr<memory_changes> changes_;
  PGconn* conn_ = nullptr;
  int wake_[2] = {-1, -1};
  bool asked_ = false; // a heartbeat awaits its answer
  std::chrono::steady_clock::time_point asked_at_;
  std::thread thread_;
};

// What one memory actor serves with: its own connection (to memory.db, or
// to PostgreSQL), a writer if it serves stores, a reader for retrievals.
// A reader is shared with the callers that answer retrievals from what it
// keeps (`kept_retrieval`): `lock` guards it; the actor waits for the
// lock, callers only try it.
struct memory_connection {
  std::unique_ptr<database> db;       // SQLite
  std::unique_ptr<sql_connection> pg; // or PostgreSQL
  std::unique_ptr<memory_writer> writer;
  std::unique_ptr<memory_reader> reader;
  std::mutex lock;
  // On PostgreSQL: what tells the readers of other processes' changes,
  // held by every connection of the memory so that it lives as long as
  // any of them.
  std::shared_ptr<memory_listener> listener;
};

// How many retrievals each reader has been handed and not yet answered,
// and which reader was handed the last one: the routing's picture of the
// readers, kept without locks (a stale picture costs balance, nothing
// else).
struct reader_loads {
  explicit reader_loads(size_t n)
    : pending(new std::atomic<uint32_t>[n]()), size(n) {
  }
  std::unique_ptr<std::atomic<uint32_t>[]> pending;
  size_t size;
  std::atomic<size_t> last{0};
};

struct memory_state {
  static inline const char* name = "spindle.memory";
  std::shared_ptr<memory_connection> conn;
  std::chrono::microseconds linger{0};
  bool loaded = false; // see linger()
  // A reader's entry in the routing's picture (none for the writer and
  // the in-memory actor).
  std::shared_ptr<reader_loads> loads;
  size_t index = 0;
  // Stores waiting for the next commit (the writer's group commit), with
  // the promises that answer them.
  std::vector<memory_entry> batch;
  std::vector<caf::typed_response_promise<int64_t>> waiting;
  bool flush_scheduled = false;
};

// The writer commits the stores that queued up while it was busy in one
// transaction: it queues each store and sends itself a flush, which lands
// behind every store already in its mailbox.
using memory_server_actor = memory_actor::extend<caf::reacts_to<flush_atom>>;
using memory_pointer = memory_server_actor::stateful_pointer<memory_state>;

// A transaction holds at most this many stores. Under sustained load the
// writer is behind and its batches reach this bound; each distinct word of
// a store rewrites its term's row, and a batch rewrites a row (and the
// B-tree page holding it) once for all of its stores that hold the word,
// and commits once. With 256, 16 users storing 2,000 entries a
// second of random words (bench_sustained) outran the writer: its queue
// grew and stores answered `timeout` after 5 s from the 25th second on;
// with 2,048 from the sixth minute on (docs/memory.md, "The writer under
// sustained load").
constexpr size_t max_batch = 2048;

void flush_stores(memory_pointer self) {
  auto& st = self->state;
  if (st.batch.empty())
    return;
  auto batch = std::move(st.batch);
  auto waiting = std::move(st.waiting);
  st.batch.clear();
  st.waiting.clear();
  auto ids = st.conn->writer->store_all(batch);
  if (ids) {
    for (size_t i = 0; i < waiting.size(); ++i)
      waiting[i].deliver((*ids)[i]);
    return;
  }
  // Nothing of the batch was stored. Each store is tried again on its own,
  // so that one the database refuses fails alone.
  for (size_t i = 0; i < waiting.size(); ++i) {
    auto one = batch.size() == 1
                 ? std::move(ids)
                 : st.conn->writer->store_all({std::move(batch[i])});
    if (one)
      waiting[i].deliver(one->front());
    else
      waiting[i].deliver(one.error());
  }
}

// After answering a retrieval under load an actor polls its mailbox for up
// to `linger` before its thread sleeps, yielding the core to any thread
// that wants it meanwhile: the next retrieval arrives within
// microseconds, and waking a sleeping thread costs more than that
// (docs/memory.md, "Readers and the writer"). Under load means that a
// retrieval was waiting when one was answered, or arrived during the last
// linger; a lone caller's retrievals never find one, and the actor does
// not linger for them (the polling would take a core from the caller's
// own next steps).
void linger(memory_pointer self) {
  auto& st = self->state;
  if (!self->mailbox().empty()) {
    st.loaded = true;
    return;
  }
  if (!st.loaded || st.linger.count() <= 0)
    return;
  auto deadline = std::chrono::steady_clock::now() + st.linger;
  while (self->mailbox().empty()
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  st.loaded = !self->mailbox().empty();
}

memory_server_actor::behavior_type
memory_server(memory_pointer self, std::shared_ptr<memory_connection> conn,
              std::chrono::microseconds linger_time,
              std::shared_ptr<reader_loads> loads, size_t index) {
  self->state.conn = std::move(conn);
  self->state.linger = linger_time;
  self->state.loads = std::move(loads);
  self->state.index = index;
  // Stores already queued are committed and answered before it stops.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    flush_stores(self);
    self->quit(msg.reason);
  });
  return {
    [self](caf::put_atom, memory_atom, const std::string& content,
           const std::vector<std::string>& tags) -> caf::result<int64_t> {
      auto& st = self->state;
      if (!st.conn->writer)
        return make_error(errc::unavailable,
                          "this memory connection only reads");
      auto scope = parse_memory_tags(tags);
      if (!scope)
        return scope.error();
      memory_entry entry{content, std::move(*scope)};
      if (auto err = st.conn->writer->accepts(entry))
        return err;
      auto rp = self->make_response_promise<int64_t>();
      st.batch.push_back(std::move(entry));
      st.waiting.push_back(rp);
      if (st.batch.size() >= max_batch) {
        flush_stores(self);
      } else if (!st.flush_scheduled) {
        st.flush_scheduled = true;
        self->send(self, flush_atom::value);
      }
      return rp;
    },
    [self](flush_atom) {
      self->state.flush_scheduled = false;
      flush_stores(self);
    },
    [self](caf::get_atom, memory_atom,
           const memory_list_request& r) -> caf::result<memory_listing> {
      flush_stores(self); // in-memory: the stores before it are listed
      auto got = [&] {
        std::lock_guard<std::mutex> guard{self->state.conn->lock};
        return self->state.conn->reader->list(r);
      }();
      if (auto& picture = self->state.loads)
        picture->pending[self->state.index].fetch_sub(
          1, std::memory_order_relaxed);
      if (!got)
        return std::move(got.error());
      return std::move(*got);
    },
    [self](caf::delete_atom, memory_atom, const std::string& user_id,
           const std::string& thread_id) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (!st.conn->writer)
        return make_error(errc::unavailable,
                          "this memory connection only reads");
      if (user_id.empty() && thread_id.empty())
        return make_error(errc::invalid_argument,
                          "user_id or thread_id is required");
      if (!user_id.empty())
        if (auto err = validate_user_id(user_id))
          return err;
      if (!thread_id.empty())
        if (auto err = validate_thread_id(thread_id))
          return err;
      // The stores sent before it are committed first.
      flush_stores(self);
      auto n = st.conn->writer->delete_scope(user_id, thread_id);
      if (!n)
        return std::move(n.error());
      return *n;
    },
    [self](caf::delete_atom, memory_atom, const std::string& prefix,
           bool dry_run) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (!st.conn->writer)
        return make_error(errc::unavailable,
                          "this memory connection only reads");
      if (prefix.size() < 2 || prefix.back() != tenant_separator
          || !valid_tenant_id(
            std::string_view{prefix}.substr(0, prefix.size() - 1)))
        return make_error(errc::invalid_argument,
                          "a tenant's prefix is its ID and '~'");
      flush_stores(self);
      auto scopes = st.conn->writer->tenant_scopes(prefix);
      if (!scopes)
        return std::move(scopes.error());
      if (dry_run)
        return static_cast<uint64_t>(scopes->size());
      uint64_t deleted = 0;
      for (auto& [user, thread] : *scopes) {
        auto n = st.conn->writer->delete_scope(user, thread);
        if (!n)
          return std::move(n.error());
        deleted += *n;
      }
      return deleted;
    },
    [self](caf::delete_atom, memory_atom, int64_t id,
           const std::string& tenant) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (!st.conn->writer)
        return make_error(errc::unavailable,
                          "this memory connection only reads");
      flush_stores(self);
      auto n = st.conn->writer->delete_entry(id, tenant);
      if (!n)
        return std::move(n.error());
      return *n;
    },
    [self](caf::get_atom, memory_atom,
           const memory_query& q) -> caf::result<memory_snippet> {
      // A retrieval sees every store that arrived before it (the
      // in-memory actor serves both).
      flush_stores(self);
      // Answered before the linger, not after it.
      auto rp = self->make_response_promise<memory_snippet>();
      auto got = [&] {
        std::lock_guard<std::mutex> guard{self->state.conn->lock};
        return self->state.conn->reader->retrieve(q);
      }();
      if (got)
        rp.deliver(std::move(*got));
      else
        rp.deliver(std::move(got.error()));
      if (auto& picture = self->state.loads)
        picture->pending[self->state.index].fetch_sub(
          1, std::memory_order_relaxed);
      linger(self);
      return rp;
    },
  };
}

// Opens the connection of one memory actor: to memory.db, or with a
// PostgreSQL store to its database, where the writer's connection brings
// the schema to this build's first (each reader has a connection of its
// own there too).
caf::expected<std::shared_ptr<memory_connection>>
connect(const storage_options& options, bool writes,
        const std::shared_ptr<memory_changes>& changes,
        const std::shared_ptr<const token_counter>& tokens) {
  auto conn = std::make_shared<memory_connection>();
  if (options.on_postgres()) {
    auto pg = open_postgres(options.store, writes);
    if (!pg)
      return pg.error();
    conn->pg = std::move(*pg);
  } else {
    auto db = database::open(memory_database_path(options), options.sync);
    if (!db)
      return db.error();
    if (!options.files_in_memory()) {
      // A reader never writes; mapping the file spares it a read() per
      // page it does not have cached.
      auto settings = writes ? "PRAGMA mmap_size = 268435456;"
                             : "PRAGMA query_only = 1;"
                               "PRAGMA mmap_size = 268435456;";
      if (auto err = (*db)->exec(settings))
        return err;
    }
    conn->db = std::move(*db);
  }
  if (writes) {
    auto writer = conn->pg ? memory_writer::open(*conn->pg, changes)
                           : memory_writer::open(*conn->db, changes);
    if (!writer)
      return writer.error();
    conn->writer = std::move(*writer);
  }
  auto reader = conn->pg ? memory_reader::open(*conn->pg, changes)
                         : memory_reader::open(*conn->db, changes);
  if (!reader)
    return reader.error();
  (*reader)->count_tokens(tokens);
  conn->reader = std::move(*reader);
  return conn;
}

// Routes stores to the writer and retrievals to a reader, inside the
// sender's enqueue (no extra hop). A retrieval goes to the reader that had
// the last one if it has nothing left to answer (it is lingering, or just
// fell asleep: a lone caller keeps one reader awake instead of waking each
// in turn), else to the reader with the fewest unanswered retrievals.
struct memory_routing {
  caf::actor writer;
  std::vector<caf::actor> readers;
  std::shared_ptr<reader_loads> loads;

  size_t pick() {
    auto& pending = loads->pending;
    auto last = loads->last.load(std::memory_order_relaxed);
    auto chosen = last;
    if (pending[last].load(std::memory_order_relaxed) > 0) {
      auto least = std::numeric_limits<uint32_t>::max();
      for (size_t k = 1; k <= loads->size && least > 0; ++k) {
        auto i = (last + k) % loads->size;
        auto n = pending[i].load(std::memory_order_relaxed);
        if (n < least) {
          least = n;
          chosen = i;
        }
      }
    }
    pending[chosen].fetch_add(1, std::memory_order_relaxed);
    loads->last.store(chosen, std::memory_order_relaxed);
    return chosen;
  }

  void operator()(caf::actor_system&, caf::actor_pool::uplock& guard,
                  const caf::actor_pool::actor_vec&,
                  caf::mailbox_element_ptr& ptr, caf::execution_unit* host) {
    auto& content = ptr->content();
    // Stores and deletions go to the writer, reads to a reader.
    bool store = content.match_element<caf::atom_value>(0)
                 && (content.get_as<caf::atom_value>(0)
                       == caf::put_atom::value
                     || content.get_as<caf::atom_value>(0)
                          == caf::delete_atom::value);
    auto target = store ? writer : readers[pick()];
    guard.unlock();
    // A reader that died is avoided from then on: its count of
    // unanswered retrievals only grows.
    target->enqueue(std::move(ptr), host);
  }
};

// Answers a retrieval from what a reader keeps, on the caller's thread:
// each reader that is free (its lock taken at the first try) is asked in
// turn, starting from one of the caller's own so that callers on
// different threads do not all try the same reader first. A reader that
// would have to read the database says so and the next is asked; none
// that keeps everything the retrieval needs leaves it to the actors,
// whose reader then keeps it for the next time.
struct kept_retrieval {
  std::vector<std::shared_ptr<memory_connection>> readers;

  std::optional<caf::expected<memory_snippet>>
  operator()(const memory_query& q) const {
    static std::atomic<size_t> next_home{0};
    thread_local size_t home = next_home.fetch_add(1,
                                                   std::memory_order_relaxed);
    auto n = readers.size();
    for (size_t k = 0; k < n; ++k) {
      auto at = (home + k) % n;
      auto& conn = *readers[at];
      std::unique_lock<std::mutex> guard{conn.lock, std::try_to_lock};
      if (!guard.owns_lock())
        continue;
      if (auto got = conn.reader->retrieve_kept(q)) {
        // Each reader keeps what its own actor's retrievals read: the one
        // that answered is the one likely to keep this thread's next.
        home = at;
        return got;
      }
    }
    return std::nullopt;
  }
};

// Entries an older build kept in spindle.db (before memory had a file of
// its own) move to memory.db once: copied with their IDs in one
// transaction with a mark that says so, so that a crash midway copies
// them again and a later start copies nothing. The index of the copies is
// built by the writer's catch_up. The old tables stay in spindle.db,
// unread.
caf::error adopt_old_entries(database& db, const storage_options& options) {
  constexpr std::string_view mark = "memory.db:adopted";
  auto old = database_path(options);
  std::error_code ec;
  if (!std::filesystem::exists(old, ec))
    return caf::none;
  auto count = [&](const std::string& sql) -> caf::expected<int64_t> {
    auto stmt = db.prepare(sql);
    if (!stmt)
      return stmt.error();
    auto row = stmt->step();
    if (!row)
      return row.error();
    return *row ? stmt->column_int64(0) : 0;
  };
  // The mark lives in memory.db's copy of the counters table, which
  // nothing else uses there.
  auto done = count("SELECT count(*) FROM counters WHERE key = '"
                    + std::string{mark} + "';");
  if (!done)
    return done.error();
  if (*done > 0)
    return caf::none;
  {
    auto attach = db.prepare("ATTACH DATABASE ?1 AS old;");
    if (!attach)
      return attach.error();
    attach->bind(1, std::string_view{old});
    if (auto err = attach->run())
      return err;
  }
  auto has_table = count("SELECT count(*) FROM old.sqlite_master "
                         "WHERE type = 'table' AND name = 'memories';");
  caf::error err = has_table ? caf::error{} : has_table.error();
  if (!err) {
    std::string copy
      = *has_table > 0
          ? "INSERT OR IGNORE INTO memories(id, user_id, thread_id, content, "
            "created_ms) SELECT id, user_id, thread_id, content, created_ms "
            "FROM old.memories;"
          : "";
    err = db.exec("BEGIN IMMEDIATE;" + copy
                  + "INSERT INTO counters(key, high_water) VALUES('"
                  + std::string{mark} + "', 1);COMMIT;");
    if (err)
      db.exec("ROLLBACK;");
  }
  db.exec("DETACH DATABASE old;");
  if (err)
    return make_error(errc::storage_failure,
                      "cannot move the memories of '" + old + "' to '"
                        + db.path() + "': " + describe(err));
  return caf::none;
}

} // namespace

caf::expected<memory_service> spawn_memory(caf::actor_system& sys,
                                           const storage_options& options,
                                           const memory_options& serving) {
  if (!options.on_postgres())
    if (auto err = create_data_dir(options))
      return err;
  // The writer tells the readers which scopes changed, so they keep what
  // they read of the others.
  auto changes = std::make_shared<memory_changes>();
  auto writing = connect(options, true, changes, serving.tokens);
  if (!writing)
    return writing.error();
  // On PostgreSQL other processes may store into the same database: their
  // writers' notes raise this process's counters too. It listens before
  // any reader reads.
  std::shared_ptr<memory_listener> listener;
  if (options.on_postgres()) {
    auto started = memory_listener::start(options.store, changes);
    if (!started)
      return started.error();
    listener = std::move(*started);
    (*writing)->listener = listener;
  }
  if (!options.on_postgres() && !options.files_in_memory())
    if (auto err = adopt_old_entries(*(*writing)->db, options))
      return err;
  // Entries stored before the index existed (an upgraded database).
  if (auto indexed = (*writing)->writer->catch_up(); !indexed)
    return indexed.error();
  if (!options.on_postgres() && options.files_in_memory()) {
    // A private ":memory:" database lives in its one connection: one actor
    // serves stores and retrievals in turn.
    return memory_service{sys.spawn<caf::detached>(memory_server,
                                                   std::move(*writing),
                                                   serving.linger, nullptr,
                                                   size_t{0}),
                          nullptr};
  }
  auto readers = serving.readers;
  if (readers == 0)
    readers = std::max<size_t>(1, std::thread::hardware_concurrency());
  std::vector<std::shared_ptr<memory_connection>> reading;
  for (size_t i = 0; i < readers; ++i) {
    auto conn = connect(options, false, changes, serving.tokens);
    if (!conn)
      return conn.error();
    (*conn)->listener = listener;
    reading.push_back(std::move(*conn));
  }
  // The writer does not linger: stores come one per exchange.
  auto writer = caf::actor_cast<caf::actor>(
    sys.spawn<caf::detached>(memory_server, std::move(*writing),
                             std::chrono::microseconds{0}, nullptr,
                             size_t{0}));
  auto loads = std::make_shared<reader_loads>(readers);
  std::vector<caf::actor> reader_handles;
  for (size_t i = 0; i < readers; ++i)
    reader_handles.push_back(caf::actor_cast<caf::actor>(
      sys.spawn<caf::detached>(memory_server, reading[i], serving.linger,
                               loads, i)));
  // The pool's workers: the writer, then the readers; an exit sent to the
  // pool reaches all of them.
  size_t next = 0;
  auto workers = [&]() -> caf::actor {
    auto i = next++;
    return i == 0 ? writer : reader_handles[i - 1];
  };
  auto pool = caf::actor_pool::make(sys.dummy_execution_unit(), readers + 1,
                                    workers,
                                    memory_routing{writer, reader_handles,
                                                   loads});
  return memory_service{caf::actor_cast<memory_actor>(pool),
                        kept_retrieval{std::move(reading)}};
}

} // namespace spindle
