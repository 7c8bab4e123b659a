#include "spindle/runtime/memory.hpp"

#include <atomic>
#include <chrono>
#include <thread>

#include <caf/all.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

// What one memory actor serves with: its own connection, a writer if it
// serves stores, a reader for retrievals.
struct memory_connection {
  std::unique_ptr<database> db;
  std::unique_ptr<memory_writer> writer;
  std::unique_ptr<memory_reader> reader;
};

struct memory_state {
  static inline const char* name = "spindle.memory";
  memory_connection conn;
  std::chrono::microseconds linger{0};
};

using memory_pointer = memory_actor::stateful_pointer<memory_state>;

// After answering a retrieval an actor polls its mailbox for up to
// `linger` before its thread sleeps, yielding the core to any thread that
// wants it meanwhile: under load the next retrieval arrives within
// microseconds, and waking a sleeping thread costs more than that
// (docs/memory.md, "Readers and the writer").
void linger(memory_pointer self) {
  auto& st = self->state;
  if (st.linger.count() <= 0)
    return;
  auto deadline = std::chrono::steady_clock::now() + st.linger;
  while (self->mailbox().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
}

memory_actor::behavior_type
memory_server(memory_pointer self, std::shared_ptr<memory_connection> conn,
              std::chrono::microseconds linger_time) {
  // CAF copies spawn arguments: the connection travels in a shared_ptr and
  // is moved out once here.
  self->state.conn = std::move(*conn);
  self->state.linger = linger_time;
  return {
    [self](caf::put_atom, memory_atom, const std::string& content,
           const std::vector<std::string>& tags) -> caf::result<int64_t> {
      auto& writer = self->state.conn.writer;
      if (!writer)
        return make_error(errc::unavailable,
                          "this memory connection only reads");
      return writer->store(content, tags);
    },
    [self](caf::get_atom, memory_atom,
           const memory_query& q) -> caf::result<memory_snippet> {
      // Answered before the linger, not after it.
      auto rp = self->make_response_promise<memory_snippet>();
      auto got = self->state.conn.reader->retrieve(q);
      if (got)
        rp.deliver(std::move(*got));
      else
        rp.deliver(std::move(got.error()));
      linger(self);
      return rp;
    },
  };
}

caf::expected<std::shared_ptr<memory_connection>>
connect(const storage_options& options, bool writes,
        const std::shared_ptr<memory_changes>& changes) {
  auto db = database::open(database_path(options), options.sync);
  if (!db)
    return db.error();
  if (!options.in_memory()) {
    // A reader never writes; mapping the file spares it a read() per page
    // it does not have cached.
    auto settings = writes ? "PRAGMA mmap_size = 268435456;"
                           : "PRAGMA query_only = 1;"
                             "PRAGMA mmap_size = 268435456;";
    if (auto err = (*db)->exec(settings))
      return err;
  }
  auto conn = std::make_shared<memory_connection>();
  conn->db = std::move(*db);
  if (writes) {
    auto writer = memory_writer::open(*conn->db, changes);
    if (!writer)
      return writer.error();
    conn->writer = std::move(*writer);
  }
  auto reader = memory_reader::open(*conn->db, changes);
  if (!reader)
    return reader.error();
  conn->reader = std::move(*reader);
  return conn;
}

// Routes stores to the writer and retrievals to the readers in turn, inside
// the sender's enqueue (no extra hop). Retrievals go to the writer only
// when no reader is left.
struct memory_routing {
  caf::actor writer;
  std::shared_ptr<std::atomic<size_t>> next
    = std::make_shared<std::atomic<size_t>>(0);

  void operator()(caf::actor_system&, caf::actor_pool::uplock& guard,
                  const caf::actor_pool::actor_vec& workers,
                  caf::mailbox_element_ptr& ptr, caf::execution_unit* host) {
    auto& content = ptr->content();
    bool store = content.match_element<caf::atom_value>(0)
                 && content.get_as<caf::atom_value>(0)
                      == caf::put_atom::value;
    caf::actor target;
    for (size_t tries = 0; !store && !target && tries < workers.size();
         ++tries) {
      auto& worker = workers[next->fetch_add(1, std::memory_order_relaxed)
                             % workers.size()];
      if (worker != writer)
        target = worker;
    }
    if (!target)
      target = writer;
    guard.unlock();
    target->enqueue(std::move(ptr), host);
  }
};

} // namespace

caf::expected<memory_actor> spawn_memory(caf::actor_system& sys,
                                         const storage_options& options,
                                         const memory_options& serving) {
  if (auto err = create_data_dir(options))
    return err;
  // The writer tells the readers which scopes changed, so they keep what
  // they read of the others.
  auto changes = std::make_shared<memory_changes>();
  auto writing = connect(options, true, changes);
  if (!writing)
    return writing.error();
  // Entries stored before the index existed (an upgraded database).
  if (auto indexed = (*writing)->writer->catch_up(); !indexed)
    return indexed.error();
  if (options.in_memory()) {
    // A private ":memory:" database lives in its one connection: one actor
    // serves stores and retrievals in turn.
    return sys.spawn<caf::detached>(memory_server, std::move(*writing),
                                    serving.linger);
  }
  auto readers = serving.readers;
  if (readers == 0)
    readers = std::max<size_t>(1, std::thread::hardware_concurrency());
  std::vector<std::shared_ptr<memory_connection>> reading;
  for (size_t i = 0; i < readers; ++i) {
    auto conn = connect(options, false, changes);
    if (!conn)
      return conn.error();
    reading.push_back(std::move(*conn));
  }
  // The writer does not linger: stores come one per exchange.
  auto writer = caf::actor_cast<caf::actor>(
    sys.spawn<caf::detached>(memory_server, std::move(*writing),
                             std::chrono::microseconds{0}));
  // The pool's workers: the writer first, then the readers; an exit sent
  // to the pool reaches all of them.
  size_t spawned = 0;
  auto make_worker = [&]() -> caf::actor {
    if (spawned++ == 0)
      return writer;
    return caf::actor_cast<caf::actor>(
      sys.spawn<caf::detached>(memory_server, reading[spawned - 2],
                               serving.linger));
  };
  auto pool = caf::actor_pool::make(sys.dummy_execution_unit(), readers + 1,
                                    make_worker, memory_routing{writer});
  return caf::actor_cast<memory_actor>(pool);
}

} // namespace spindle
