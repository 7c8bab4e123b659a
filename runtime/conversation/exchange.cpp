#include "spindle/runtime/conversation.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <variant>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/tokens.hpp"
#include "llm/delta.hpp"
#include "llm/usage.hpp"
#include "conversation/compaction.hpp"
#include "conversation/exchange.hpp"

// One exchange is one event-based actor: a chain of requests (registry,
// thread lease, builder, user turn, provider, assistant turn, memory,
// release) in which nothing waits on a thread. The provider streams on its
// own event loop and reports its end to the actor as a message; a provider
// without an asynchronous form gets a detached actor for its blocking call
// alone.

namespace spindle {

namespace {

caf::error wrap(const caf::error& err, const std::string& what) {
  return make_error(classify(err), what + ": " + describe(err));
}

// What the provider reported, handed to the actor with an `xreply`
// message (the completion itself is not a message type).
struct completion_box {
  std::mutex mx;
  caf::expected<completion> result{caf::error{}};
};

// A piece of the reply: text or a piece of a tool call.
using reply_piece = std::variant<std::string, tool_call_delta>;

// The reply's deltas wait here until the user turn is stored: the
// provider is asked while the user turn commits, and nothing of the reply
// reaches the client before that commit. Locked by the provider's thread
// (each delta) and the actor (opening or shutting it).
struct delta_gate {
  std::mutex mx;
  bool open = false; // the user turn is stored: deltas go through
  bool shut = false; // it was not, or the client went away: the provider stops
  std::vector<reply_piece> waiting;
  /// Bytes of the reply offered to the client, in order: what a client
  /// that went away heard, up to the piece it refused.
  size_t offered = 0;

  /// Hands `piece` to the client's callbacks, with `mx` held: false when
  /// the client refused it (a throwing callback refuses).
  bool offer(const delta_callback& on_delta,
             const tool_call_callback& on_call, const reply_piece& piece) {
    if (auto* text = std::get_if<std::string>(&piece)) {
      offered += text->size();
      return offer_delta(on_delta, *text);
    }
    if (!on_call)
      return true;
    try {
      return on_call(std::get<tool_call_delta>(piece));
    } catch (...) {
      return false;
    }
  }
};

// Where the provider's pieces go, from its own thread: through the gate to
// the client. Holds the callbacks, not the exchange (a provider may outlive
// it).
struct reply_sink {
  std::shared_ptr<delta_gate> gate;
  delta_callback on_delta;
  tool_call_callback on_call;
  std::shared_ptr<flow_control> flow;

  /// Holds `piece` until the gate opens, then offers it; false stops the
  /// provider.
  bool pass(reply_piece piece) const {
    // A provider that cannot be aborted stops at its next piece.
    if (flow->cancelled())
      return false;
    auto& g = *gate;
    std::lock_guard<std::mutex> guard{g.mx};
    if (g.shut)
      return false;
    if (!g.open) {
      g.waiting.push_back(std::move(piece));
      return true;
    }
    if (!g.offer(on_delta, on_call, piece))
      g.shut = true;
    return !g.shut;
  }
};

// What a prompt built for a reply after tool results asks in place of a
// user message (the builder needs one); it is taken off again.
constexpr const char* after_tools_message = "(tool results)";

enum class user_turn_state { storing, stored, failed };

// A queued call's grant, handed to the actor with an `xadmit` message.
struct admitted_box {
  std::mutex mx;
  admission::grant_ptr granted;
  rate_state state;
};

// A call's slot toward the upstream, handed over with `xupstream`.
struct upstream_box {
  std::mutex mx;
  admission::upstream_slot_ptr slot;
  int64_t waited_ms = 0;
};

struct exchange_state {
  exchange_services svc;
  exchange_request req;
  exchange_callbacks cb;
  exchange_result res;
  thread_actor thread;
  uint64_t lease = 0;
  bool held = false;
  int attempt = 0;
  build_request build;
  spindle::prompt prompt;
  std::shared_ptr<completion_box> box = std::make_shared<completion_box>();
  /// Set by whichever comes first: the provider's end or the watchdog.
  std::shared_ptr<std::atomic<bool>> ended
    = std::make_shared<std::atomic<bool>>(false);
  bool replied = false;
  bool finished = false;
  /// From the prompt's manifest: the thread's summary covers turns before
  /// `summary_upto`; the prompt left out the turns before `left_out_upto`.
  uint64_t summary_upto = 0;
  uint64_t left_out_upto = 0;
  /// The prompt's tokens, as the builder counted them.
  uint64_t prompt_tokens = 0;
  std::shared_ptr<delta_gate> gate = std::make_shared<delta_gate>();
  user_turn_state user = user_turn_state::storing;
  caf::error user_error;
  /// The provider ended before the user turn's commit did.
  bool completion_waiting = false;
  // Limits (docs/limits.md): the tenant has some, its request as counted,
  // the call's grant once admitted, its place in the queue meanwhile.
  bool limited = false;
  bool limits_reported = false;
  /// Refused by the limits after the thread was opened: nothing may stay.
  bool refused = false;
  bool dropping = false;
  std::string tenant;
  admission::request_ticket ticket;
  admission::grant_ptr grant;
  uint64_t waiter = 0;
  rate_state queued_state;
  std::shared_ptr<admitted_box> admitted = std::make_shared<admitted_box>();
  // The upstream's fair queue: the call's slot once sent, its ticket
  // while it waits.
  admission::upstream_slot_ptr slot;
  uint64_t upstream_ticket = 0;
  std::shared_ptr<upstream_box> upstream
    = std::make_shared<upstream_box>();
  bool held_reported = false;
  /// The upstream refused the call for its load this many times; `again`:
  /// it waits to be sent again (its user turn is stored).
  int busy_retries = 0;
  bool again = false;
};

// The upstream refused a call at most this many times before its
// exchange fails with `upstream_busy` (docs/limits.md).
constexpr int max_busy_retries = 2;

using state_ptr = std::shared_ptr<exchange_state>;

class exchange : public std::enable_shared_from_this<exchange> {
public:
  exchange(caf::event_based_actor* self, state_ptr st)
    : self_(self), st_(std::move(st)) {
  }

  void start() {
    auto& req = st_->req;
    build_request probe{req.thread_id, req.user_id, req.content, req.build};
    if (req.after_tool_results) {
      if (!req.content.empty())
        return fail(make_error(errc::invalid_argument,
                               "a reply after tool results has no new "
                               "message"));
      probe.message = after_tools_message;
    }
    if (auto err = validate_build_request(probe))
      return fail(err);
    if (static_cast<uint8_t>(req.on_conflict)
        > static_cast<uint8_t>(conflict_policy::fork))
      return fail(make_error(errc::invalid_argument, "on_conflict is unknown"));
    if (!st_->svc.provider)
      return fail(make_error(errc::unavailable,
                             "no LLM provider is configured"));
    auto tenant = tenant_of_id(req.thread_id);
    st_->tenant = tenant.empty() ? std::string{"default"}
                                 : std::string{tenant};
    // The tenant's requests per minute are counted first, before anything
    // is read or built for a request that is refused.
    if (auto& limiter = st_->svc.limiter) {
      auto s = limiter->take_request(st_->tenant, st_->ticket);
      st_->limited = s.limited;
      if (!s.refused_by.empty()) {
        report_limits(s);
        return fail(
          make_error(errc::rate_limited, admission::refusal_text(s)));
      }
    }
    open_thread(req.thread_id);
  }

  // The provider's end arrived (or the watchdog's). Handled once the
  // user turn's outcome is known.
  void on_completion() {
    if (st_->user == user_turn_state::storing) {
      st_->completion_waiting = true;
      return;
    }
    if (st_->user == user_turn_state::failed)
      return fail(st_->user_error);
    caf::expected<completion> reply{caf::error{}};
    {
      std::lock_guard<std::mutex> guard{st_->box->mx};
      reply = std::move(st_->box->result);
    }
    if (!reply) {
      auto why = classify(reply.error());
      // Refused for the upstream's load: the gate it closed decides when
      // the call goes again (docs/limits.md, "When the upstream refuses").
      if (why == errc::upstream_busy && st_->slot
          && st_->busy_retries < max_busy_retries
          && !st_->cb.flow->cancelled()) {
        ++st_->busy_retries;
        st_->slot->settle(0);
        st_->slot.reset();
        st_->ended = std::make_shared<std::atomic<bool>>(false);
        st_->again = true;
        spdlog::info("exchange: the upstream refused the call for thread "
                     "'{}' ({} of {}): {}",
                     st_->res.thread_id, st_->busy_retries,
                     max_busy_retries + 1, describe(reply.error()));
        return to_upstream();
      }
      auto code = why == errc::timeout         ? errc::timeout
                  : why == errc::upstream_busy ? errc::upstream_busy
                                               : errc::upstream_failure;
      spdlog::warn("exchange: provider '{}' failed for thread '{}': {}",
                   st_->svc.provider->name(), st_->res.thread_id,
                   describe(reply.error()));
      return fail(make_error(code, "provider '" + st_->svc.provider->name()
                                     + "' failed: "
                                     + describe(reply.error())));
    }
    // From here on the reply cannot be cancelled: it was, or it is
    // complete (a cancel that answered true always ends as cancelled).
    if (st_->svc.live ? st_->svc.live->settle(st_->res.thread_id,
                                              st_->cb.flow.get())
                      : st_->cb.flow->cancelled()) {
      st_->res.cancelled = true;
      reply->interrupted = true;
    }
    // Charged for what the provider generated, before the stored reply
    // is cut to what the client heard.
    st_->res.usage = usage_of(*reply);
    // The tenant's slot and the upstream's are free, and their
    // reservations become what the call used (all of it when nothing
    // counted).
    if (st_->grant)
      st_->grant->settle(st_->res.usage.known()
                           ? st_->res.usage.total_tokens()
                           : st_->grant->reserved());
    if (st_->slot)
      st_->slot->settle(st_->res.usage.known()
                          ? st_->res.usage.total_tokens()
                          : st_->slot->reserved());
    {
      // A client that went away while the deltas waited for the user
      // turn heard less than the provider generated (which may have
      // finished meanwhile): the turn keeps what it was offered, as when
      // the provider itself stops at the refused piece.
      std::lock_guard<std::mutex> guard{st_->gate->mx};
      if (st_->gate->shut) {
        reply->interrupted = true;
        if (reply->text.size() > st_->gate->offered)
          reply->text.resize(st_->gate->offered);
      }
    }
    store_assistant(std::move(*reply));
  }

  /// What the actor answers: the provider's end, and once the reply is
  /// being generated (`watchdog` > 0), the end of its time.
  static caf::behavior behavior(std::shared_ptr<exchange> x,
                                std::chrono::milliseconds watchdog) {
    if (watchdog.count() == 0)
      return {[x](exchange_reply_atom) { x->on_completion(); },
              [x](exchange_admit_atom) { x->on_admitted(); },
              [x](exchange_upstream_atom) { x->on_upstream(); }};
    return {[x](exchange_reply_atom) { x->on_completion(); },
            caf::after(watchdog) >> [x] { x->on_watchdog(); }};
  }

  // The provider did not end within the reply timeout (plus a grace for
  // one that reports its own timeout): give up on it.
  void on_watchdog() {
    if (st_->ended->exchange(true))
      return;
    {
      std::lock_guard<std::mutex> guard{st_->box->mx};
      st_->box->result = make_error(
        errc::timeout, "the reply did not end within "
                         + std::to_string(opt().reply_timeout.count())
                         + " ms");
    }
    on_completion();
  }

private:
  const conversation_options& opt() const {
    return st_->svc.options;
  }

  // What the exchange spent (docs/usage.md), charged to its user.
  turn_usage usage_of(const completion& reply) const {
    auto u = call_usage(reply, st_->svc.tokens.get(), st_->prompt_tokens);
    u.user_id = st_->req.user_id;
    return u;
  }

  // 1. The thread (write path: get_or_create). A thread passivated
  // between the lookup and the lease is looked up again: it holds exactly
  // what it stored.
  void open_thread(const std::string& id) {
    auto st = st_;
    self_->request(st->svc.registry, opt().step_timeout, caf::put_atom::value,
                   id)
      .then(
        [this, st](thread_ref& ref) {
          st->res.thread_id = ref.thread_id;
          st->res.created = st->res.created || ref.created;
          st->thread = ref.handle;
          begin(st->req.on_conflict);
        },
        [this, st](caf::error& err) {
          fail(wrap(err, "cannot open thread '" + st->req.thread_id + "'"));
        });
  }

  // 2. Hold it (D9).
  void begin(conflict_policy policy) {
    auto st = st_;
    auto wait = policy == conflict_policy::queue ? opt().queue_timeout
                                                 : opt().step_timeout;
    self_->request(st->thread, wait, exchange_begin_atom::value, policy)
      .then(
        [this, st](uint64_t lease) {
          st->lease = lease;
          st->held = true;
          if (st->svc.live)
            st->svc.live->hold(st->res.thread_id, st->cb.flow);
          held();
        },
        [this, st, policy](caf::error& err) {
          if (err == caf::sec::request_receiver_down && st->attempt < 3
              && st->res.forked_from.empty()) {
            ++st->attempt;
            return open_thread(st->res.thread_id);
          }
          if (policy == conflict_policy::fork
              && classify(err) == errc::conflict)
            return fork();
          if (classify(err) == errc::conflict)
            return fail(err);
          fail(wrap(err, "cannot hold thread '" + st->res.thread_id + "'"));
        });
  }

  void fork() {
    auto st = st_;
    self_->request(st->svc.registry, opt().step_timeout, fork_atom::value,
                   st->res.thread_id)
      .then(
        [this, st](thread_ref& forked) {
          st->res.forked_from = st->res.thread_id;
          st->res.thread_id = forked.thread_id;
          st->res.created = true;
          st->thread = forked.handle;
          begin(conflict_policy::queue);
        },
        [this, st](caf::error& err) {
          fail(wrap(err, "cannot fork thread '" + st->res.thread_id + "'"));
        });
  }

  // 3. Held: the client hears which thread at once, then the prompt is
  // built from the history as it was before this message.
  void held() {
    auto st = st_;
    st->res.thread_actor_id = st->thread.id();
    // With limits the client hears of the thread once the call is
    // admitted: a refusal is an answer of its own (429), not an error in
    // a stream.
    if (!st->limited)
      report_held();
    st->build = build_request{st->res.thread_id, st->req.user_id,
                              st->req.content, st->req.build};
    st->build.options.memory = st->build.options.memory && opt().memory;
    st->build.options.turns = false; // the prompt holds them
    if (st->req.after_tool_results) {
      st->build.message = after_tools_message;
      st->build.options.memory = false;
      st->build.options.rewrite = false;
    }
    auto& bo = opt().builder;
    auto build_timeout = 2 * bo.read_timeout + bo.memory_timeout
                         + bo.rewrite_timeout + std::chrono::seconds{1};
    self_->request(st->svc.builder, build_timeout, build_context_atom::value,
                   st->build)
      .then(
        [this, st](built_context& built) {
          st->res.history_turns = built.history_turns;
          st->res.rewritten_query = built.rewritten_query;
          spdlog::info(
            "exchange: thread_id='{}' {} actor_id={} turns_loaded={} "
            "thread_turns={}",
            st->res.thread_id,
            !st->res.forked_from.empty()
              ? "forked from '" + st->res.forked_from + "'"
            : st->res.created ? std::string{"created"}
                              : std::string{"found"},
            st->res.thread_actor_id, st->res.history_turns,
            built.total_turns);
          st->prompt = std::move(built.messages);
          // What this prompt left out goes into the thread's summary once
          // the reply is stored (docs/threads.md, "Compaction").
          auto& m = built.manifest;
          st->summary_upto = m.summary_upto;
          st->prompt_tokens = m.total_tokens;
          st->left_out_upto = m.turns.empty() ? built.total_turns
                                              : m.turns.front();
          // The tool results are the thread's last turns: the reply
          // follows them, with no user message after.
          if (st->req.after_tool_results && !st->prompt.empty()
              && st->prompt.back().role == "user") {
            if (st->svc.tokens) {
              auto placeholder = count_message_tokens(
                *st->svc.tokens,
                chat_message{"user", after_tools_message, {}, {}});
              st->prompt_tokens -= std::min(st->prompt_tokens,
                                            uint64_t{placeholder});
            }
            st->prompt.pop_back();
          }
          admit();
        },
        [this, st](caf::error& err) {
          fail(wrap(err, "cannot build the prompt for thread '"
                           + st->res.thread_id + "'"));
        });
  }

  // 3b. The tenant's limits (docs/limits.md): the prompt's exact tokens
  // and the reply's reserve, and a slot of its calls at once, or a place
  // in its queue until one frees or the queue timeout passes. Nothing is
  // stored before the call is admitted.
  void admit() {
    auto st = st_;
    if (!st->limited || !st->svc.limiter)
      return to_upstream();
    auto me = caf::actor_cast<caf::actor>(self_);
    auto box = st->admitted;
    auto a = st->svc.limiter->admit(
      st->tenant, st->prompt_tokens, st->req.completion.max_tokens,
      [me, box](admission::grant_ptr g, rate_state s) {
        {
          std::lock_guard<std::mutex> guard{box->mx};
          box->granted = std::move(g);
          box->state = std::move(s);
        }
        caf::anon_send(me, exchange_admit_atom::value);
      });
    using outcome = admission::admission::outcome;
    switch (a.result) {
      case outcome::admitted:
        return granted(std::move(a.granted), a.state);
      case outcome::queued: {
        st->waiter = a.waiter;
        st->queued_state = a.state;
        auto x = shared_from_this();
        self_->become(caf::behavior{
          [x](exchange_reply_atom) { x->on_completion(); },
          [x](exchange_admit_atom) { x->on_admitted(); },
          [x](exchange_upstream_atom) { x->on_upstream(); },
          caf::after(opt().queue_timeout) >> [x] { x->on_queue_timeout(); }});
        return;
      }
      case outcome::refused:
        st->svc.limiter->take_back(st->ticket);
        report_limits(a.state);
        st->refused = true;
        return fail(make_error(errc::rate_limited,
                               admission::refusal_text(a.state)));
      case outcome::too_large:
        st->svc.limiter->take_back(st->ticket);
        report_limits(a.state);
        st->refused = true;
        return fail(make_error(errc::too_large, a.why));
    }
  }

  // A slot freed for the queued call.
  void on_admitted() {
    auto st = st_;
    if (st->grant)
      return;
    admission::grant_ptr g;
    rate_state s;
    {
      std::lock_guard<std::mutex> guard{st->admitted->mx};
      g = std::move(st->admitted->granted);
      s = std::move(st->admitted->state);
    }
    if (!g)
      return;
    self_->become(behavior(shared_from_this(), std::chrono::milliseconds{0}));
    granted(std::move(g), s);
  }

  // The queue timeout passed: the client's deadline.
  void on_queue_timeout() {
    auto st = st_;
    self_->become(behavior(shared_from_this(), std::chrono::milliseconds{0}));
    if (!st->svc.limiter->withdraw(st->tenant, st->waiter))
      return; // admitted meanwhile: its `xadmit` is on its way
    st->svc.limiter->take_back(st->ticket);
    report_limits(st->queued_state);
    st->refused = true;
    fail(make_error(errc::timeout,
                    "no slot of the tenant's concurrent_exchanges freed "
                    "within "
                      + std::to_string(opt().queue_timeout.count())
                      + " ms"));
  }

  void granted(admission::grant_ptr g, const rate_state& s) {
    auto st = st_;
    st->grant = std::move(g);
    // With tokens_per_min a reply that sets no bound is bounded by its
    // reserve: what it reserved is what it may use.
    if (st->grant && st->grant->reply_bound() != 0
        && st->req.completion.max_tokens == 0)
      st->req.completion.max_tokens
        = static_cast<uint32_t>(std::min<uint64_t>(st->grant->reply_bound(),
                                                   UINT32_MAX));
    report_limits(s);
    to_upstream();
  }

  // 3c. The upstream's capacity (runtime::set_upstream_limits): sent at
  // once, or in the fair queue until the upstream has room, the client
  // told of its place. Nothing is stored while it waits.
  void to_upstream() {
    auto st = st_;
    auto& q = st->svc.upstream;
    if (!q)
      return admitted_go();
    auto& l = q->limits();
    uint64_t reserve = st->grant ? st->grant->reserved() : 0;
    if (reserve == 0)
      reserve = st->prompt_tokens
                + (st->req.completion.max_tokens != 0
                     ? st->req.completion.max_tokens
                     : l.reply_reserve);
    // Under the upstream's tokens per minute a reply that sets no bound
    // is bounded by its reserve, as under a tenant's.
    if (l.tokens_per_min != 0 && st->req.completion.max_tokens == 0)
      st->req.completion.max_tokens = static_cast<uint32_t>(
        std::min<uint64_t>(l.reply_reserve, UINT32_MAX));
    auto me = caf::actor_cast<caf::actor>(self_);
    auto box = st->upstream;
    auto w = q->acquire(
      st->tenant, reserve,
      [me, box](admission::upstream_slot_ptr slot, int64_t waited) {
        {
          std::lock_guard<std::mutex> guard{box->mx};
          box->slot = std::move(slot);
          box->waited_ms = waited;
        }
        caf::anon_send(me, exchange_upstream_atom::value);
      },
      st->again);
    if (w.slot) {
      st->slot = std::move(w.slot);
      return sent();
    }
    st->upstream_ticket = w.ticket;
    report_held();
    if (st->cb.on_queued) {
      upstream_place place{w.position, w.waiting};
      guarded([&] { st->cb.on_queued(place); });
    }
    auto x = shared_from_this();
    self_->become(caf::behavior{
      [x](exchange_reply_atom) { x->on_completion(); },
      [x](exchange_upstream_atom) { x->on_upstream(); },
      caf::after(opt().queue_timeout) >> [x] { x->on_upstream_timeout(); }});
  }

  void on_upstream() {
    auto st = st_;
    if (st->slot)
      return;
    {
      std::lock_guard<std::mutex> guard{st->upstream->mx};
      st->slot = std::move(st->upstream->slot);
    }
    if (!st->slot)
      return;
    self_->become(behavior(shared_from_this(), std::chrono::milliseconds{0}));
    sent();
  }

  // The upstream has room: the call goes (again, after a refusal).
  void sent() {
    if (st_->again)
      return generate();
    admitted_go();
  }

  void on_upstream_timeout() {
    auto st = st_;
    self_->become(behavior(shared_from_this(), std::chrono::milliseconds{0}));
    if (!st->svc.upstream->withdraw(st->upstream_ticket))
      return; // sent meanwhile: its `xupstream` is on its way
    if (st->again) // the user turn is stored: it stays
      return fail(make_error(errc::upstream_busy,
                             "the upstream refused the call and did not "
                             "take it again within "
                               + std::to_string(opt().queue_timeout.count())
                               + " ms"));
    if (st->svc.limiter)
      st->svc.limiter->take_back(st->ticket);
    st->refused = true;
    fail(make_error(errc::timeout,
                    "the upstream had no room for the call within "
                      + std::to_string(opt().queue_timeout.count())
                      + " ms"));
  }

  void report_held() {
    auto st = st_;
    if (st->held_reported)
      return;
    st->held_reported = true;
    if (st->cb.on_held)
      guarded([&] { st->cb.on_held(st->res); });
  }

  void admitted_go() {
    auto st = st_;
    report_held();
    if (!st->req.after_tool_results)
      return store_user();
    user_stored();
    generate();
  }

  void report_limits(const rate_state& s) {
    auto st = st_;
    if (st->limits_reported || !s.limited)
      return;
    st->limits_reported = true;
    if (st->cb.on_limits)
      guarded([&] { st->cb.on_limits(s); });
  }

  // 4. The user turn, stored before any of the reply reaches the client.
  // The provider is asked at once, while the turn commits; its deltas
  // wait in the gate until the commit is acknowledged.
  void store_user() {
    auto st = st_;
    self_->request(st->thread, opt().step_timeout, caf::add_atom::value,
                   make_user_turn(st->req.content), st->lease)
      .then([this](uint64_t) { user_stored(); },
            [this, st](caf::error& err) {
              user_failed(wrap(err, "cannot store the user turn in thread '"
                                      + st->res.thread_id + "'"));
            });
    generate();
  }

  void user_stored() {
    auto st = st_;
    st->user = user_turn_state::stored;
    {
      auto& g = *st->gate;
      std::lock_guard<std::mutex> guard{g.mx};
      g.open = true;
      for (auto& piece : g.waiting) {
        if (g.shut)
          break;
        if (!g.offer(st->cb.on_delta, st->cb.on_tool_call, piece))
          g.shut = true;
      }
      g.waiting.clear();
    }
    if (st->completion_waiting) {
      st->completion_waiting = false;
      on_completion();
    }
  }

  // The reply is dropped unseen (the provider stops at its next delta),
  // and the exchange fails once the provider has ended.
  void user_failed(caf::error err) {
    auto st = st_;
    st->user = user_turn_state::failed;
    st->user_error = std::move(err);
    {
      auto& g = *st->gate;
      std::lock_guard<std::mutex> guard{g.mx};
      g.shut = true;
      g.waiting.clear();
    }
    if (st->completion_waiting) {
      st->completion_waiting = false;
      fail(st->user_error);
    }
  }

  // 5. The reply, streamed by the provider on its own thread.
  void generate() {
    auto st = st_;
    completion_options copts = st->req.completion;
    copts.timeout = opt().reply_timeout;
    copts.flow = st->cb.flow;
    // What the upstream says of its capacity goes to its gate.
    if (st->slot)
      copts.on_signal = [slot = std::weak_ptr<admission::upstream_slot>{
                           st->slot}](const upstream_signal& s) {
        if (auto held = slot.lock())
          held->signal(s);
      };
    auto sink = std::make_shared<reply_sink>(reply_sink{
      st->gate, st->cb.on_delta, st->cb.on_tool_call, st->cb.flow});
    delta_callback forward = [sink](std::string_view delta) {
      return sink->pass(std::string{delta});
    };
    copts.on_tool_call = [sink](const tool_call_delta& piece) {
      return sink->pass(piece);
    };
    auto me = caf::actor_cast<caf::actor>(self_);
    auto box = st->box;
    auto once = st->ended;
    // The watchdog is a receive timeout, not a delayed message to itself:
    // a delayed message would keep the actor's memory (a few KiB) for the
    // whole reply timeout after the exchange ended (minutes, at thousands
    // of exchanges a second), where a receive timeout is cancelled when
    // the actor terminates (found by the soak, reliability.md).
    self_->become(behavior(shared_from_this(),
                           opt().reply_timeout + std::chrono::seconds{1}));
    completion_done done = [me, box, once](caf::expected<completion> r) {
      if (once->exchange(true))
        return;
      {
        std::lock_guard<std::mutex> guard{box->mx};
        box->result = std::move(r);
      }
      caf::anon_send(me, exchange_reply_atom::value);
    };
    auto provider = st->svc.provider;
    bool started = false;
    try {
      started = provider->start(st->prompt, copts, forward, done);
    } catch (const std::exception& e) {
      done(make_error(errc::upstream_failure,
                      std::string{"the provider threw: "} + e.what()));
      return;
    }
    if (started)
      return;
    // A provider without an asynchronous form blocks: give the call a
    // thread of its own, never one of the scheduler's.
    self_->spawn<caf::detached>(
      [provider, prompt = st->prompt, copts, forward,
       done](caf::event_based_actor* helper) {
        caf::expected<completion> r{caf::error{}};
        try {
          r = provider->complete(prompt, copts, forward);
        } catch (const std::exception& e) {
          r = make_error(errc::upstream_failure,
                         std::string{"the provider threw: "} + e.what());
        } catch (...) {
          r = make_error(errc::upstream_failure, "the provider threw");
        }
        done(std::move(r));
        helper->quit();
      });
  }

  // 6. The assistant turn; the reply goes out as soon as it is stored.
  // An interrupted reply keeps its text, not its calls (the last may be
  // cut off).
  void store_assistant(completion reply) {
    auto st = st_;
    auto interrupted = reply.interrupted;
    auto text = reply.text;
    auto assistant = make_assistant_turn(std::move(reply.text), interrupted);
    assistant.usage = st->res.usage;
    if (!interrupted)
      assistant.tool_calls = std::move(reply.tool_calls);
    if (auto err = validate_tool_calls(assistant.tool_calls, text.size()))
      return fail(make_error(errc::upstream_failure,
                             "provider '" + st->svc.provider->name()
                               + "' called tools the thread cannot keep: "
                               + describe(err)));
    auto calls = assistant.tool_calls;
    self_->request(st->thread, opt().step_timeout, caf::add_atom::value,
                   std::move(assistant), st->lease)
      .then(
        [this, st, interrupted, text, calls](uint64_t count) {
          st->res.turns = count;
          st->res.reply = text;
          st->res.tool_calls = calls;
          st->res.interrupted = interrupted;
          if (interrupted)
            spdlog::info("exchange: thread_id='{}' client went away; stored "
                         "{} bytes of the reply as interrupted",
                         st->res.thread_id, st->res.reply.size());
          st->replied = true;
          if (st->cb.on_reply)
            guarded([&] { st->cb.on_reply(st->res); });
          // The thread is free for its next message now: that one reads
          // this exchange from the history, not from long-term memory.
          // Compaction starts after the reply too: nothing the client
          // waits for waits for it.
          release([this, st] {
            if (st->svc.compaction)
              st->svc.compaction->request(st->res.thread_id, st->summary_upto,
                                          st->left_out_upto);
            remember();
          });
        },
        [this, st](caf::error& err) {
          fail(wrap(err, "cannot store the assistant turn in thread '"
                           + st->res.thread_id + "'"));
        });
  }

  // 7. Long-term memory, after the reply went out and the thread was
  // released: neither the client nor the thread's next message waits for
  // it. The exchange ends (`done`) once it is stored.
  void remember() {
    auto st = st_;
    if (!(st->build.options.memory && st->svc.memory
          && !st->res.interrupted && !st->req.after_tool_results))
      return finish();
    std::string entry = "User: " + st->req.content
                        + "\nAssistant: " + st->res.reply;
    if (entry.size() > max_memory_content) {
      // Budgeted again at retrieval; cut on a UTF-8 character boundary.
      auto end = max_memory_content;
      while (end > 0
             && (static_cast<unsigned char>(entry[end]) & 0xC0) == 0x80)
        --end;
      entry.resize(end);
    }
    self_->request(st->svc.memory, opt().step_timeout, caf::put_atom::value,
                   memory_atom::value, std::move(entry),
                   memory_tags(st->req.user_id, st->res.thread_id))
      .then([this](int64_t) { finish(); },
            [this, st](caf::error& err) {
              spdlog::warn("exchange: memory of thread '{}' not stored: {}",
                           st->res.thread_id, describe(err));
              finish();
            });
  }

  void finish() {
    release([this, st = st_] {
      if (!st->finished) {
        st->finished = true;
        if (st->cb.done)
          st->cb.done(st->res);
      }
      self_->quit();
    });
  }

  // Ends the exchange with an error. The user turn, if stored, stays.
  void fail(caf::error err) {
    // A call that failed is charged nothing more; its slots free.
    if (st_->grant)
      st_->grant->settle(0);
    if (st_->slot)
      st_->slot->settle(0);
    release([this, st = st_, err = std::move(err)]() mutable {
      // A call the tenant's limits refused stores nothing: a thread it
      // created (a new ID, "new" or a fork) goes again, empty as it is.
      if (st->refused && st->res.created && !st->dropping) {
        st->dropping = true;
        self_->request(st->svc.registry, opt().step_timeout,
                       caf::delete_atom::value, st->res.thread_id)
          .then([this, err](uint64_t) mutable { fail(std::move(err)); },
                [this, st, err](caf::error& why) mutable {
                  spdlog::warn("exchange: the empty thread '{}' of a refused "
                               "call was not removed: {}",
                               st->res.thread_id, describe(why));
                  fail(std::move(err));
                });
        return;
      }
      if (!st->finished) {
        st->finished = true;
        // After the reply went out only the epilogue can fail: the
        // exchange itself succeeded.
        if (st->cb.done) {
          if (st->replied)
            st->cb.done(st->res);
          else
            st->cb.done(err);
        }
      }
      self_->quit();
    });
  }

  // Releases the lease (if held), then runs `then`.
  template <class F>
  void release(F then) {
    auto st = st_;
    if (!st->held) {
      then();
      return;
    }
    st->held = false;
    if (st->svc.live)
      st->svc.live->let_go(st->res.thread_id, st->cb.flow.get());
    self_->request(st->thread, opt().step_timeout, exchange_end_atom::value,
                   st->lease)
      .then([then](uint64_t) mutable { then(); },
            [st, then](caf::error& err) mutable {
              spdlog::warn("exchange lease {} was not released cleanly: {}",
                           st->lease, describe(err));
              then();
            });
  }

  template <class F>
  static void guarded(F f) {
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::warn("exchange: a callback threw: {}", e.what());
    } catch (...) {
      spdlog::warn("exchange: a callback threw");
    }
  }

  caf::event_based_actor* self_;
  state_ptr st_;
};

} // namespace

void exchange_set::enter(caf::actor x) {
  std::lock_guard<std::mutex> guard{mx_};
  auto id = x.id();
  live_.emplace(id, std::move(x));
}

void exchange_set::leave(caf::actor_id id) {
  caf::actor gone;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto it = live_.find(id);
    if (it == live_.end())
      return;
    gone = std::move(it->second);
    live_.erase(it);
  }
  // `gone` is released outside the lock.
}

void exchange_set::hold(const std::string& thread_id,
                        std::shared_ptr<flow_control> flow) {
  std::lock_guard<std::mutex> guard{mx_};
  holding_[thread_id] = std::move(flow);
}

void exchange_set::let_go(const std::string& thread_id,
                          const flow_control* flow) {
  settle(thread_id, flow);
}

bool exchange_set::cancel(const std::string& thread_id) {
  // Under the lock, so that `settle` sees it or it finds nothing: the
  // flow's abort only posts to the producer's loop.
  std::lock_guard<std::mutex> guard{mx_};
  auto it = holding_.find(thread_id);
  if (it == holding_.end())
    return false;
  return it->second->cancel();
}

bool exchange_set::settle(const std::string& thread_id,
                          const flow_control* flow) {
  std::shared_ptr<flow_control> gone;
  std::lock_guard<std::mutex> guard{mx_};
  auto it = holding_.find(thread_id);
  if (it != holding_.end() && it->second.get() == flow) {
    gone = std::move(it->second);
    holding_.erase(it);
  }
  return flow->cancelled();
}

size_t exchange_set::running() {
  std::lock_guard<std::mutex> guard{mx_};
  return live_.size();
}

void exchange_set::stop_all() {
  std::unordered_map<caf::actor_id, caf::actor> all;
  {
    std::lock_guard<std::mutex> guard{mx_};
    all.swap(live_);
  }
  for (auto& [id, x] : all)
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
}

void spawn_exchange(caf::actor_system& sys, const exchange_services& services,
                    exchange_request request, exchange_callbacks callbacks) {
  auto st = std::make_shared<exchange_state>();
  // Every exchange's reply can be cancelled, whoever started it.
  if (!callbacks.flow)
    callbacks.flow = std::make_shared<flow_control>();
  st->svc = services;
  st->req = std::move(request);
  st->cb = std::move(callbacks);
  sys.spawn([st](caf::event_based_actor* self) -> caf::behavior {
    if (st->svc.live)
      st->svc.live->enter(caf::actor_cast<caf::actor>(self));
    auto x = std::make_shared<exchange>(self, st);
    // An exchange that is stopped (the runtime shuts down) before it ended
    // still reports an end; its lease dies with it (the thread monitors its
    // holder).
    self->attach_functor([st, id = self->id()] {
      if (st->svc.live) {
        st->svc.live->leave(id);
        if (st->held)
          st->svc.live->let_go(st->res.thread_id, st->cb.flow.get());
      }
      if (st->finished)
        return;
      st->finished = true;
      if (st->cb.done) {
        if (st->replied)
          st->cb.done(st->res);
        else
          st->cb.done(
            make_error(errc::unavailable, "the exchange was stopped"));
      }
    });
    x->start();
    return exchange::behavior(x, std::chrono::milliseconds{0});
  });
}

void spawn_exchange(caf::actor_system& sys, const exchange_services& services,
                    exchange_request request, delta_callback on_delta,
                    exchange_done done) {
  exchange_callbacks cb;
  cb.on_delta = std::move(on_delta);
  cb.done = std::move(done);
  spawn_exchange(sys, services, std::move(request), std::move(cb));
}

} // namespace spindle
