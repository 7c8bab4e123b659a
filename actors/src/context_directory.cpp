#include "spindle/actors/context_directory.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/context_manager.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

using pointer = context_directory_pointer;

caf::result<context_manager_actor>
open(pointer self, const std::string& thread, const window_options& window) {
  if (auto err = validate_thread_id(thread))
    return err;
  auto& st = self->state;
  if (auto i = st.managers.find(thread); i != st.managers.end())
    return i->second;
  if (auto err = validate(window))
    return err;
  auto manager = self->spawn(
    context_manager, thread, context_manager_options{window,
                                                     st.options.request_timeout},
    st.ids, caf::actor_cast<context_directory_actor>(self));
  self->monitor(manager);
  st.managers.emplace(thread, manager);
  spdlog::debug("context '{}': manager created (capacity {}, token budget {})",
                thread, window.capacity, window.token_budget);
  return manager;
}

} // namespace

context_directory_actor::behavior_type
context_directory(context_directory_pointer self, id_allocator_actor ids,
                  context_directory_options options) {
  self->state.ids = std::move(ids);
  self->state.options = options;
  // A manager that fails takes its IDs out of the index with it.
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    for (auto i = st.managers.begin(); i != st.managers.end(); ++i) {
      if (caf::actor_cast<caf::actor_addr>(i->second) != msg.source)
        continue;
      auto thread = i->first;
      st.managers.erase(i);
      for (auto j = st.live.begin(); j != st.live.end();)
        j = j->second == thread ? st.live.erase(j) : std::next(j);
      spdlog::warn("context '{}': manager stopped: {}", thread,
                   describe(msg.reason));
      return;
    }
  });
  // Managers live as long as the directory: stopping it stops them.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    for (auto& [thread, manager] : self->state.managers)
      self->send_exit(manager, msg.reason);
    self->quit(msg.reason);
  });
  return {
    [self](caf::get_atom,
           const std::string& thread) -> caf::result<context_manager_actor> {
      if (auto err = validate_thread_id(thread))
        return err;
      auto& managers = self->state.managers;
      if (auto i = managers.find(thread); i != managers.end())
        return i->second;
      return make_error(errc::not_found,
                        "thread '" + thread + "' has no context window");
    },
    [self](ctx_open_atom,
           const std::string& thread) -> caf::result<context_manager_actor> {
      return open(self, thread, self->state.options.window);
    },
    [self](ctx_open_atom, const std::string& thread,
           const window_options& window)
      -> caf::result<context_manager_actor> {
      return open(self, thread, window);
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
      return {self->state.managers.size(), self->state.live.size()};
    },
  };
}

} // namespace spindle
