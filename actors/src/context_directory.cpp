#include "spindle/actors/context_directory.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/context_manager.hpp"
#include "spindle/actors/records.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

using pointer = context_directory_pointer;
using table = activation_table<context_manager_actor>;
using resolved = table::resolved;
using continuation = table::continuation;

caf::error store_error(const std::string& thread, const caf::error& err) {
  return make_storage_error(err, "context '" + thread
                                   + "' cannot be loaded or stored: "
                                   + describe(err));
}

context_manager_actor spawn_manager(pointer self, const std::string& thread,
                                    records::stored_window initial) {
  auto& st = self->state;
  // Its items are live again (D4).
  for (auto& item : initial.items)
    st.live.emplace(item.sequence(), thread);
  auto bounds = initial.bounds;
  auto manager = self->spawn(
    context_manager, thread,
    context_manager_options{bounds, st.options.request_timeout}, st.ids,
    caf::actor_cast<context_directory_actor>(self), std::move(initial),
    st.store);
  self->monitor(manager);
  return manager;
}

// A new window: stored first (with a store), then spawned.
void create(pointer self, const std::string& thread, continuation done) {
  auto& st = self->state;
  records::stored_window initial;
  if (auto i = st.bounds.find(thread); i != st.bounds.end()) {
    initial.bounds = i->second;
    st.bounds.erase(i);
  } else {
    initial.bounds = st.options.window;
  }
  spdlog::debug("context '{}': manager created (capacity {}, token budget {})",
                thread, initial.bounds.capacity, initial.bounds.token_budget);
  if (!st.store) {
    done(resolved{spawn_manager(self, thread, std::move(initial)), true});
    return;
  }
  self
    ->request(st.store, st.options.request_timeout, store_atom::value,
              sql_write{records::put_window(thread, initial.bounds, 0, 0, 0,
                                            0)})
    .then(
      [self, thread, initial, done](uint64_t) mutable {
        done(resolved{spawn_manager(self, thread, std::move(initial)), true});
      },
      [thread, done](caf::error& err) mutable {
        done(store_error(thread, err));
      });
}

// The activation table's load hook: the window row, then its items.
void load(pointer self, const std::string& thread, bool create_missing,
          continuation done) {
  auto& st = self->state;
  if (!st.store) {
    create(self, thread, std::move(done)); // only asked to create
    return;
  }
  auto timeout = st.options.request_timeout;
  self
    ->request(st.store, timeout, load_atom::value,
              records::load_window(thread))
    .then(
      [self, thread, create_missing, done, timeout](sql_rows& head) mutable {
        if (head.empty()) {
          if (create_missing)
            create(self, thread, std::move(done));
          else
            done(resolved{});
          return;
        }
        self
          ->request(self->state.store, timeout, load_atom::value,
                    records::load_window_items(thread))
          .then(
            [self, thread, head, done](sql_rows& items) mutable {
              auto stored = records::decode_window(head, items);
              if (!stored) {
                done(stored.error());
                return;
              }
              done(resolved{spawn_manager(self, thread, std::move(**stored)),
                            false});
            },
            [thread, done](caf::error& err) mutable {
              done(store_error(thread, err));
            });
      },
      [thread, done](caf::error& err) mutable {
        done(store_error(thread, err));
      });
}

void forget_ids(pointer self, const std::string& thread) {
  auto& live = self->state.live;
  for (auto j = live.begin(); j != live.end();)
    j = j->second == thread ? live.erase(j) : std::next(j);
}

// Resolves `thread`'s manager for a request: `not_found` when it has none
// and `create` is false.
caf::result<context_manager_actor> open(pointer self, const std::string& thread,
                                        bool create_missing) {
  if (auto err = validate_thread_id(thread))
    return err;
  auto rp = self->make_response_promise<context_manager_actor>();
  self->state.managers.resolve(
    thread, create_missing, [rp, thread](caf::expected<resolved> r) mutable {
      if (!r)
        rp.deliver(r.error());
      else if (!r->handle)
        rp.deliver(make_error(errc::not_found,
                              "thread '" + thread + "' has no context window"));
      else
        rp.deliver(r->handle);
    });
  return rp;
}

} // namespace

context_directory_actor::behavior_type
context_directory(context_directory_pointer self, id_allocator_actor ids,
                  context_directory_options options, storage_actor store) {
  auto& init = self->state;
  init.ids = std::move(ids);
  init.options = options;
  init.store = std::move(store);
  init.managers.init(
    static_cast<bool>(init.store), options.activation,
    {[self](const std::string& thread, bool create_missing,
            continuation done) {
       load(self, thread, create_missing, std::move(done));
     },
     [self](const context_manager_actor& manager,
            std::function<void(bool)> done) {
       self->request(manager, self->state.options.request_timeout,
                     passivate_atom::value)
         .then([done](bool stopped) { done(stopped); },
               [done](caf::error&) { done(true); });
     }});
  // A manager that stops (passivated or failed) takes its IDs out of the
  // index with it; a passivated window's IDs are in the store.
  self->set_down_handler([self](caf::down_msg& msg) {
    auto [was_resident, thread] = self->state.managers.down(msg.source);
    if (thread.empty())
      return;
    // A passivated manager released its IDs itself before it stopped.
    if (msg.reason && !self->state.managers.find(thread))
      forget_ids(self, thread);
    if (was_resident && msg.reason)
      spdlog::warn("context '{}': manager stopped: {}", thread,
                   describe(msg.reason));
  });
  // Managers live as long as the directory: stopping it stops them.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    self->state.managers.for_each_actor(
      [&](const std::string&, const context_manager_actor& manager) {
        self->send_exit(manager, msg.reason);
      });
    self->quit(msg.reason);
  });
  if (init.managers.durable() && options.activation.idle_timeout.count() > 0)
    self->delayed_send(self, init.managers.tick_interval(), tick_atom::value);
  return {
    [self](caf::get_atom,
           const std::string& thread) -> caf::result<context_manager_actor> {
      return open(self, thread, false);
    },
    [self](ctx_open_atom,
           const std::string& thread) -> caf::result<context_manager_actor> {
      return open(self, thread, true);
    },
    [self](ctx_open_atom, const std::string& thread,
           const window_options& window)
      -> caf::result<context_manager_actor> {
      if (auto err = validate_thread_id(thread))
        return err;
      if (auto err = validate(window))
        return err;
      if (!self->state.managers.find(thread))
        self->state.bounds[thread] = window; // used if this creates it
      return open(self, thread, true);
    },
    [self](ctx_claim_atom, uint64_t id,
           const std::string& thread) -> caf::result<uint64_t> {
      auto [i, added] = self->state.live.emplace(id, thread);
      if (!added)
        return make_error(errc::already_exists,
                          "id '" + format_context_id(id)
                            + "' is already in use in thread '" + i->second
                            + "'");
      return id;
    },
    [self](ctx_release_atom, const context_released& released) {
      auto& live = self->state.live;
      for (auto id : released.ids)
        if (auto i = live.find(id);
            i != live.end() && i->second == released.thread_id)
          live.erase(i);
    },
    [self](ctx_stats_atom) -> context_directory_stats {
      return {self->state.managers.resident(), self->state.live.size()};
    },
    [self](tick_atom) {
      auto& m = self->state.managers;
      m.passivate_idle();
      self->delayed_send(self, m.tick_interval(), tick_atom::value);
    },
  };
}

} // namespace spindle
