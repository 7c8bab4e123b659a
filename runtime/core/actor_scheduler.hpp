#pragma once

// The scheduler every spindle actor system runs (docs/architecture.md,
// "Threading"): CAF 0.17.6's work-stealing coordinator with three changes.
//
// 1. FIFO: a worker runs the jobs it scheduled itself in the order it
//    scheduled them. CAF's policy puts them at the front of its queue (LIFO),
//    which under load starves the oldest requests and stretches tail latency.
// 2. Parking: an idle worker spins briefly, then parks on a condition
//    variable; a job enqueued from outside the pool wakes its worker (or
//    any parked one), and a job a worker queues behind another wakes a
//    parked worker to steal it. CAF polls with 50 us sleeps for 25 ms and
//    then 10 ms sleeps, so work from outside the pool (replies of detached
//    actors such as the state store, requests of HTTP and client threads)
//    waited for the next poll, and every poll was a context switch.
// 3. Request timeouts: CAF's clock hands every timed request to its clock
//    thread through a locked ring buffer, waking that thread, and keeps a
//    heap event and two tree nodes per request until it is due (responses
//    do not cancel timeouts in CAF 0.17). Here a timed request is an append
//    to a sharded buffer under a short lock, and one timer thread fires
//    what is due every few milliseconds. As in CAF, a pending timeout keeps
//    its requester alive until the requester terminates. Other timers
//    (`after`, delayed sends) keep CAF's clock.

#include <chrono>

#include <caf/actor_system.hpp>

namespace spindle::detail {

/// How late a request timeout may fire: the timer thread's period.
constexpr std::chrono::milliseconds request_timer_resolution{5};

/// Module factory for `actor_system_config::module_factories`.
caf::actor_system::module* make_actor_scheduler(caf::actor_system& sys);

} // namespace spindle::detail
