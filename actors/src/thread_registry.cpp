#include "spindle/actors/thread_registry.hpp"

#include <algorithm>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/thread.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

thread_actor spawn_thread(thread_registry_pointer self, const std::string& id,
                          std::vector<turn> initial) {
  auto handle = self->spawn<caf::linked + caf::lazy_init>(conversation_thread,
                                                          id,
                                                          std::move(initial));
  self->state.threads.emplace(id, handle);
  return handle;
}

std::string fresh_id(thread_registry_pointer self) {
  for (;;) {
    auto id = make_uuid_v4();
    if (self->state.threads.count(id) == 0)
      return id;
  }
}

} // namespace

thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self,
                thread_registry_options options) {
  self->state.options = options;
  self->set_exit_handler([self](caf::exit_msg& em) {
    auto& threads = self->state.threads;
    auto i = std::find_if(threads.begin(), threads.end(), [&](auto& kvp) {
      return kvp.second.address() == em.source;
    });
    if (i == threads.end()) {
      self->quit(em.reason); // the runtime stops us; our threads follow
      return;
    }
    spdlog::error("thread '{}' (actor {}) failed: {}; it is dropped",
                  i->first, i->second.id(), caf::to_string(em.reason));
    threads.erase(i);
  });
  return {
    [self](caf::get_atom, const std::string& id) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(id))
        return err;
      auto i = self->state.threads.find(id);
      if (i == self->state.threads.end())
        return thread_ref{id, {}, false, false, {}};
      return thread_ref{id, i->second, true, false, {}};
    },
    [self](caf::put_atom, const std::string& id) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(id))
        return err;
      if (id == "new") {
        auto fresh = fresh_id(self);
        return thread_ref{fresh, spawn_thread(self, fresh, {}), false, true,
                          {}};
      }
      auto i = self->state.threads.find(id);
      if (i != self->state.threads.end())
        return thread_ref{id, i->second, true, false, {}};
      return thread_ref{id, spawn_thread(self, id, {}), false, true, {}};
    },
    [self](fork_atom, const std::string& source) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(source))
        return err;
      auto i = self->state.threads.find(source);
      if (i == self->state.threads.end())
        return make_error(errc::not_found,
                          "thread '" + source + "' does not exist");
      auto rp = self->make_response_promise<thread_ref>();
      self
        ->request(i->second, self->state.options.snapshot_timeout,
                  caf::get_atom::value, thread_snapshot_atom::value)
        .then(
          [self, rp, source](thread_snapshot& snap) mutable {
            // Copy the completed exchanges only: a running exchange's user
            // turn stays with the original.
            auto n = std::min<uint64_t>(snap.committed, snap.turns.size());
            snap.turns.resize(static_cast<size_t>(n));
            auto id = fresh_id(self);
            auto handle = spawn_thread(self, id, std::move(snap.turns));
            rp.deliver(thread_ref{id, handle, false, true, source});
          },
          [rp, source](caf::error& err) mutable {
            rp.deliver(make_error(classify(err),
                                  "cannot fork thread '" + source
                                    + "': " + describe(err)));
          });
      return rp;
    },
    [self](caf::add_atom, const std::string& id,
           turn& t) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      if (id == "new")
        return make_error(errc::invalid_id,
                          "thread_id 'new' names no thread: create one with "
                          "get_or_create or send a message to 'new'");
      if (auto err = validate_turn(t))
        return err; // an invalid turn creates no thread
      auto i = self->state.threads.find(id);
      auto handle = i != self->state.threads.end()
                      ? i->second
                      : spawn_thread(self, id, {});
      return self->delegate(handle, caf::add_atom::value, std::move(t));
    },
    [self](caf::get_atom, history_atom, const std::string& id,
           uint64_t max_turns) -> caf::result<history_window> {
      if (auto err = validate_thread_id(id))
        return err;
      if (auto err = validate_max_turns(max_turns))
        return err;
      auto i = self->state.threads.find(id);
      if (i == self->state.threads.end())
        return history_window{};
      return self->delegate(i->second, caf::get_atom::value,
                            history_atom::value, max_turns);
    },
    [self](caf::get_atom, thread_snapshot_atom,
           const std::string& id) -> caf::result<thread_snapshot> {
      if (auto err = validate_thread_id(id))
        return err;
      auto i = self->state.threads.find(id);
      if (i == self->state.threads.end())
        return make_error(errc::not_found,
                          "thread '" + id + "' does not exist");
      return self->delegate(i->second, caf::get_atom::value,
                            thread_snapshot_atom::value);
    },
    [self](caf::reset_atom, const std::string& id) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      auto i = self->state.threads.find(id);
      if (i == self->state.threads.end())
        return make_error(errc::not_found,
                          "thread '" + id + "' does not exist");
      return self->delegate(i->second, caf::reset_atom::value);
    },
    [self](caf::get_atom, thread_list_atom) -> std::vector<std::string> {
      std::vector<std::string> ids;
      ids.reserve(self->state.threads.size());
      for (auto& kvp : self->state.threads)
        ids.push_back(kvp.first);
      std::sort(ids.begin(), ids.end());
      return ids;
    },
    [self](caf::get_atom, thread_count_atom) -> uint64_t {
      return self->state.threads.size();
    },
  };
}

} // namespace spindle
