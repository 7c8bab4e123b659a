#include "spindle/runtime/conversation.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

template <class R, class Handle, class... Ts>
caf::expected<R> ask(caf::blocking_actor* self, const Handle& receiver,
                     std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::expected<R> out{caf::error{}};
  self->request(receiver, timeout, std::forward<Ts>(xs)...)
    .receive([&](R& value) { out = std::move(value); },
             [&](caf::error& err) { out = std::move(err); });
  return out;
}

caf::error wrap(const caf::error& err, const std::string& what) {
  return make_error(classify(err), what + ": " + describe(err));
}

// Ends the exchange on every path out, so a failure never leaves the thread
// held (a crash is covered by the thread monitoring its holder).
class lease_guard {
public:
  lease_guard(caf::blocking_actor* self, thread_actor thread, uint64_t lease,
              std::chrono::milliseconds timeout)
    : self_(self), thread_(std::move(thread)), lease_(lease),
      timeout_(timeout) {
  }
  lease_guard(const lease_guard&) = delete;
  lease_guard& operator=(const lease_guard&) = delete;
  ~lease_guard() {
    auto ended = ask<uint64_t>(self_, thread_, timeout_,
                               exchange_end_atom::value, lease_);
    if (!ended)
      spdlog::warn("exchange lease {} was not released cleanly: {}", lease_,
                   describe(ended.error()));
  }

private:
  caf::blocking_actor* self_;
  thread_actor thread_;
  uint64_t lease_;
  std::chrono::milliseconds timeout_;
};

caf::expected<exchange_result> run(caf::blocking_actor* self,
                                   const exchange_services& svc,
                                   const exchange_request& req,
                                   const delta_callback& on_delta) {
  const auto& opt = svc.options;
  // Everything the caller can get wrong is refused before anything exists.
  build_request probe{req.thread_id, req.user_id, req.content, req.build};
  if (auto err = validate_build_request(probe))
    return err;
  if (static_cast<uint8_t>(req.on_conflict)
      > static_cast<uint8_t>(conflict_policy::fork))
    return make_error(errc::invalid_argument, "on_conflict is unknown");
  if (!svc.provider)
    return make_error(errc::unavailable, "no LLM provider is configured");
  spdlog::debug("exchange: request thread_id='{}' on_conflict={}",
               req.thread_id, to_string(req.on_conflict));
  // 1. The thread (write path: get_or_create). A thread passivated
  // between the lookup and the lease is simply looked up again: it holds
  // exactly what it stored.
  exchange_result res;
  thread_actor thread;
  caf::expected<uint64_t> lease{caf::error{}};
  auto wait = req.on_conflict == conflict_policy::queue ? opt.queue_timeout
                                                        : opt.step_timeout;
  for (int attempt = 0;; ++attempt) {
    auto ref = ask<thread_ref>(self, svc.registry, opt.step_timeout,
                               caf::put_atom::value,
                               attempt == 0 ? req.thread_id : res.thread_id);
    if (!ref)
      return wrap(ref.error(), "cannot open thread '" + req.thread_id + "'");
    res.thread_id = ref->thread_id;
    res.created = res.created || ref->created;
    thread = ref->handle;
    // 2. Hold it (D9).
    lease = ask<uint64_t>(self, thread, wait, exchange_begin_atom::value,
                          req.on_conflict);
    if (lease || lease.error() != caf::sec::request_receiver_down
        || attempt == 3)
      break;
  }
  if (!lease && req.on_conflict == conflict_policy::fork
      && classify(lease.error()) == errc::conflict) {
    auto forked = ask<thread_ref>(self, svc.registry, opt.step_timeout,
                                  fork_atom::value, res.thread_id);
    if (!forked)
      return wrap(forked.error(), "cannot fork thread '" + res.thread_id + "'");
    res.forked_from = res.thread_id;
    res.thread_id = forked->thread_id;
    res.created = true;
    thread = forked->handle;
    lease = ask<uint64_t>(self, thread, opt.queue_timeout,
                          exchange_begin_atom::value, conflict_policy::queue);
  }
  if (!lease) {
    if (classify(lease.error()) == errc::conflict)
      return lease.error();
    return wrap(lease.error(), "cannot hold thread '" + res.thread_id + "'");
  }
  lease_guard guard{self, thread, *lease, opt.step_timeout};
  res.thread_actor_id = thread.id();
  // 3. The prompt, from the history as it was before this message.
  build_request build{res.thread_id, req.user_id, req.content, req.build};
  build.options.memory = build.options.memory && opt.memory;
  auto& bo = opt.builder;
  auto build_timeout = 2 * bo.read_timeout + bo.memory_timeout
                       + bo.rewrite_timeout + std::chrono::seconds{1};
  auto built = ask<built_context>(self, svc.builder, build_timeout,
                                  build_context_atom::value, build);
  if (!built)
    return wrap(built.error(),
                "cannot build the prompt for thread '" + res.thread_id + "'");
  res.history_turns = built->short_term_history.size();
  res.rewritten_query = built->rewritten_query;
  spdlog::info("exchange: thread_id='{}' {} actor_id={} turns_loaded={} "
               "thread_turns={}",
               res.thread_id,
               !res.forked_from.empty() ? "forked from '" + res.forked_from
                                            + "'"
               : res.created           ? std::string{"created"}
                                       : std::string{"found"},
               res.thread_actor_id, res.history_turns, built->total_turns);
  // 4. The user turn, stored before the reply is generated.
  auto count = ask<uint64_t>(self, thread, opt.step_timeout,
                             caf::add_atom::value, make_user_turn(req.content),
                             *lease);
  if (!count)
    return wrap(count.error(), "cannot store the user turn in thread '"
                                 + res.thread_id + "'");
  // 5. The reply, streamed.
  completion_options copts;
  copts.timeout = opt.reply_timeout;
  delta_callback forward = [&on_delta](std::string_view delta) {
    if (!on_delta)
      return true;
    try {
      return on_delta(delta);
    } catch (...) {
      return false; // a failing client counts as one that went away
    }
  };
  caf::expected<completion> reply{caf::error{}};
  try {
    reply = svc.provider->complete(built->messages, copts, forward);
  } catch (const std::exception& e) {
    reply = make_error(errc::upstream_failure,
                       std::string{"the provider threw: "} + e.what());
  } catch (...) {
    reply = make_error(errc::upstream_failure, "the provider threw");
  }
  if (!reply) {
    auto code = classify(reply.error()) == errc::timeout
                  ? errc::timeout
                  : errc::upstream_failure;
    spdlog::warn("exchange: provider '{}' failed for thread '{}': {}",
                 svc.provider->name(), res.thread_id,
                 describe(reply.error()));
    return make_error(code, "provider '" + svc.provider->name()
                              + "' failed: " + describe(reply.error()));
  }
  // 6. The assistant turn.
  count = ask<uint64_t>(self, thread, opt.step_timeout, caf::add_atom::value,
                        make_assistant_turn(reply->text, reply->interrupted),
                        *lease);
  if (!count)
    return wrap(count.error(), "cannot store the assistant turn in thread '"
                                 + res.thread_id + "'");
  res.turns = *count;
  res.reply = std::move(reply->text);
  res.interrupted = reply->interrupted;
  if (res.interrupted)
    spdlog::info("exchange: thread_id='{}' client went away; stored {} "
                 "bytes of the reply as interrupted",
                 res.thread_id, res.reply.size());
  // 7. Long-term memory, while the thread is still held, so the next
  // exchange of this thread can retrieve it.
  if (build.options.memory && svc.memory && !res.interrupted) {
    std::string entry = "User: " + req.content + "\nAssistant: " + res.reply;
    if (entry.size() > max_memory_content) {
      // Budgeted again at retrieval; cut on a UTF-8 character boundary.
      auto end = max_memory_content;
      while (end > 0
             && (static_cast<unsigned char>(entry[end]) & 0xC0) == 0x80)
        --end;
      entry.resize(end);
    }
    auto stored = ask<int64_t>(self, svc.memory, opt.step_timeout,
                               caf::put_atom::value, memory_atom::value,
                               std::move(entry),
                               memory_tags(req.user_id, res.thread_id));
    if (!stored)
      spdlog::warn("exchange: memory of thread '{}' not stored: {}",
                   res.thread_id, describe(stored.error()));
  }
  return res;
}

} // namespace

void spawn_exchange(caf::actor_system& sys, const exchange_services& services,
                    exchange_request request, delta_callback on_delta,
                    exchange_done done) {
  sys.spawn([services, request = std::move(request),
             on_delta = std::move(on_delta),
             done = std::move(done)](caf::blocking_actor* self) {
    auto result = run(self, services, request, on_delta);
    done(std::move(result));
  });
}

} // namespace spindle
