#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace spindle {

/// Stops `handle` with `user_shutdown`: a `caf::actor_pool` (the builders
/// of a runtime, the readers and the writer of `spawn_memory`'s durable
/// memory) worker by worker, any other actor at once.
///
/// CAF 0.17.6's pool watches its workers, and when two of them go down at
/// once (as an exit sent to the pool makes them: it forwards the exit to
/// each) their down messages race inside the pool (`actor_pool::filter`
/// writes its planned exit reason while `quit` reads it, found by TSan
/// against an instrumented CAF). So the pool first stops watching its
/// workers and forgets them (`(sys, delete)`, handled inside the sender's
/// enqueue), then each worker and the pool get the exit. Blocks for the
/// pool's list of workers (at most 5 s).
void stop_actor_pool(caf::actor_system& sys, const caf::actor& handle);

} // namespace spindle
