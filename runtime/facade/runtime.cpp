#include "spindle/runtime/runtime.hpp"

#include <caf/all.hpp>

#include <spdlog/spdlog.h>

#include "spindle/actors/context_directory.hpp"
#include "spindle/actors/event_log.hpp"
#include "spindle/actors/fenced_store.hpp"
#include "spindle/actors/id_allocator.hpp"
#include "spindle/actors/scheduler.hpp"
#include "spindle/actors/task_records.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/actor_pool.hpp"
#include "spindle/runtime/cluster.hpp"
#include "storage/state_store.hpp"
#include "admission/upstream.hpp"
#include "conversation/compaction.hpp"
#include "conversation/exchange.hpp"

namespace spindle {

startup_error::startup_error(caf::error err)
  : std::runtime_error("spindle cannot start: " + describe(err)),
    err_(std::move(err)) {
}

runtime::runtime(runtime_options options, no_start_t)
  : options_(std::move(options)),
    config_(std::make_unique<config>(options_.scheduler_threads)),
    system_(std::make_unique<caf::actor_system>(*config_)),
    storage_counters_(std::make_shared<storage_counters>()),
    // Unbounded until set_upstream_limits: the upstream's gate alone.
    upstream_(admission::upstream_queue::make({}, {})) {
}

storage_stats runtime::store_stats() const noexcept {
  return storage_counters_->read();
}

runtime::runtime(runtime_options options)
  : runtime(std::move(options), no_start_t{}) {
  if (auto err = start_core()) {
    stop();
    throw startup_error(std::move(err));
  }
}

caf::expected<std::unique_ptr<runtime>> runtime::start(runtime_options options) {
  std::unique_ptr<runtime> rt{new runtime(std::move(options), no_start_t{})};
  if (auto err = rt->start_core()) {
    rt->stop();
    return err;
  }
  return rt;
}

caf::error runtime::start_core() {
  event_log::options event_options;
  event_options.capacity = options_.event_backlog;
  events_ = std::make_shared<event_log>(event_options);
  auto store = spawn_counter_store(*system_, options_.storage);
  if (!store)
    return store.error();
  counter_store_ = *store;
  auto state_store = spawn_state_store(*system_, options_.storage,
                                       storage_counters_);
  if (!state_store)
    return state_store.error();
  state_store_ = *state_store;
  id_allocator_ = system_->spawn(
    spindle::id_allocator, counter_store_,
    options_.ids.for_store(options_.storage.on_postgres()));
  // -- cluster: after the stores (they migrate the schema) --
  if (!options_.cluster.node_name.empty()) {
    if (!options_.storage.on_postgres())
      return make_error(errc::invalid_argument,
                        "a cluster node keeps its state in PostgreSQL: give "
                        "a PostgreSQL store with the node name");
    auto joined = cluster_membership::join(options_.storage.store,
                                           options_.cluster);
    if (!joined)
      return joined.error();
    cluster_ = std::move(*joined);
  }
  // -- context items (spawn here) --
  if (auto err = validate(options_.context.window))
    return err; // "capacity must be at least 1, got 0"
  context_directory_ = system_->spawn(spindle::context_directory,
                                      id_allocator_, options_.context,
                                      state_store_);
  // -- threads, memory, builder (spawn here) --
  if (auto err = start_threads())
    return err;
  // -- orchestration (spawn here) --
  if (auto err = start_orchestration())
    return err;
  running_ = true;
  // The other tenants' orchestrations load behind their schedulers, where
  // the default tenant's scheduler runs.
  if (scheduler()) {
    start_tenant_schedulers(true);
    caf::logger::set_current_actor_system(nullptr);
  }
  return caf::none;
}

scheduler_actor runtime::spawn_scheduler(uint64_t epoch,
                                         const std::string& tenant) {
  scheduler_options opts;
  opts.events = events_;
  opts.tenant = tenant;
  storage_actor store = state_store_;
  storage_actor fence;
  if (epoch > 0)
    store = fence = system_->spawn(fenced_store, state_store_,
                                   std::string{
                                     cluster_membership::scheduler_key},
                                   epoch);
  auto handle = system_->spawn(spindle::scheduler, id_allocator_, store,
                               opts);
  if (!tenant.empty()) {
    // A tenant's scheduler that stops by itself (its load failed) is
    // started again by the tenant's next request.
    handle->attach_functor([this, tenant, fence,
                            addr = handle.address()](const caf::error& why) {
      if (fence)
        caf::anon_send_exit(fence, caf::exit_reason::user_shutdown);
      if (why && why != caf::exit_reason::user_shutdown)
        spdlog::error("orchestration: the scheduler of tenant {} stopped "
                      "({}); its next request starts it again",
                      tenant, describe(why));
      std::lock_guard<std::mutex> guard{scheduler_mtx_};
      auto i = tenant_schedulers_.find(tenant);
      if (i != tenant_schedulers_.end() && i->second.address() == addr)
        tenant_schedulers_.erase(i);
    });
    return handle;
  }
  if (epoch > 0) {
    // A scheduler that stops by itself (its load failed) gives the seat
    // back to the heartbeat, which takes it again with a new epoch.
    auto* membership = cluster_.get();
    handle->attach_functor([membership, epoch, fence](const caf::error& why) {
      caf::anon_send_exit(fence, caf::exit_reason::user_shutdown);
      if (why && why != caf::exit_reason::user_shutdown) {
        spdlog::error("cluster: the scheduler stopped ({}); the seat is "
                      "taken again at the next renewal",
                      describe(why));
        membership->scheduler_failed(epoch);
      }
    });
  }
  return handle;
}

void runtime::scheduler_seat_changed(uint64_t epoch) {
  scheduler_actor fresh;
  if (epoch > 0) {
    fresh = spawn_scheduler(epoch);
    // Spawning pinned the actor system's logger in a thread-local of this
    // thread (the heartbeat's), and ~actor_system waits for every pin.
    caf::logger::set_current_actor_system(nullptr);
  }
  scheduler_actor old;
  std::map<std::string, scheduler_actor> old_tenants;
  {
    std::lock_guard<std::mutex> guard{scheduler_mtx_};
    old = std::exchange(scheduler_, fresh);
    old_tenants = std::exchange(tenant_schedulers_, {});
    seat_epoch_ = epoch;
  }
  if (old)
    caf::anon_send_exit(old, caf::exit_reason::user_shutdown);
  for (auto& [tenant, handle] : old_tenants)
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  if (epoch > 0 && running()) {
    start_tenant_schedulers(false);
    caf::logger::set_current_actor_system(nullptr);
  }
  if (epoch > 0)
    spdlog::info("cluster: this node runs the scheduler (seat epoch {}); it "
                 "loads the stored orchestrations",
                 epoch);
  else if (old)
    spdlog::warn("cluster: this node no longer runs the scheduler");
}

scheduler_actor runtime::tenant_scheduler(const std::string& tenant,
                                          bool& spawned) {
  std::lock_guard<std::mutex> guard{scheduler_mtx_};
  // Where the default tenant's runs (the seat's holder), every tenant's
  // does.
  if (!scheduler_ || !running())
    return {};
  if (auto i = tenant_schedulers_.find(tenant); i != tenant_schedulers_.end())
    return i->second;
  auto handle = spawn_scheduler(seat_epoch_, tenant);
  tenant_schedulers_.emplace(tenant, handle);
  spawned = true;
  return handle;
}

scheduler_actor runtime::scheduler_of(const std::string& tenant) {
  if (tenant.empty())
    return scheduler();
  bool spawned = false;
  auto handle = tenant_scheduler(tenant, spawned);
  // Spawning pinned the actor system's logger in a thread-local of this
  // (outside) thread; ~actor_system waits for every pin.
  if (spawned)
    caf::logger::set_current_actor_system(nullptr);
  return handle;
}

std::vector<scheduler_actor> runtime::all_schedulers() const {
  std::lock_guard<std::mutex> guard{scheduler_mtx_};
  std::vector<scheduler_actor> out;
  if (scheduler_)
    out.push_back(scheduler_);
  for (auto& [tenant, handle] : tenant_schedulers_)
    out.push_back(handle);
  return out;
}

void runtime::start_tenant_schedulers(bool wait) {
  if (!state_store_)
    return;
  auto start = [this](caf::expected<sql_rows> rows) {
    if (!rows) {
      spdlog::warn("orchestration: the tenants holding orchestrations "
                   "cannot be read ({}); their schedulers start on their "
                   "first request",
                   describe(rows.error()));
      return;
    }
    // On an actor's thread (the answer) or the caller's (`wait`): the
    // caller unpins the logger itself.
    bool spawned = false;
    for (auto& row : *rows)
      if (!row.empty() && row[0].type == sql_value::kind::text
          && !row[0].text.empty() && valid_tenant_id(row[0].text))
        tenant_scheduler(row[0].text, spawned);
  };
  if (wait)
    start(call<sql_rows>(state_store_, options_.default_timeout,
                         load_atom::value, records::list_task_tenants()));
  else
    call_async<sql_rows>(state_store_, options_.default_timeout,
                         std::move(start), load_atom::value,
                         records::list_task_tenants());
}

thread_location runtime::locate_scheduler() const {
  if (!cluster_)
    return thread_location{};
  auto seat = cluster_->scheduler_seat();
  if (seat.here)
    return thread_location{};
  return thread_location{false, seat.holder, seat.holder_url};
}

caf::error runtime::no_scheduler_here() const {
  if (!running())
    return make_error(errc::unavailable, "the runtime is stopped");
  auto seat = cluster_ ? cluster_->scheduler_seat()
                       : cluster_membership::seat{};
  if (!seat.holder.empty() && !seat.here)
    return make_error(errc::not_owner,
                      "the scheduler runs on node '" + seat.holder + "' ("
                        + seat.holder_url + ")");
  return make_error(errc::not_owner,
                    "no node runs the scheduler now (a node is taking it "
                    "over); try again shortly");
}

caf::error runtime::start_orchestration() {
  if (cluster_) {
    // A node runs the scheduler only while it holds the seat. The first
    // node takes it here, so a lone node starts like a single process
    // (below: the load finishes before the runtime answers); the others
    // learn who holds it, and the heartbeat takes it when it frees.
    cluster_->on_scheduler_seat(
      [this](uint64_t epoch) { scheduler_seat_changed(epoch); });
    cluster_->contend_for_scheduler();
  } else {
    auto handle = spawn_scheduler(0);
    std::lock_guard<std::mutex> guard{scheduler_mtx_};
    scheduler_ = handle;
  }
  auto handle = scheduler();
  if (!state_store_ || !handle)
    return caf::none;
  // The scheduler loads the stored orchestrations before it answers
  // anything: the first answer says the load is done. If it stops instead,
  // its exit reason says why, and the runtime does not start.
  caf::scoped_actor self{*system_};
  self->monitor(handle);
  caf::error failure;
  auto limit = scheduler_options{}.timeout * 2 + std::chrono::seconds(1);
  self->request(handle, limit, stats_atom::value)
    .receive([](task_counts&) {},
             [&](caf::error& err) { failure = std::move(err); });
  if (!failure) {
    self->demonitor(handle.address());
    return caf::none;
  }
  self->receive(
    [&](caf::down_msg& dm) {
      if (dm.reason)
        failure = std::move(dm.reason);
    },
    caf::after(std::chrono::seconds(5)) >> [] {});
  return failure;
}


std::vector<caf::actor> runtime::core_actors() const {
  // Dependents first: an actor is stopped before the actors it calls.
  std::vector<caf::actor> result;
  auto add = [&](const auto& handle) {
    if (handle)
      result.push_back(caf::actor_cast<caf::actor>(handle));
  };
  // -- orchestration (add here) --
  for (auto& handle : all_schedulers())
    add(handle);
  // -- threads, memory, builder (add here) --
  add(context_builder_);
  add(rewriter_);
  add(memory_);
  add(thread_registry_);
  // -- context items (add here) --
  add(context_directory_);
  add(id_allocator_);
  add(state_store_);
  add(counter_store_);
  return result;
}

void runtime::stop() {
  if (!system_)
    return;
  running_ = false;
  // No seat change starts a scheduler from here on.
  if (cluster_)
    cluster_->on_scheduler_seat({});
  if (exchanges_)
    exchanges_->stop_all();
  if (compactor_)
    compactor_->stop_all();
  // The two pools (builders, memory) worker by worker, in the order
  // core_actors gives; then every core actor (the pools again: a no-op).
  stop_actor_pool(*system_, caf::actor_cast<caf::actor>(context_builder_));
  stop_actor_pool(*system_, caf::actor_cast<caf::actor>(memory_));
  for (auto& handle : core_actors())
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  // -- each area resets its handles here --
  context_builder_ = nullptr;
  exchanges_ = nullptr;
  compactor_ = nullptr;
  rewriter_ = nullptr;
  memory_ = nullptr;
  thread_registry_ = nullptr;
  context_directory_ = nullptr;
  {
    std::lock_guard<std::mutex> guard{scheduler_mtx_};
    scheduler_ = nullptr;
    tenant_schedulers_.clear();
  }
  id_allocator_ = nullptr;
  state_store_ = nullptr;
  counter_store_ = nullptr;
  // ~actor_system waits until every actor has finished.
  system_.reset();
  // Every thread stopped and its writes committed: the leases can go.
  if (cluster_) {
    cluster_->leave();
    cluster_.reset();
  }
}

bool runtime::running() const noexcept {
  return running_;
}

runtime::~runtime() {
  stop();
}

// -- IDs ------------------------------------------------------------------------

caf::expected<id_range> runtime::next_ids(const std::string& key,
                                          uint64_t count) {
  return next_ids(key, count, options_.default_timeout);
}

caf::expected<id_range> runtime::next_ids(const std::string& key,
                                          uint64_t count,
                                          std::chrono::milliseconds timeout) {
  return call<id_range>(id_allocator_, timeout, next_atom::value, key, count);
}

namespace {

caf::expected<std::string> first_of(caf::expected<id_range> range) {
  if (!range)
    return range.error();
  return render_id(range->key, range->first);
}

caf::expected<std::vector<std::string>> all_of(caf::expected<id_range> range) {
  if (!range)
    return range.error();
  return render_ids(*range);
}

} // namespace

caf::expected<std::string> runtime::next_context_id() {
  return first_of(next_ids(std::string{counter_keys::context}, 1));
}

caf::expected<std::vector<std::string>>
runtime::next_context_ids(uint64_t count) {
  return all_of(next_ids(std::string{counter_keys::context}, count));
}

caf::expected<std::string> runtime::next_orchestration_id() {
  return first_of(next_ids(std::string{counter_keys::orchestration}, 1));
}

caf::expected<std::string> runtime::next_task_id(const std::string& parent) {
  if (auto id = task_id::parse(parent); !id)
    return id.error();
  return first_of(next_ids(parent, 1));
}

caf::expected<std::vector<std::string>>
runtime::next_task_ids(const std::string& parent, uint64_t count) {
  if (auto id = task_id::parse(parent); !id)
    return id.error();
  return all_of(next_ids(parent, count));
}

void runtime::next_ids_async(const std::string& key, uint64_t count,
                             std::function<void(caf::expected<id_range>)> done) {
  call_async<id_range>(id_allocator_, options_.default_timeout,
                       std::move(done), next_atom::value, key, count);
}

} // namespace spindle
