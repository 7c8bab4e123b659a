#include "spindle/runtime/rewriter.hpp"

#include <algorithm>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"

namespace spindle {

query_rewriter::~query_rewriter() = default;

bool query_rewriter::identity() const noexcept {
  return false;
}

namespace {

rewrite_result fallback(const rewrite_request& request, std::string why) {
  return rewrite_result{request.message, std::move(why)};
}

} // namespace

// -- offline ------------------------------------------------------------------

std::string offline_rewriter::name() const {
  return "offline";
}

bool offline_rewriter::blocking() const noexcept {
  return false;
}

rewrite_result offline_rewriter::rewrite(const rewrite_request& request) {
  return rewrite_result{request.message, {}};
}

bool offline_rewriter::identity() const noexcept {
  return true;
}

std::shared_ptr<query_rewriter> make_offline_rewriter() {
  return std::make_shared<offline_rewriter>();
}

// -- provider-backed ----------------------------------------------------------

std::vector<chat_message> rewrite_prompt(const rewrite_request& request) {
  std::string instruction
    = "You rewrite the user's latest message into a standalone query. "
      "Resolve pronouns and references (he, his, that, the second one) "
      "using the conversation and the long-term memory. Keep the meaning "
      "and the language of the message; add nothing the user did not ask. "
      "If the message is already standalone, repeat it unchanged. Reply "
      "with the query only.";
  std::string body;
  if (!request.memory_snippet.empty()) {
    body += "Long-term memory:\n";
    body += request.memory_snippet;
    body += "\n\n";
  }
  body += "Conversation:\n";
  if (request.history.empty())
    body += "(none)\n";
  for (auto& m : request.history) {
    body += m.role;
    body += ": ";
    body += m.content;
    body += '\n';
  }
  body += "\nLatest message:\n";
  body += request.message;
  return {chat_message{"system", std::move(instruction), {}},
          chat_message{"user", std::move(body), {}}};
}

llm_rewriter::llm_rewriter(std::shared_ptr<llm_provider> provider,
                           std::chrono::milliseconds timeout,
                           std::string model)
  : provider_(std::move(provider)), timeout_(timeout),
    model_(std::move(model)) {
}

std::string llm_rewriter::name() const {
  return provider_ ? "llm:" + provider_->name() : "llm:none";
}

bool llm_rewriter::blocking() const noexcept {
  return true;
}

rewrite_result llm_rewriter::rewrite(const rewrite_request& request) {
  if (!provider_)
    return fallback(request, "error: no provider");
  completion_options options;
  options.timeout = timeout_;
  options.model = model_;
  options.max_tokens = 256;
  auto start = std::chrono::steady_clock::now();
  caf::expected<completion> out{caf::error{}};
  try {
    out = provider_->complete(rewrite_prompt(request), options, {});
  } catch (const std::exception& e) {
    return fallback(request, std::string{"error: provider threw: "}
                               + e.what());
  } catch (...) {
    return fallback(request, "error: provider threw");
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  if (!out) {
    if (classify(out.error()) == errc::timeout)
      return fallback(request, "timeout");
    return fallback(request, "error: " + describe(out.error()));
  }
  if (elapsed > timeout_)
    return fallback(request, "timeout");
  auto query = trim_model_output(out->text);
  if (query.empty())
    return fallback(request, "empty output");
  if (query.size() > std::max<size_t>(2000, 4 * request.message.size()))
    return fallback(request, "output too long for a query");
  return rewrite_result{std::move(query), {}};
}

// -- the actor ----------------------------------------------------------------

namespace {

struct rewriter_state {
  static inline const char* name = "spindle.query_rewriter";
  std::shared_ptr<query_rewriter> impl;
};

struct rewrite_worker_state {
  static inline const char* name = "spindle.query_rewriter.worker";
};

query_rewriter_actor::behavior_type rewrite_worker(
  query_rewriter_actor::stateful_pointer<rewrite_worker_state> self,
  std::shared_ptr<query_rewriter> impl) {
  return {
    [self, impl](rewrite_atom, const rewrite_request& request) {
      auto result = impl->rewrite(request);
      self->quit(); // one request per worker
      return result;
    },
  };
}

query_rewriter_actor::behavior_type
rewriter(query_rewriter_actor::stateful_pointer<rewriter_state> self,
         std::shared_ptr<query_rewriter> impl) {
  self->state.impl = std::move(impl);
  return {
    [self](rewrite_atom,
           rewrite_request& request) -> caf::result<rewrite_result> {
      auto& served = self->state.impl;
      if (!served->blocking())
        return served->rewrite(request);
      auto worker = self->spawn<caf::detached>(rewrite_worker, served);
      return self->delegate(worker, rewrite_atom::value, std::move(request));
    },
  };
}

} // namespace

query_rewriter_actor
spawn_query_rewriter(caf::actor_system& sys,
                     std::shared_ptr<query_rewriter> impl) {
  if (!impl)
    impl = make_offline_rewriter();
  return sys.spawn(rewriter, std::move(impl));
}

} // namespace spindle
