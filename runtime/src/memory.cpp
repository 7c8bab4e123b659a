#include "spindle/runtime/memory.hpp"

#include <chrono>
#include <filesystem>
#include <system_error>

#include <caf/all.hpp>
#include <sqlite3.h>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/database.hpp"

namespace spindle {

namespace {

// Candidates read per retrieval: more than any 2000-character snippet can
// hold, so the budget, not this limit, decides what is shown.
constexpr int64_t max_candidates = 64;

struct memory_state {
  static inline const char* name = "spindle.memory";
  std::unique_ptr<database> db;
  statement insert;
  statement by_user;
  statement by_thread;
  caf::error broken; // set when a statement could not be prepared
};

caf::error prepare(memory_state& st, statement& out, std::string_view sql) {
  auto stmt = st.db->prepare(sql);
  if (!stmt)
    return stmt.error();
  out = std::move(*stmt);
  return caf::none;
}

memory_actor::behavior_type
memory(memory_actor::stateful_pointer<memory_state> self,
       std::shared_ptr<std::unique_ptr<database>> db) {
  auto& st = self->state;
  st.db = std::move(*db);
  auto failed = prepare(st, st.insert,
                     "INSERT INTO memories(user_id, thread_id, scope, "
                     "content, created_ms) VALUES(?1, ?2, ?3, ?4, ?5);");
  if (!failed)
    failed = prepare(st, st.by_user,
                  "SELECT m.content FROM memories_fts JOIN memories m "
                  "ON m.id = memories_fts.rowid "
                  "WHERE memories_fts MATCH ?1 AND m.user_id = ?2 "
                  "ORDER BY bm25(memories_fts, 1.0, 0.0), m.id DESC "
                  "LIMIT ?3;");
  if (!failed)
    failed = prepare(st, st.by_thread,
                  "SELECT m.content FROM memories_fts JOIN memories m "
                  "ON m.id = memories_fts.rowid "
                  "WHERE memories_fts MATCH ?1 AND m.user_id = '' "
                  "AND m.thread_id = ?2 "
                  "ORDER BY bm25(memories_fts, 1.0, 0.0), m.id DESC "
                  "LIMIT ?3;");
  st.broken = std::move(failed);
  return {
    [self](caf::put_atom, memory_atom, const std::string& content,
           const std::vector<std::string>& tags) -> caf::result<int64_t> {
      auto& s = self->state;
      if (s.broken)
        return s.broken;
      if (content.empty())
        return make_error(errc::invalid_argument,
                          "content of a memory must not be empty");
      if (content.size() > max_memory_content)
        return make_error(errc::too_large,
                          "content has " + std::to_string(content.size())
                            + " bytes; a memory holds at most "
                            + std::to_string(max_memory_content));
      auto scope = parse_memory_tags(tags);
      if (!scope)
        return scope.error();
      s.insert.bind(1, std::string_view{scope->user_id})
        .bind(2, std::string_view{scope->thread_id})
        .bind(3, memory_scope_token(scope->user_id, scope->thread_id))
        .bind(4, std::string_view{content})
        .bind(5, unix_time_ms());
      if (auto err = s.insert.run())
        return err;
      return static_cast<int64_t>(sqlite3_last_insert_rowid(s.db->handle()));
    },
    [self](caf::get_atom, memory_atom,
           const memory_query& q) -> caf::result<memory_snippet> {
      auto& s = self->state;
      if (s.broken)
        return s.broken;
      if (auto err = validate_memory_query(q))
        return err;
      auto terms = memory_match_expression(q.query);
      if (terms.empty() || q.max_chars == 0)
        return memory_snippet{};
      // Narrow to the requester's scope inside the index, then rank.
      auto match = "scope : \"" + memory_scope_token(q.user_id, q.thread_id)
                   + "\" AND content : (" + terms + ")";
      auto& stmt = q.user_id.empty() ? s.by_thread : s.by_user;
      stmt.bind(1, std::string_view{match});
      stmt.bind(2, std::string_view{q.user_id.empty() ? q.thread_id
                                                      : q.user_id});
      stmt.bind(3, max_candidates);
      std::vector<std::string> ranked;
      for (;;) {
        auto row = stmt.step();
        if (!row) {
          stmt.reset();
          return row.error();
        }
        if (!*row)
          break;
        ranked.push_back(stmt.column_text(0));
      }
      stmt.reset();
      return build_memory_snippet(ranked, static_cast<size_t>(q.max_chars));
    },
  };
}

} // namespace

caf::expected<memory_actor> spawn_memory(caf::actor_system& sys,
                                         const storage_options& options) {
  if (!options.in_memory()) {
    std::error_code ec;
    std::filesystem::create_directories(options.data_dir, ec);
    if (ec)
      return make_error(errc::storage_failure,
                        "cannot create data directory '" + options.data_dir
                          + "': " + ec.message());
  }
  auto db = database::open(database_path(options), options.sync);
  if (!db)
    return db.error();
  // The handle travels as a spawn argument; CAF copies arguments, so it is
  // wrapped in a shared_ptr and moved out once in the actor.
  auto shared = std::make_shared<std::unique_ptr<database>>(std::move(*db));
  return sys.spawn<caf::detached>(memory, std::move(shared));
}

} // namespace spindle
