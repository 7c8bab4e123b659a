#include "spindle/runtime/config.hpp"

#include <algorithm>
#include <thread>

#include <caf/all.hpp>

#include "core/actor_scheduler.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/type_ids.hpp"

namespace spindle {

config::config(size_t threads) {
  add_message_types<caf::id_block::spindle>();
  add_error_category(error_category,
                     [](uint8_t code, caf::atom_value,
                        const caf::message& context) -> std::string {
                       std::string text = to_string(static_cast<errc>(code));
                       if (context.match_elements<std::string>())
                         text += ": " + context.get_as<std::string>(0);
                       return text;
                     });
  // Work stealing in FIFO order with cheap request timeouts
  // (actor_scheduler.hpp).
  module_factories.push_back(&detail::make_actor_scheduler);
  // One worker per core, as documented: CAF 0.17's own default is at least
  // four, so on a two-core machine four workers and the event loops'
  // threads took turns on two cores.
  if (threads == 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  set("scheduler.max-threads", threads);
}

} // namespace spindle
