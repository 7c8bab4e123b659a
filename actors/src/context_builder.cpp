#include "spindle/actors/context_builder.hpp"

#include <algorithm>
#include <memory>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

// Time a rewriter that honours its own timeout gets to report it before the
// builder stops waiting.
constexpr std::chrono::milliseconds rewrite_grace{250};

struct build_job {
  build_request request;
  caf::typed_response_promise<built_context> promise;
  built_context out;
  /// The history as chat messages, once converted for an inline rewriter
  /// (then moved into the prompt instead of converted again).
  std::vector<chat_message> chat_history;
  bool converted = false;
  int pending = 0; // history and memory reads still out
  bool failed = false;
  /// The snippet's entries; the build's context window in tokens.
  std::vector<int64_t> memory_entries;
  uint64_t memory_tokens = 0; // the snippet's, when its reader counted them
  thread_summary summary;     // the thread's, as read with the history
  uint64_t max_context_tokens = 0;
  /// A resident thread's window, still in its published log: turns
  /// [window_first, window_last) of `view->turns`, read in place and
  /// copied only as far as a prompt keeps them. Null: the window is in
  /// `out.short_term_history`.
  std::shared_ptr<const thread_view> view;
  size_t window_first = 0;
  size_t window_last = 0;
};

using job_ptr = std::shared_ptr<build_job>;

void fail(const job_ptr& job, caf::error err);

size_t window_size(const build_job& job) {
  return job.view ? job.window_last - job.window_first
                  : job.out.short_term_history.size();
}

// Copies a window read in place into `out.short_term_history`.
void materialize(build_job& job) {
  if (!job.view)
    return;
  job.view->turns->copy(job.window_first, job.window_last,
                        job.out.short_term_history);
  job.view.reset();
}

void finish(context_builder_pointer self, const job_ptr& job) {
  auto& st = self->state;
  auto& opts = job->request.options;
  auto& out = job->out;
  if (out.rewritten_query.empty())
    out.rewritten_query = job->request.message;
  const auto& system_prompt = opts.system_prompt.empty()
                                ? st.options.system_prompt
                                : opts.system_prompt;
  if (st.options.tokens) {
    // Fitted to the budget: the history shrinks to what the prompt holds.
    prompt_parts parts;
    parts.system_prompt = system_prompt;
    if (opts.system_prompt.empty()) {
      // The default prompt is counted once per builder.
      if (st.system_tokens == 0)
        st.system_tokens = count_message_tokens(
          *st.options.tokens, chat_message{"system", system_prompt, {}, {}});
      parts.system_tokens = st.system_tokens;
    }
    if (st.memory_prefix_tokens == 0)
      st.memory_prefix_tokens = st.options.tokens->count_text(
        memory_message_prefix);
    parts.memory_prefix_tokens = st.memory_prefix_tokens;
    parts.memory_snippet = std::move(out.memory_snippet);
    parts.memory_entries = std::move(job->memory_entries);
    parts.memory_snippet_tokens = job->memory_tokens;
    parts.summary = std::move(job->summary);
    // The window in place: the log's turns, or those read by message.
    std::vector<const turn*> window;
    window.reserve(window_size(*job));
    if (job->view) {
      auto& log = *job->view->turns;
      for (auto i = job->window_first; i < job->window_last; ++i)
        window.push_back(&log[i]);
    } else {
      for (auto& t : out.short_term_history)
        window.push_back(&t);
    }
    parts.first_index = out.total_turns >= window.size()
                          ? out.total_turns - window.size()
                          : 0;
    parts.original = job->request.message;
    parts.rewritten = out.rewritten_query;
    // A resident thread's turns stay in its log: the prompt keeps the log
    // and reads the turns it holds in place.
    std::shared_ptr<const void> owner;
    if (job->view)
      owner = job->view->turns;
    auto fitted = fit_prompt(*st.options.tokens, job->max_context_tokens,
                             st.options.reply_tokens, parts, window,
                             out.manifest, std::move(owner));
    if (!fitted) {
      fail(job, std::move(fitted.error()));
      return;
    }
    out.messages = std::move(*fitted);
    out.history_turns = out.manifest.turns.size();
    // The turns the prompt keeps, when asked: copied from the log, else
    // moved.
    std::vector<turn> kept;
    if (opts.turns) {
      kept.reserve(out.manifest.turns.size());
      for (auto index : out.manifest.turns) {
        auto i = static_cast<size_t>(index - parts.first_index);
        if (job->view)
          kept.push_back(*window[i]);
        else
          kept.push_back(std::move(out.short_term_history[i]));
      }
    }
    out.short_term_history = std::move(kept);
    job->view.reset();
    if (!out.manifest.memory_left_out)
      out.memory_snippet = std::move(parts.memory_snippet);
    if (out.manifest.rewrite_left_out) {
      out.rewritten_query = job->request.message;
      out.rewrite_fallback = "left out: the contextualized query does not "
                             "fit the token budget";
    }
  } else if (job->converted) {
    // An inline rewriter converted the window: it is in `chat_history`.
    out.history_turns = out.short_term_history.size();
    out.messages = assemble_messages(system_prompt, out.memory_snippet,
                                     std::move(job->chat_history),
                                     job->request.message,
                                     out.rewritten_query);
  } else if (job->view && !opts.turns) {
    // Converted straight from the log: no copy of the turns.
    auto& log = *job->view->turns;
    std::vector<chat_message> chat;
    chat.reserve(window_size(*job));
    for (auto i = job->window_first; i < job->window_last; ++i)
      chat.push_back(to_chat_message(log[i]));
    job->view.reset();
    out.history_turns = chat.size();
    out.messages = assemble_messages(system_prompt, out.memory_snippet,
                                     std::move(chat), job->request.message,
                                     out.rewritten_query);
  } else {
    materialize(*job);
    out.history_turns = out.short_term_history.size();
    out.messages = assemble_messages(system_prompt, out.memory_snippet,
                                     out.short_term_history,
                                     job->request.message,
                                     out.rewritten_query);
  }
  if (!opts.turns)
    out.short_term_history = {};
  job->promise.deliver(std::move(out));
}

void rewrite(context_builder_pointer self, const job_ptr& job) {
  auto& st = self->state;
  if (!job->request.options.rewrite
      || (!st.rewriter && !st.options.inline_rewriter)) {
    finish(self, job);
    return;
  }
  // Nothing to resolve a reference against (a thread's first message, no
  // memory): a rewrite could only return the message, so none is asked
  // and the prompt waits for no model.
  if (window_size(*job) == 0 && job->out.memory_snippet.empty()) {
    job->out.rewrite_fallback = "skipped: no history or memory to resolve "
                                "against";
    finish(self, job);
    return;
  }
  materialize(*job); // the rewriter sees the window as messages
  rewrite_request req;
  req.message = job->request.message;
  req.memory_snippet = job->out.memory_snippet;
  req.history.reserve(job->out.short_term_history.size());
  for (auto& t : job->out.short_term_history)
    req.history.push_back(to_chat_message(t));
  if (st.options.inline_rewriter) {
    rewrite_result res;
    try {
      res = st.options.inline_rewriter(req);
    } catch (const std::exception& e) {
      res = rewrite_result{{}, std::string{"error: the rewriter threw: "}
                                 + e.what()};
    } catch (...) {
      res = rewrite_result{{}, "error: the rewriter threw"};
    }
    if (!res.fallback.empty())
      spdlog::warn("rewrite for thread '{}' fell back to the original "
                   "message: {}",
                   job->request.thread_id, res.fallback);
    job->out.rewritten_query = res.query.empty() ? job->request.message
                                                 : std::move(res.query);
    job->out.rewrite_fallback = std::move(res.fallback);
    job->chat_history = std::move(req.history);
    job->converted = true;
    finish(self, job);
    return;
  }
  self
    ->request(st.rewriter, st.options.rewrite_timeout + rewrite_grace,
              rewrite_atom::value, std::move(req))
    .then(
      [self, job](rewrite_result& res) {
        if (!res.fallback.empty())
          spdlog::warn("rewrite for thread '{}' fell back to the original "
                       "message: {}",
                       job->request.thread_id, res.fallback);
        job->out.rewritten_query = res.query.empty() ? job->request.message
                                                     : std::move(res.query);
        job->out.rewrite_fallback = std::move(res.fallback);
        finish(self, job);
      },
      [self, job](caf::error& err) {
        auto why = classify(err) == errc::timeout ? std::string{"timeout"}
                                                  : "error: " + describe(err);
        spdlog::warn("rewrite for thread '{}' fell back to the original "
                     "message: {}",
                     job->request.thread_id, why);
        job->out.rewritten_query = job->request.message;
        job->out.rewrite_fallback = std::move(why);
        finish(self, job);
      });
}

void read_done(context_builder_pointer self, const job_ptr& job) {
  if (--job->pending == 0 && !job->failed)
    rewrite(self, job);
}

void fail(const job_ptr& job, caf::error err) {
  if (job->failed)
    return;
  job->failed = true;
  job->promise.deliver(std::move(err));
}

void read_history(context_builder_pointer self, const job_ptr& job) {
  auto& st = self->state;
  // A resident thread's published turns: read in place, no message.
  if (st.options.views)
    if (auto view = st.options.views->find(job->request.thread_id)) {
      auto [first, last] = window_bounds(*view,
                                         job->request.options.max_turns);
      job->out.thread_found = true;
      job->out.thread_actor_id = view->actor_id;
      job->out.total_turns = last;
      if (view->summary)
        job->summary = *view->summary;
      job->view = std::move(view);
      job->window_first = first;
      job->window_last = last;
      read_done(self, job);
      return;
    }
  // The registry's read path: it forwards to the thread's `history` or, for
  // an unknown thread, answers an empty window; it never creates. No
  // timeout: the registry answers every request itself (its own waits on
  // the store are bounded) and a dead registry bounces it, while a timed
  // request costs a lock and a wake-up of CAF 0.17's clock thread, twice.
  self
    ->request(st.registry, caf::infinite, caf::get_atom::value,
              history_atom::value, job->request.thread_id,
              job->request.options.max_turns)
    .then(
      [self, job](history_window& w) {
        job->out.thread_found = w.found;
        job->out.thread_actor_id = w.thread_actor_id;
        job->out.total_turns = w.total_turns;
        job->out.short_term_history = std::move(w.turns);
        job->summary = std::move(w.summary);
        read_done(self, job);
      },
      [job](caf::error& err) {
        fail(job, make_error(classify(err),
                             "cannot read the history of thread '"
                               + job->request.thread_id
                               + "': " + describe(err)));
      });
}

void memory_read(context_builder_pointer self, const job_ptr& job,
                 memory_snippet& snippet) {
  job->out.memory_snippet = std::move(snippet.text);
  job->memory_entries = std::move(snippet.ids);
  auto& counter = self->state.options.tokens;
  if (counter && snippet.token_encoding
                   == static_cast<uint8_t>(counter->id()))
    job->memory_tokens = snippet.tokens;
  read_done(self, job);
}

void memory_failed(context_builder_pointer self, const job_ptr& job,
                   const caf::error& err) {
  // Long-term memory is an addition; the conversation goes on without.
  spdlog::warn("memory for thread '{}' is left out: {}",
               job->request.thread_id, describe(err));
  read_done(self, job);
}

void read_memory(context_builder_pointer self, const job_ptr& job) {
  auto& st = self->state;
  memory_query q{job->request.user_id, job->request.thread_id,
                 job->request.message, st.options.memory_max_chars};
  // What a reader keeps answers here, without a message or a thread's
  // wake-up; anything else goes to the memory actor.
  if (st.options.kept_memory)
    if (auto kept = st.options.kept_memory(q)) {
      if (*kept)
        memory_read(self, job, **kept);
      else
        memory_failed(self, job, kept->error());
      return;
    }
  self
    ->request(st.memory, st.options.memory_timeout, caf::get_atom::value,
              memory_atom::value, std::move(q))
    .then(
      [self, job](memory_snippet& snippet) {
        memory_read(self, job, snippet);
      },
      [self, job](caf::error& err) { memory_failed(self, job, err); });
}

} // namespace

context_builder_actor::behavior_type
context_builder(context_builder_pointer self, thread_registry_actor registry,
                memory_actor memory, query_rewriter_actor rewriter,
                context_builder_options options) {
  auto& st = self->state;
  st.registry = std::move(registry);
  st.memory = std::move(memory);
  st.rewriter = std::move(rewriter);
  if (options.memory_max_chars > max_memory_snippet)
    options.memory_max_chars = max_memory_snippet;
  st.options = std::move(options);
  return {
    [self](build_context_atom,
           build_request& request) -> caf::result<built_context> {
      if (auto err = validate_build_request(request))
        return err;
      auto& opts = self->state.options;
      auto context_tokens = request.options.max_context_tokens != 0
                              ? request.options.max_context_tokens
                              : opts.context_tokens;
      if (opts.tokens)
        if (auto err = validate_context_tokens(context_tokens,
                                               opts.reply_tokens))
          return err;
      auto job = std::make_shared<build_job>();
      job->max_context_tokens = context_tokens;
      job->request = std::move(request);
      job->promise = self->make_response_promise<built_context>();
      bool with_memory = job->request.options.memory
                         && static_cast<bool>(self->state.memory);
      job->pending = with_memory ? 2 : 1;
      // History first in program order; both reads run in parallel.
      read_history(self, job);
      if (with_memory)
        read_memory(self, job);
      return job->promise;
    },
  };
}

namespace {

class turn_limited_builder final
  : public context_builder_actor::stateful_base<context_builder_state> {
public:
  using super = context_builder_actor::stateful_base<context_builder_state>;

  turn_limited_builder(caf::actor_config& cfg, thread_registry_actor registry,
                       memory_actor memory, query_rewriter_actor rewriter,
                       context_builder_options options, size_t per_turn)
    : super(cfg),
      registry_(std::move(registry)),
      memory_(std::move(memory)),
      rewriter_(std::move(rewriter)),
      options_(std::move(options)),
      per_turn_(std::max<size_t>(1, per_turn)) {
  }

  behavior_type make_behavior() override {
    return context_builder(this, std::move(registry_), std::move(memory_),
                           std::move(rewriter_), std::move(options_));
  }

  resume_result resume(caf::execution_unit* ctx,
                       size_t max_throughput) override {
    return super::resume(ctx, std::min(max_throughput, per_turn_));
  }

private:
  thread_registry_actor registry_;
  memory_actor memory_;
  query_rewriter_actor rewriter_;
  context_builder_options options_;
  size_t per_turn_;
};

} // namespace

context_builder_actor
spawn_context_builder(caf::actor_system& system,
                      thread_registry_actor registry, memory_actor memory,
                      query_rewriter_actor rewriter,
                      context_builder_options options, size_t per_turn) {
  return system.spawn<turn_limited_builder>(std::move(registry),
                                            std::move(memory),
                                            std::move(rewriter),
                                            std::move(options), per_turn);
}

} // namespace spindle
