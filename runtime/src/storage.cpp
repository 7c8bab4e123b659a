#include "spindle/runtime/storage.hpp"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <unordered_map>

#include <caf/all.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

struct memory_counter_state {
  static inline const char* name = "spindle.counter_store.memory";
  std::unordered_map<std::string, uint64_t> marks;
};

counter_store_actor::behavior_type memory_counter_store(
  counter_store_actor::stateful_pointer<memory_counter_state> self) {
  return {
    [self](load_atom, counter_atom, const std::string& key) -> uint64_t {
      auto i = self->state.marks.find(key);
      return i == self->state.marks.end() ? 0 : i->second;
    },
    [self](store_atom, counter_atom, const std::string& key,
           uint64_t mark) -> uint64_t {
      auto& stored = self->state.marks[key];
      stored = std::max(stored, mark);
      return stored;
    },
  };
}

struct sqlite_counter_state {
  static inline const char* name = "spindle.counter_store.sqlite";
  std::shared_ptr<database> db;
  statement load;
  statement store;
};

counter_store_actor::behavior_type sqlite_counter_store(
  counter_store_actor::stateful_pointer<sqlite_counter_state> self,
  std::shared_ptr<database> db) {
  auto& st = self->state;
  st.db = std::move(db);
  // Statements are prepared once; a failure here surfaces on first use.
  if (auto s = st.db->prepare("SELECT high_water FROM counters WHERE key=?1;"))
    st.load = std::move(*s);
  if (auto s = st.db->prepare(
        "INSERT INTO counters(key, high_water) VALUES(?1, ?2) "
        "ON CONFLICT(key) DO UPDATE SET high_water = "
        "max(high_water, excluded.high_water);"))
    st.store = std::move(*s);
  return {
    [self](load_atom, counter_atom,
           const std::string& key) -> caf::result<uint64_t> {
      auto& stmt = self->state.load;
      stmt.bind(1, key);
      auto row = stmt.step();
      uint64_t mark = 0;
      if (row && *row)
        mark = static_cast<uint64_t>(stmt.column_int64(0));
      stmt.reset();
      if (!row)
        return row.error();
      return mark;
    },
    [self](store_atom, counter_atom, const std::string& key,
           uint64_t mark) -> caf::result<uint64_t> {
      auto& stmt = self->state.store;
      stmt.bind(1, key).bind(2, static_cast<int64_t>(mark));
      if (auto err = stmt.run())
        return err;
      return mark;
    },
  };
}

} // namespace

std::string database_path(const storage_options& options) {
  if (options.in_memory())
    return ":memory:";
  return (std::filesystem::path{options.data_dir} / "spindle.db").string();
}

caf::expected<counter_store_actor>
spawn_counter_store(caf::actor_system& sys, const storage_options& options) {
  if (options.in_memory())
    return sys.spawn(memory_counter_store);
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec)
    return make_error(errc::storage_failure,
                      "cannot create data directory '" + options.data_dir
                        + "': " + ec.message());
  auto db = database::open(database_path(options), options.sync);
  if (!db)
    return db.error();
  std::shared_ptr<database> shared{std::move(*db)};
  return sys.spawn<caf::detached>(sqlite_counter_store, std::move(shared));
}

} // namespace spindle
