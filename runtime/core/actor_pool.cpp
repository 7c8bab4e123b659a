#include "spindle/runtime/actor_pool.hpp"

#include <chrono>
#include <vector>

#include <caf/all.hpp>

namespace spindle {

void stop_actor_pool(caf::actor_system& sys, const caf::actor& handle) {
  if (!handle)
    return;
  if (dynamic_cast<caf::actor_pool*>(
        caf::actor_cast<caf::abstract_actor*>(handle))
      == nullptr) {
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
    return;
  }
  std::vector<caf::actor> workers;
  {
    caf::scoped_actor self{sys};
    self
      ->request(handle, std::chrono::seconds{5}, caf::sys_atom::value,
                caf::get_atom::value)
      .receive([&](std::vector<caf::actor>& xs) { workers = std::move(xs); },
               [](caf::error&) {});
  }
  caf::anon_send(handle, caf::sys_atom::value, caf::delete_atom::value);
  for (auto& w : workers)
    caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
}

} // namespace spindle
