// The facade of threads, memory, the context builder and exchanges
// (runtime.hpp, section "threads, memory, context builder").

#include <future>
#include <limits>

#include <caf/all.hpp>

#include "spindle/actors/context_builder.hpp"
#include "spindle/actors/event_log.hpp"
#include "spindle/actors/thread_registry.hpp"
#include "spindle/runtime/memory.hpp"
#include "spindle/runtime/rewriter.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/runtime/tokenizer.hpp"
#include "conversation/compaction.hpp"
#include "admission/upstream.hpp"
#include "conversation/exchange.hpp"

namespace spindle {

namespace {

std::chrono::milliseconds build_timeout(const context_builder_options& bo) {
  return 2 * bo.read_timeout + bo.memory_timeout + bo.rewrite_timeout
         + std::chrono::seconds{1};
}

} // namespace

caf::error runtime::start_threads() {
  if (!options_.provider)
    options_.provider = make_offline_provider();
  auto& conv = options_.conversation;
  if (!conv.rewriter)
    conv.rewriter = make_offline_rewriter();
  // Resident threads publish their turns here; the builder reads them
  // without messaging the registry or the thread (turn_log.hpp).
  auto views = std::make_shared<thread_views>();
  // Turns are counted once, by their thread; builds fit prompts with the
  // same counts.
  auto encoding = conv.encoding.empty() ? std::string{"o200k_base"}
                                        : conv.encoding;
  auto counter = make_token_counter(encoding);
  if (!counter)
    return make_error(errc::invalid_argument,
                      "unknown encoding '" + encoding
                        + "': o200k_base or cl100k_base");
  if (auto err = validate_context_tokens(conv.builder.context_tokens,
                                         conv.builder.reply_tokens))
    return make_error(errc::invalid_argument,
                      "the default token budget: " + describe(err));
  auto registry_options = conv.registry;
  registry_options.views = views;
  registry_options.events = events_;
  registry_options.tokens = counter;
  tokens_ = counter;
  if (cluster_)
    registry_options.cluster = cluster_->standing();
  thread_registry_ = system_->spawn(spindle::thread_registry,
                                    std::move(registry_options), state_store_);
  kept_memory_retrieval kept_memory;
  if (conv.memory) {
    auto serving = conv.memory_serving;
    serving.tokens = counter; // snippets come counted
    auto mem = spawn_memory(*system_, options_.storage, serving);
    if (!mem)
      return mem.error();
    memory_ = std::move(mem->actor);
    kept_memory = std::move(mem->kept);
  }
  rewriter_ = spawn_query_rewriter(*system_, conv.rewriter);
  // Running exchanges enter this set: stopping the runtime stops those
  // still in flight (their clients are gone by then) at once, rather than
  // after their own timeouts.
  exchanges_ = std::make_shared<exchange_set>();
  if (conv.compact_min_turns > 0) {
    if (!conv.summary_maker)
      conv.summary_maker = std::make_shared<extractive_summarizer>();
    compactor::options copts;
    copts.min_turns = conv.compact_min_turns;
    copts.step_timeout = conv.step_timeout;
    compactor_ = std::make_shared<compactor>(*system_, thread_registry_,
                                             views, conv.summary_maker,
                                             counter, copts);
  }
  auto builder_options = conv.builder;
  builder_options.views = views;
  builder_options.tokens = counter;
  builder_options.kept_memory = std::move(kept_memory);
  // The identity (the offline rewriter) is not asked at all: builders
  // get no rewriter, and every prompt ends with the original message.
  bool identity = conv.rewriter->identity();
  if (!identity && !conv.rewriter->blocking()) {
    // Cannot block and sees no thread: no need for a message round trip.
    auto rw = conv.rewriter;
    builder_options.inline_rewriter = [rw](const rewrite_request& req) {
      return rw->rewrite(req);
    };
  }
  // Builders keep no state between builds, so one per scheduler thread
  // behind a round-robin pool serves builds in parallel; the pool hands a
  // request to a builder inside the sender's enqueue (no extra hop). A
  // builder handles one message each time its worker runs it, so the
  // exchanges its replies wake run between its builds rather than after
  // its whole mailbox (docs/builder.md, "Latency").
  auto builder_rewriter = identity ? query_rewriter_actor{} : rewriter_;
  auto spawn_builder = [this, builder_options, builder_rewriter] {
    return caf::actor_cast<caf::actor>(
      spawn_context_builder(*system_, thread_registry_, memory_,
                            builder_rewriter, builder_options));
  };
  auto builders = std::max<size_t>(1, system_->scheduler().num_workers());
  context_builder_ = caf::actor_cast<context_builder_actor>(
    caf::actor_pool::make(system_->dummy_execution_unit(), builders,
                          spawn_builder, caf::actor_pool::round_robin()));
  return caf::none;
}

caf::expected<uint64_t> runtime::add_turn(const std::string& thread_id,
                                          turn t) {
  // May wait for a running exchange (D9), hence the queue timeout.
  return call<uint64_t>(thread_registry_, options_.conversation.queue_timeout,
                        caf::add_atom::value, thread_id, std::move(t));
}

caf::expected<history_window>
runtime::read_history(const std::string& thread_id, uint64_t max_turns) {
  return call<history_window>(thread_registry_, options_.default_timeout,
                              caf::get_atom::value, history_atom::value,
                              thread_id, max_turns);
}

caf::expected<std::vector<turn>> runtime::history(const std::string& thread_id,
                                                  uint64_t max_turns) {
  auto w = read_history(thread_id, max_turns);
  if (!w)
    return w.error();
  return std::move(w->turns);
}

caf::expected<thread_snapshot>
runtime::snapshot(const std::string& thread_id) {
  return call<thread_snapshot>(thread_registry_, options_.default_timeout,
                               caf::get_atom::value,
                               thread_snapshot_atom::value, thread_id);
}

caf::expected<uint64_t> runtime::clear_thread(const std::string& thread_id) {
  return call<uint64_t>(thread_registry_, options_.conversation.queue_timeout,
                        caf::reset_atom::value, thread_id);
}

caf::expected<std::vector<std::string>> runtime::list_threads() {
  return call<std::vector<std::string>>(thread_registry_,
                                        options_.default_timeout,
                                        caf::get_atom::value,
                                        thread_list_atom::value);
}

compaction_stats runtime::compaction() const {
  return compactor_ ? compactor_->stats() : compaction_stats{};
}

size_t runtime::exchanges_in_flight() const {
  return exchanges_ ? exchanges_->running() : 0;
}

caf::expected<thread_info>
runtime::create_thread(thread_metadata metadata,
                       const std::string& tenant_prefix) {
  auto ref = call<thread_ref>(thread_registry_, options_.default_timeout,
                              caf::put_atom::value, tenant_prefix + "new",
                              std::move(metadata));
  if (!ref)
    return ref.error();
  return thread_details(ref->thread_id);
}

caf::expected<uint64_t> runtime::append_turns(const std::string& thread_id,
                                              std::vector<turn> turns) {
  return call<uint64_t>(thread_registry_, options_.conversation.queue_timeout,
                        caf::add_atom::value, thread_id, std::move(turns));
}

caf::expected<thread_info>
runtime::copy_thread(const std::string& thread_id,
                     std::optional<uint64_t> at_turn) {
  auto ref = call<thread_ref>(
    thread_registry_, options_.default_timeout, fork_atom::value, thread_id,
    at_turn.value_or(std::numeric_limits<uint64_t>::max()));
  if (!ref)
    return ref.error();
  return thread_details(ref->thread_id);
}

caf::expected<thread_info>
runtime::thread_details(const std::string& thread_id) {
  return call<thread_info>(thread_registry_, options_.default_timeout,
                           thread_info_atom::value, thread_id);
}

caf::expected<thread_info>
runtime::update_thread_metadata(const std::string& thread_id,
                                thread_metadata_patch patch) {
  auto updated = call<thread_metadata>(thread_registry_,
                                       options_.default_timeout,
                                       thread_metadata_atom::value, thread_id,
                                       std::move(patch));
  if (!updated)
    return updated.error();
  return thread_details(thread_id);
}

caf::expected<thread_page>
runtime::list_threads(thread_list_request request) {
  return call<thread_page>(thread_registry_, options_.default_timeout,
                           thread_list_atom::value, std::move(request));
}

caf::expected<runtime::thread_deletion>
runtime::delete_thread(const std::string& thread_id) {
  // Nothing is touched for a thread that does not exist.
  if (auto found = thread_details(thread_id); !found)
    return found.error();
  thread_deletion out;
  // The reply in flight stops at once and stores what it generated, with
  // its exchange's memory entry; the thread waits for it to end.
  cancel_exchange(thread_id);
  auto items = clear_context(thread_id);
  if (!items)
    return items.error();
  out.context_items = *items;
  auto turns = call<uint64_t>(thread_registry_,
                              options_.conversation.queue_timeout,
                              caf::delete_atom::value, thread_id);
  if (!turns)
    return turns.error();
  out.turns = *turns;
  if (memory_) {
    auto memories = delete_memories("", thread_id);
    if (!memories)
      return memories.error();
    out.memories = *memories;
  }
  return out;
}

caf::expected<uint64_t> runtime::count_threads() {
  return call<uint64_t>(thread_registry_, options_.default_timeout,
                        caf::get_atom::value, thread_count_atom::value);
}

caf::expected<thread_registry_stats> runtime::thread_stats() {
  return call<thread_registry_stats>(thread_registry_,
                                     options_.default_timeout,
                                     stats_atom::value);
}

caf::expected<built_context>
runtime::build_context(const std::string& thread_id, const std::string& user_id,
                       const std::string& message, build_options options) {
  return call<built_context>(context_builder_,
                             build_timeout(options_.conversation.builder),
                             build_context_atom::value,
                             build_request{thread_id, user_id, message,
                                           std::move(options)});
}

caf::expected<int64_t> runtime::store_memory(const std::string& content,
                                             std::vector<std::string> tags) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  return call<int64_t>(memory_, options_.default_timeout, caf::put_atom::value,
                       memory_atom::value, content, std::move(tags));
}

caf::expected<memory_snippet>
runtime::retrieve_memory(const std::string& user_id,
                         const std::string& thread_id, const std::string& query,
                         uint64_t max_chars) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  return call<memory_snippet>(memory_, options_.default_timeout,
                              caf::get_atom::value, memory_atom::value,
                              memory_query{user_id, thread_id, query,
                                           max_chars});
}

caf::expected<memory_listing>
runtime::list_memories(memory_list_request request) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  if (auto err = validate_memory_list_request(request))
    return err;
  return call<memory_listing>(memory_, options_.default_timeout,
                              caf::get_atom::value, memory_atom::value,
                              std::move(request));
}

caf::expected<uint64_t> runtime::delete_memories(const std::string& user_id,
                                                 const std::string& thread_id) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  return call<uint64_t>(memory_, options_.default_timeout,
                        caf::delete_atom::value, memory_atom::value, user_id,
                        thread_id);
}

caf::expected<bool> runtime::delete_memory(int64_t id,
                                          const std::string& tenant) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  auto n = call<uint64_t>(memory_, options_.default_timeout,
                          caf::delete_atom::value, memory_atom::value, id,
                          tenant);
  if (!n)
    return n.error();
  return *n > 0;
}

caf::expected<uint64_t>
runtime::delete_tenant_memories(const std::string& tenant_prefix,
                                bool dry_run) {
  if (running() && !memory_)
    return make_error(errc::unavailable, "long-term memory is disabled");
  return call<uint64_t>(memory_, options_.default_timeout,
                        caf::delete_atom::value, memory_atom::value,
                        tenant_prefix, dry_run);
}

void runtime::send_message_async(exchange_request request,
                                 delta_callback on_delta, exchange_done done) {
  exchange_callbacks callbacks;
  callbacks.on_delta = std::move(on_delta);
  callbacks.done = std::move(done);
  start_exchange(std::move(request), std::move(callbacks));
}

void runtime::start_exchange(exchange_request request,
                             exchange_callbacks callbacks) {
  if (!running()) {
    if (callbacks.done)
      callbacks.done(make_error(errc::unavailable, "the runtime is stopped"));
    return;
  }
  exchange_services services{thread_registry_, context_builder_, memory_,
                             options_.provider, options_.conversation,
                             exchanges_, compactor_, tokens_, limiter(),
                             upstream()};
  spawn_exchange(*system_, services, std::move(request), std::move(callbacks));
  // Spawning pins this system's logger in a thread-local of the calling
  // thread; ~actor_system waits until every such reference is gone. Drop it,
  // so a server thread that sent messages never keeps the runtime from
  // stopping on another thread.
  caf::logger::set_current_actor_system(nullptr);
}

void runtime::set_limits(limits_source source) {
  std::atomic_store(&limiter_,
                    source ? admission::limiter::make(std::move(source))
                           : std::shared_ptr<admission::limiter>{});
}

void runtime::set_upstream_limits(upstream_limits limits,
                                  weight_source weight) {
  auto made = admission::upstream_queue::make(limits, std::move(weight));
  auto old = std::atomic_exchange(&upstream_, std::move(made));
  // Calls still waiting in the old queue are never sent: they end at
  // their deadline. The new queue's gate starts open.
  if (old)
    old->stop();
}

bool runtime::cancel_exchange(const std::string& thread_id) {
  auto live = exchanges_;
  return live && live->cancel(thread_id);
}

caf::expected<exchange_result> runtime::send_message(exchange_request request,
                                                     delta_callback on_delta) {
  // Every step of an exchange has its own timeout, so `done` always runs.
  auto result
    = std::make_shared<std::promise<caf::expected<exchange_result>>>();
  auto future = result->get_future();
  send_message_async(std::move(request), std::move(on_delta),
                     [result](caf::expected<exchange_result> r) {
                       result->set_value(std::move(r));
                     });
  return future.get();
}

caf::expected<exchange_result>
runtime::send_message(const std::string& thread_id, const std::string& content,
                      const std::string& user_id, conflict_policy on_conflict,
                      uint64_t max_turns, delta_callback on_delta) {
  exchange_request request;
  request.thread_id = thread_id;
  request.content = content;
  request.user_id = user_id;
  request.on_conflict = on_conflict;
  request.build.max_turns = max_turns;
  return send_message(std::move(request), std::move(on_delta));
}

void runtime::add_turn_async(
  const std::string& thread_id, turn t,
  std::function<void(caf::expected<uint64_t>)> done) {
  call_async<uint64_t>(thread_registry_, options_.conversation.queue_timeout,
                       std::move(done), caf::add_atom::value, thread_id,
                       std::move(t));
}

void runtime::locate_thread(const std::string& thread_id,
                            std::function<void(thread_location)> done) {
  if (!cluster_) {
    done(thread_location{});
    return;
  }
  // An error (the registry stopping, a timeout) leaves the request here,
  // where the route reports it.
  call_async<thread_location>(
    thread_registry_, options_.default_timeout,
    [done](caf::expected<thread_location> where) {
      done(where ? std::move(*where) : thread_location{});
    },
    locate_atom::value, thread_id);
}

void runtime::history_async(
  const std::string& thread_id, uint64_t max_turns,
  std::function<void(caf::expected<history_window>)> done) {
  call_async<history_window>(thread_registry_, options_.default_timeout,
                             std::move(done), caf::get_atom::value,
                             history_atom::value, thread_id, max_turns);
}

void runtime::build_context_async(
  build_request request,
  std::function<void(caf::expected<built_context>)> done) {
  call_async<built_context>(context_builder_,
                            build_timeout(options_.conversation.builder),
                            std::move(done), build_context_atom::value,
                            std::move(request));
}

} // namespace spindle
