#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/runtime/conversation.hpp"
#include "spindle/runtime/flow.hpp"
#include "spindle/runtime/llm.hpp"
#include "admission/limiter.hpp"
#include "admission/upstream.hpp"

// The exchange's actor and what it talks to (docs/threads.md,
// "Exchanges"); the runtime starts exchanges through
// `runtime::start_exchange`.

namespace spindle {

class compactor;

/// What an exchange talks to.
struct exchange_services {
  thread_registry_actor registry;
  context_builder_actor builder;
  /// Invalid: no memory is stored.
  memory_actor memory;
  std::shared_ptr<llm_provider> provider;
  conversation_options options;
  /// When set, the exchange enters itself here while it runs, so that a
  /// stopping runtime can stop it.
  std::shared_ptr<class exchange_set> live;
  /// When set, an exchange asks it to fold the turns its prompt left out.
  std::shared_ptr<compactor> compaction;
  /// Counts a reply's tokens when the upstream reports no usage; null:
  /// usage is not counted.
  std::shared_ptr<const token_counter> tokens;
  /// Each tenant's limits on the model (docs/limits.md); null: none.
  std::shared_ptr<admission::limiter> limiter;
  /// The fair queue toward the provider; null: calls go at once.
  std::shared_ptr<admission::upstream_queue> upstream;
};

/// The exchanges running now: entered and left in O(1) (a link or a
/// monitor per exchange would make every exit scan all of them).
/// Thread-safe.
class exchange_set {
public:
  void enter(caf::actor x);
  void leave(caf::actor_id id);
  /// Stops every exchange still running (they report `unavailable`).
  void stop_all();
  /// How many exchanges run now.
  size_t running();

  /// The exchange that holds `thread_id` now (at most one: D9) and the
  /// control of its reply, entered when it holds the thread and left when
  /// it releases it.
  void hold(const std::string& thread_id, std::shared_ptr<flow_control> flow);
  void let_go(const std::string& thread_id, const flow_control* flow);
  /// Cancels the reply of the exchange holding `thread_id`: false when no
  /// exchange holds it, its reply ended (`settle`), or it was cancelled
  /// already.
  bool cancel(const std::string& thread_id);
  /// The reply of the exchange holding `thread_id` with `flow` ended: a
  /// later `cancel` finds none. True when it was cancelled before. One
  /// lock orders the two, so a cancel that answered true always ends its
  /// reply as cancelled.
  bool settle(const std::string& thread_id, const flow_control* flow);

private:
  std::mutex mx_;
  std::unordered_map<caf::actor_id, caf::actor> live_;
  std::unordered_map<std::string, std::shared_ptr<flow_control>> holding_;
};

/// Runs one exchange in its own event-based actor:
/// hold the thread (D9), build the prompt from the history read before the
/// message is stored, store the user turn, stream the reply through
/// `on_delta`, store the assistant turn (marked interrupted if `on_delta`
/// returned false), store the exchange in memory, release the thread.
/// `done` runs exactly once, on a runtime thread. Errors:
/// invalid_id, invalid_argument, too_large (before anything is created or
/// stored), conflict (`exit`), upstream_failure or timeout (the provider;
/// the user turn stays stored), timeout, unavailable.
void spawn_exchange(caf::actor_system& sys, const exchange_services& services,
                    exchange_request request, delta_callback on_delta,
                    exchange_done done);

/// As above, with every callback of `exchange_callbacks`. The exchange is
/// an event-based actor: no thread waits while the provider streams.
void spawn_exchange(caf::actor_system& sys, const exchange_services& services,
                    exchange_request request, exchange_callbacks callbacks);

} // namespace spindle
