// OpenAI-compatible chat completions: POST /v1/chat/completions in OpenAI's
// request and response formats, streamed as OpenAI streams, so that the
// OpenAI SDKs talk to spindle unchanged (docs/api.md, "OpenAI-compatible
// chat completions"). With a thread (a `thread_id` field or a
// Spindle-Thread-Id header) spindle keeps the conversation; without one it
// passes the messages through to its provider.

#include <chrono>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <spdlog/spdlog.h>

#include "metrics.hpp"
#include "auth.hpp"
#include "tenancy/principal.hpp"
#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"
#include "core/logging.hpp"
#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "llm/usage.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

// OpenAI request fields handed to the provider as they are.
constexpr const char* passed_through[] = {
  "temperature",      "top_p",           "stop",
  "presence_penalty", "frequency_penalty", "seed",
  "logit_bias",       "user",            "response_format",
  "max_completion_tokens", "parallel_tool_calls"};

// OpenAI request fields accepted and not used: they change nothing in a
// single text reply (storage and tracing options of OpenAI's service).
constexpr const char* ignored[] = {"store", "metadata", "service_tier"};

// spindle's own fields (sent by OpenAI SDKs as extra body fields).
constexpr const char* spindle_fields[] = {"thread_id", "user_id",
                                          "on_conflict", "max_turns"};

constexpr const char* thread_header = "Spindle-Thread-Id";

constexpr int64_t max_max_turns = 100000;

[[noreturn]] void invalid(std::string message, std::string param) {
  throw api_error{400, "invalid_argument", std::move(message),
                  std::move(param)};
}

template <size_t N>
bool listed(const char* const (&names)[N], const std::string& key) {
  for (auto* name : names)
    if (key == name)
      return true;
  return false;
}

// Drops the fields of object `x` that are not in `names`.
void keep_only(json& x, std::initializer_list<const char*> names) {
  if (!x.is_object())
    return;
  for (auto it = x.begin(); it != x.end();) {
    bool kept = false;
    for (auto* name : names)
      kept = kept || it.key() == name;
    it = kept ? std::next(it) : x.erase(it);
  }
}

struct chat_request {
  std::vector<chat_message> messages;
  std::string model;
  bool stream = false;
  /// `stream_options.include_usage`: the stream ends with OpenAI's usage
  /// chunk.
  bool include_usage = false;
  completion_options completion;
  // With a thread: the thread (or "new"), the new user message, the
  // system prompt the request brings (empty: the builder's).
  bool threaded = false;
  std::string thread_id;
  std::string content;
  // Or, instead of a new user message, the tool results that end the
  // messages: appended to the thread, then the reply follows them.
  std::vector<turn> tool_results;
  std::string system_prompt;
  std::string user_id;
  conflict_policy on_conflict = conflict_policy::queue;
  uint64_t max_turns = builder_default_max_turns;
};

chat_request parse_chat(const request& req) {
  if (req.body.empty())
    throw api_error{400, "malformed",
                    "the request body must be a JSON object; it is empty"};
  auto body = json::parse(req.body, nullptr, false);
  if (body.is_discarded())
    throw api_error{400, "malformed", "the body is not valid JSON"};
  if (!body.is_object())
    throw api_error{400, "malformed", "the body must be a JSON object"};
  chat_request out;
  json parameters = json::object();
  for (auto& [key, value] : body.items()) {
    if (key == "model" || key == "messages" || key == "stream"
        || key == "max_tokens" || key == "n" || key == "logprobs"
        || key == "top_logprobs" || key == "tools" || key == "tool_choice"
        || key == "functions" || key == "function_call"
        || key == "modalities" || key == "stream_options"
        || listed(ignored, key)
        || listed(spindle_fields, key))
      continue;
    if (listed(passed_through, key)) {
      parameters[key] = value;
      continue;
    }
    throw api_error{400, "unknown_field",
                    "unrecognized request argument supplied: "
                      + key.substr(0, 64),
                    key.substr(0, 64)};
  }
  out.model = required_string(body, "model");
  if (out.model.empty())
    invalid("model must not be empty", "model");
  out.completion.model = out.model;
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      invalid("stream must be a boolean", "stream");
    out.stream = it->get<bool>();
  }  // Read when streaming (OpenAI's own answer refuses it otherwise; it is
  // accepted and changes nothing here, as before it was read).
  if (auto it = body.find("stream_options");
      it != body.end() && !it->is_null()) {
    if (!it->is_object())
      invalid("stream_options must be an object", "stream_options");
    for (auto& [key, value] : it->items()) {
      if (key != "include_usage" && key != "include_obfuscation")
        throw api_error{400, "unknown_field",
                        "unrecognized request argument supplied: "
                        "stream_options." + key.substr(0, 64),
                        "stream_options." + key.substr(0, 64)};
      if (!value.is_boolean() && !value.is_null())
        invalid("stream_options." + key + " must be a boolean",
                "stream_options." + key);
    }
    auto usage = it->find("include_usage");
    out.include_usage = out.stream && usage != it->end()
                        && usage->is_boolean() && usage->get<bool>();
  }

  if (auto n = optional_int(body, "max_tokens")) {
    if (*n < 1 || *n > 1000000)
      invalid("max_tokens must be between 1 and 1000000", "max_tokens");
    out.completion.max_tokens = static_cast<uint32_t>(*n);
  }
  if (auto n = optional_int(body, "n"); n && *n != 1)
    invalid("n must be 1: spindle generates one choice", "n");
  if (auto it = body.find("logprobs");
      it != body.end() && !it->is_null() && *it != false)
    invalid("logprobs are not supported", "logprobs");
  if (auto it = body.find("functions"); it != body.end() && !it->is_null()
                                        && !(it->is_array() && it->empty()))
    invalid("functions (OpenAI's deprecated form) are not supported: send "
            "tools",
            "functions");
  parse_tools(body, out.completion.tools, out.completion.tool_choice);
  if (auto it = body.find("modalities"); it != body.end() && !it->is_null()
                                         && *it != json::array({"text"}))
    invalid("modalities must be [\"text\"]", "modalities");
  if (!parameters.empty())
    out.completion.parameters = dump(parameters);

  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty())
    invalid("messages must be a non-empty array", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    auto& m = (*messages)[i];
    auto param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      invalid(param + " must be an object", param);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      invalid(param + ".role must be a string", param + ".role");
    auto r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant"
        && r != "tool")
      invalid(param + ".role must be system, developer, user, assistant or "
                      "tool, not '"
                + r.substr(0, 32) + "'",
              param + ".role");
    chat_message msg;
    msg.role = r;
    if (auto calls = m.find("tool_calls");
        calls != m.end() && !calls->is_null()) {
      if (r != "assistant")
        invalid(param + ".tool_calls belong to assistant messages only",
                param + ".tool_calls");
      // A call's other fields (a client's own, such as the Node SDK's
      // parsed_arguments) are left out, as OpenAI leaves them.
      auto known = *calls;
      if (known.is_array())
        for (auto& c : known) {
          keep_only(c, {"id", "type", "function"});
          if (c.is_object() && c.contains("function"))
            keep_only(c["function"], {"name", "arguments"});
        }
      auto parsed = tool_calls_from_json(dump(known));
      if (!parsed)
        invalid(param + ": " + describe(parsed.error()),
                param + ".tool_calls");
      msg.tool_calls = std::move(*parsed);
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (msg.tool_calls.empty())
        invalid(param + ".content is required", param + ".content");
    } else {
      msg.content = chat_content_text(*content, param + ".content");
    }
    if (auto err = validate_tool_calls(msg.tool_calls, msg.content.size()))
      invalid(param + ": " + describe(err), param + ".tool_calls");
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string() || id->get<std::string>().empty())
        invalid(param + ".tool_call_id is required for a tool message",
                param + ".tool_call_id");
      msg.tool_call_id = id->get<std::string>();
    }
    out.messages.push_back(std::move(msg));
  }

  // The thread: the body's field or the header (the same when both).
  auto field = optional_string(body, "thread_id");
  auto header = req.get_header_value(thread_header);
  if (field && !header.empty() && *field != header)
    invalid("thread_id and the Spindle-Thread-Id header name different "
            "threads",
            "thread_id");
  if (field || !header.empty()) {
    out.threaded = true;
    out.thread_id = field ? *field : header;
    // Checked here, qualified once the thread is known (a new one's ID
    // is drawn later).
    (void)scoped_thread(req, out.thread_id);
    auto& last = out.messages.back();
    if (last.role == "tool") {
      // The results of the thread's last calls: the turns after the
      // assistant message that made them are new.
      auto first = out.messages.size();
      while (first > 0 && out.messages[first - 1].role == "tool")
        --first;
      for (auto i = first; i < out.messages.size(); ++i)
        out.tool_results.push_back(make_tool_turn(
          out.messages[i].content, out.messages[i].tool_call_id));
    } else if (last.role != "user") {
      invalid("with a thread, the last message must be the user's new "
              "message or the results of the thread's tool calls (spindle "
              "keeps the earlier turns)",
              "messages");
    }
    out.content = out.tool_results.empty() ? last.content : std::string{};
    // Leading system (or developer) messages replace the system prompt.
    for (auto& m : out.messages) {
      if (m.role != "system" && m.role != "developer")
        break;
      if (!out.system_prompt.empty())
        out.system_prompt += "\n\n";
      out.system_prompt += m.content;
    }
  }
  out.user_id
    = scoped_user(req, optional_string(body, "user_id").value_or(""));
  if (auto policy = optional_string(body, "on_conflict")) {
    auto parsed = parse_conflict_policy(*policy);
    if (!parsed)
      fail(parsed.error());
    out.on_conflict = *parsed;
  }
  if (auto n = optional_int(body, "max_turns")) {
    if (*n < 2 || *n > max_max_turns)
      invalid("max_turns must be between 2 and "
                + std::to_string(max_max_turns),
              "max_turns");
    out.max_turns = static_cast<uint64_t>(*n);
  }
  if (!out.threaded && (body.contains("user_id") || body.contains("on_conflict")
                        || body.contains("max_turns")))
    invalid("user_id, on_conflict and max_turns need a thread (thread_id or "
            "the Spindle-Thread-Id header)",
            "thread_id");
  return out;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

// OpenAI's `usage` object (null when nothing counted the exchange).
json openai_usage(const turn_usage& u) {
  if (!u.known())
    return nullptr;
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.total_tokens()}};
}

// What a call without a thread spent: the upstream's figures, else its
// messages and reply counted with the runtime's encoding.
turn_usage stateless_usage(const runtime& rt,
                           const std::vector<chat_message>& messages,
                           const completion& c) {
  auto counter = rt.token_counter();
  uint64_t prompt = 0;
  if (counter && !c.usage_reported) {
    prompt = reply_primer_tokens;
    for (auto& m : messages)
      prompt += count_message_tokens(*counter, m);
  }
  return call_usage(c, counter.get(), prompt);
}

// What every object of one response shares.
struct completion_head {
  std::string id;
  int64_t created;
  std::string model;
  std::string thread_id; // empty: stateless
  /// Every chunk carries `"usage": null`, and a last chunk the usage.
  bool include_usage = false;

  json base(const char* object) const {
    json out{{"id", id},
             {"object", object},
             {"created", created},
             {"model", model},
             {"system_fingerprint", nullptr}};
    if (!thread_id.empty())
      out["thread_id"] = thread_id;
    return out;
  }

  json whole(const std::string& text, bool interrupted,
             const std::vector<tool_call>& calls,
             const turn_usage& usage) const {
    auto out = base("chat.completion");
    json message{
      {"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
    if (!calls.empty()) {
      message["tool_calls"] = json::parse(tool_calls_to_json(calls));
      if (text.empty())
        message["content"] = nullptr;
    }
    out["choices"] = json::array(
      {{{"index", 0},
        {"message", std::move(message)},
        {"logprobs", nullptr},
        {"finish_reason", finish_reason(calls)}}});
    out["usage"] = openai_usage(usage);
    if (interrupted)
      out["interrupted"] = true;
    return out;
  }

  static const char* finish_reason(const std::vector<tool_call>& calls) {
    return calls.empty() ? "stop" : "tool_calls";
  }

  // A piece of a tool call as OpenAI streams it: `id`, `type` and the
  // name with the call's first piece, then fragments of its arguments.
  std::string call_chunk(const tool_call_delta& piece) const {
    json fn{{"arguments", piece.arguments}};
    json entry{{"index", piece.index}};
    if (!piece.id.empty()) {
      entry["id"] = piece.id;
      entry["type"] = "function";
    }
    if (!piece.name.empty())
      fn["name"] = piece.name;
    entry["function"] = std::move(fn);
    return chunk({{"tool_calls", json::array({std::move(entry)})}}, nullptr);
  }

  std::string chunk(json delta, const char* finish) const {
    auto out = base("chat.completion.chunk");
    out["choices"] = json::array(
      {{{"index", 0},
        {"delta", std::move(delta)},
        {"logprobs", nullptr},
        {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    if (include_usage)
      out["usage"] = nullptr;
    return "data: " + dump(out) + "\n\n";
  }

  // OpenAI's last chunk with `stream_options.include_usage`: no choices,
  // the usage of the whole request ("" when not asked for).
  std::string usage_chunk(const turn_usage& usage) const {
    if (!include_usage)
      return {};
    auto out = base("chat.completion.chunk");
    out["choices"] = json::array();
    out["usage"] = openai_usage(usage);
    return "data: " + dump(out) + "\n\n";
  }
};

std::string error_event(const api_error& e) {
  json body{{"error",
             {{"code", e.code},
              {"message", e.message},
              {"type", error_type(e.status)},
              {"param", nullptr}}}};
  return "data: " + dump(body) + "\n\n";
}

std::vector<std::pair<std::string, std::string>>
stream_headers(const completion_head& head) {
  std::vector<std::pair<std::string, std::string>> h{
    {"Cache-Control", "no-cache"}};
  if (!head.thread_id.empty())
    h.emplace_back(thread_header, head.thread_id);
  return h;
}

// Starts the exchange; tool results the request brings are appended to
// the thread first (checked as POST /v1/threads/{id}/turns checks them),
// on a worker, as that waits for the thread.
void start(router& r, const std::shared_ptr<async_call>& call,
           std::vector<turn> tool_results, exchange_request x,
           exchange_callbacks cb) {
  if (tool_results.empty()) {
    r.rt().start_exchange(std::move(x), std::move(cb));
    return;
  }
  boost::asio::post(r.workers(), [&r, call, turns = std::move(tool_results),
                                  x = std::move(x),
                                  cb = std::move(cb)]() mutable {
    auto appended = r.rt().append_turns(x.thread_id, std::move(turns));
    if (!appended) {
      call->fail(appended.error());
      return;
    }
    r.rt().start_exchange(std::move(x), std::move(cb));
  });
}

// A conversation spindle keeps: an exchange on the thread.
void threaded(router& r, std::shared_ptr<async_call> call, chat_request c,
              completion_head head) {
  exchange_request x;
  x.thread_id = c.thread_id;
  x.content = std::move(c.content);
  x.user_id = std::move(c.user_id);
  x.on_conflict = c.on_conflict;
  x.build.max_turns = c.max_turns;
  x.build.system_prompt = std::move(c.system_prompt);
  x.completion = std::move(c.completion);
  x.after_tool_results = !c.tool_results.empty();
  auto* metrics = &r.metrics();
  exchange_callbacks cb;
  cb.on_limits = limits_to(call);
  auto shared_head = std::make_shared<completion_head>(std::move(head));
  if (!c.stream) {
    cb.on_reply = [call, metrics, shared_head](const exchange_result& res) {
      call->ctx.log["thread_id"] = res.thread_id;
      call->ctx.log["turns"] = res.turns;
      metrics->count("turns", 2);
      metrics->count_usage(static_cast<uint8_t>(res.usage.source),
                           res.usage.prompt_tokens,
                           res.usage.completion_tokens);
      response out;
      reply(out, 200,
            shared_head->whole(res.reply, res.interrupted || res.cancelled,
                               res.tool_calls, res.usage));
      out.set_header(thread_header, local(call->req(), res.thread_id));
      call->send(std::move(out));
    };
    cb.done = [call](caf::expected<exchange_result> res) {
      if (!res)
        call->fail(res.error());
    };
    start(r, call, std::move(c.tool_results), std::move(x), std::move(cb));
    return;
  }
  cb.on_held = [call, shared_head](const exchange_result&) {
    call->ctx.log["streamed"] = true;
    call->begin_stream(200, "text/event-stream",
                       stream_headers(*shared_head));
    call->write(shared_head->chunk({{"role", "assistant"}, {"content", ""}},
                                   nullptr));
  };
  cb.on_delta = [call, shared_head](std::string_view delta) {
    return call->write(
      shared_head->chunk({{"content", std::string{delta}}}, nullptr));
  };
  cb.on_tool_call = [call, shared_head](const tool_call_delta& piece) {
    return call->write(shared_head->call_chunk(piece));
  };
  // Waiting for the upstream's room: an SSE comment, which OpenAI's
  // clients skip (docs/limits.md, "The upstream").
  cb.on_queued = [call](const upstream_place& place) {
    call->write(": queued position=" + std::to_string(place.position)
                + " waiting=" + std::to_string(place.waiting) + "\n\n");
  };
  cb.flow = call->flow();
  cb.on_reply = [call, metrics, shared_head](const exchange_result& res) {
    request_context line;
    line.log["thread_id"] = res.thread_id;
    line.log["turns"] = res.turns;
    line.log["interrupted"] = res.interrupted;
    metrics->count("turns", 2);
    metrics->count_usage(static_cast<uint8_t>(res.usage.source),
                         res.usage.prompt_tokens,
                         res.usage.completion_tokens);
    spdlog::info(log_fields("chat_completion", line.log));
    call->write(shared_head->chunk(
      json::object(), completion_head::finish_reason(res.tool_calls)));
    if (shared_head->include_usage)
      call->write(shared_head->usage_chunk(res.usage));
    call->write("data: [DONE]\n\n");
    call->end_stream();
  };
  cb.done = [call](caf::expected<exchange_result> res) {
    if (res)
      return;
    auto e = scrubbed(to_api_error(res.error()), call->req());
    call->fail(e); // before the stream started; a no-op after
    call->write(error_event(e));
    call->end_stream();
  };
  start(r, call, std::move(c.tool_results), std::move(x), std::move(cb));
}

// A call without a thread, from the upstream's fair queue to its end:
// sent once the queue has room (waiting at most the queue timeout), sent
// again (twice at most, first of its tenant) when the upstream refuses it
// for its load, as an exchange is (docs/limits.md, "When the upstream
// refuses"). A stream starts once the call is first sent.
class stateless_run : public std::enable_shared_from_this<stateless_run> {
public:
  stateless_run(router& r, std::shared_ptr<async_call> call, chat_request c,
                completion_head head, admission::grant_ptr granted,
                std::string tenant, uint64_t prompt_tokens)
    : r_(r),
      call_(std::move(call)),
      head_(std::make_shared<completion_head>(std::move(head))),
      granted_(std::move(granted)),
      tenant_(std::move(tenant)),
      stream_(c.stream),
      copts_(std::move(c.completion)),
      messages_(std::make_shared<const std::vector<chat_message>>(
        std::move(c.messages))),
      queue_(r.rt().upstream()) {
    if (!queue_)
      return;
    auto& l = queue_->limits();
    reserve_ = granted_ ? granted_->reserved() : 0;
    if (reserve_ == 0)
      reserve_ = prompt_tokens + (copts_.max_tokens != 0 ? copts_.max_tokens
                                                         : l.reply_reserve);
    if (l.tokens_per_min != 0 && copts_.max_tokens == 0)
      copts_.max_tokens = static_cast<uint32_t>(
        std::min<uint64_t>(l.reply_reserve, UINT32_MAX));
  }

  /// Asks the upstream's queue for room (`again`: after a refusal).
  void queue(bool again) {
    if (!queue_)
      return send(nullptr);
    auto decided = std::make_shared<std::atomic<bool>>(false);
    auto timeout = r_.rt().options().conversation.queue_timeout;
    // On a strand of its own: cancelled (there) when the call is sent
    // first, so that it holds nothing past that.
    auto timer = std::make_shared<boost::asio::steady_timer>(
      boost::asio::make_strand(r_.workers()), timeout);
    auto self = shared_from_this();
    auto go = [self, decided, timer](admission::upstream_slot_ptr slot) {
      if (decided->exchange(true))
        return;
      boost::asio::post(timer->get_executor(), [timer] { timer->cancel(); });
      self->send(std::move(slot));
    };
    auto w = queue_->acquire(
      tenant_, reserve_,
      [go](admission::upstream_slot_ptr slot, int64_t) { go(std::move(slot)); },
      again);
    if (w.slot)
      return go(std::move(w.slot));
    boost::asio::post(timer->get_executor(), [self, decided, timer,
                                              ticket = w.ticket, again,
                                              timeout] {
      if (*decided)
        return;
      timer->async_wait([self, decided, ticket, again,
                         timeout](boost::system::error_code ec) {
        if (ec || !self->queue_->withdraw(ticket) || decided->exchange(true))
          return;
        self->granted_.reset();
        self->end(make_error(
          again ? errc::upstream_busy : errc::timeout,
          std::string{again ? "the upstream refused the call and did not "
                              "take it again"
                            : "the upstream had no room for the call"}
            + " within " + std::to_string(timeout.count()) + " ms"));
      });
    });
  }

private:
  void send(admission::upstream_slot_ptr slot) {
    slot_ = std::move(slot);
    auto provider = r_.rt().provider();
    if (!provider)
      provider = std::make_shared<offline_provider>();
    auto copts = copts_;
    copts.timeout = r_.rt().options().conversation.reply_timeout;
    if (!flow_) {
      flow_ = stream_ ? call_->flow() : std::make_shared<flow_control>();
      // A client that goes away stops the upstream call at once.
      call_->on_gone([flow = flow_] { flow->cancel(); });
    }
    copts.flow = flow_;
    if (slot_)
      copts.on_signal = [held = std::weak_ptr<admission::upstream_slot>{
                           slot_}](const upstream_signal& s) {
        if (auto sl = held.lock())
          sl->signal(s);
      };
    delta_callback on_delta;
    if (stream_) {
      if (!streaming_) {
        streaming_ = true;
        call_->ctx.log["streamed"] = true;
        call_->begin_stream(200, "text/event-stream", stream_headers(*head_));
        call_->write(head_->chunk({{"role", "assistant"}, {"content", ""}},
                                  nullptr));
      }
      on_delta = [call = call_, head = head_](std::string_view delta) {
        return call->write(
          head->chunk({{"content", std::string{delta}}}, nullptr));
      };
      copts.on_tool_call = [call = call_,
                            head = head_](const tool_call_delta& piece) {
        return call->write(head->call_chunk(piece));
      };
    }
    completion_done done = [self = shared_from_this()](
                             caf::expected<completion> res) {
      self->ended(std::move(res));
    };
    if (provider->start(*messages_, copts, on_delta, done))
      return;
    // A provider with only the blocking form gets a worker thread.
    boost::asio::post(r_.workers(), [provider, messages = messages_,
                                     copts = std::move(copts),
                                     on_delta = std::move(on_delta),
                                     done = std::move(done)] {
      caf::expected<completion> res = make_error(errc::upstream_failure,
                                                 "the provider failed");
      try {
        res = provider->complete(*messages, copts, on_delta);
      } catch (const std::exception& e) {
        res = make_error(errc::upstream_failure, e.what());
      }
      done(std::move(res));
    });
  }

  void ended(caf::expected<completion> res) {
    if (!res && classify(res.error()) == errc::upstream_busy && slot_
        && retries_ < max_busy_retries && !flow_->cancelled()) {
      ++retries_;
      slot_->settle(0);
      slot_.reset();
      spdlog::info("chat completion: the upstream refused the call ({} of "
                   "{}): {}",
                   retries_, max_busy_retries + 1, describe(res.error()));
      return queue(true);
    }
    end(std::move(res));
  }

  void end(caf::expected<completion> res) {
    turn_usage usage;
    if (res)
      usage = stateless_usage(r_.rt(), *messages_, *res);
    if (granted_)
      granted_->settle(!res ? 0
                       : usage.known() ? usage.total_tokens()
                                       : granted_->reserved());
    if (slot_)
      slot_->settle(!res ? 0
                    : usage.known() ? usage.total_tokens()
                                    : slot_->reserved());
    if (res) {
      r_.metrics().count_usage(static_cast<uint8_t>(usage.source),
                               usage.prompt_tokens, usage.completion_tokens);
      // No turn keeps it: the tenant's counters do, under thread "".
      auto& principal = who(call_->req());
      usage.user_id = principal.is_end_user()
                        ? principal.prefix + principal.user
                        : std::string{};
      r_.rt().record_usage(std::string{tenant_of_id(principal.prefix + "x")},
                           usage);
    }
    if (!streaming_) {
      if (!res)
        return call_->fail(res.error());
      call_->reply(200, head_->whole(res->text, res->interrupted,
                                     res->tool_calls, usage));
      return;
    }
    if (!res) {
      call_->write(error_event(to_api_error(res.error())));
    } else {
      call_->write(head_->chunk(
        json::object(), completion_head::finish_reason(res->tool_calls)));
      if (head_->include_usage)
        call_->write(head_->usage_chunk(usage));
      call_->write("data: [DONE]\n\n");
    }
    call_->end_stream();
  }

  // The upstream refused a call at most this many times before its client
  // hears `upstream_busy`.
  static constexpr int max_busy_retries = 2;

  router& r_;
  std::shared_ptr<async_call> call_;
  std::shared_ptr<completion_head> head_;
  admission::grant_ptr granted_;
  std::string tenant_;
  bool stream_;
  completion_options copts_;
  std::shared_ptr<const std::vector<chat_message>> messages_;
  std::shared_ptr<admission::upstream_queue> queue_;
  uint64_t reserve_ = 0;
  admission::upstream_slot_ptr slot_;
  std::shared_ptr<flow_control> flow_;
  bool streaming_ = false;
  int retries_ = 0;
};

void stateless_upstream(router& r, std::shared_ptr<async_call> call,
                        chat_request c, completion_head head,
                        admission::grant_ptr granted, std::string tenant,
                        uint64_t prompt_tokens) {
  std::make_shared<stateless_run>(r, std::move(call), std::move(c),
                                  std::move(head), std::move(granted),
                                  std::move(tenant), prompt_tokens)
    ->queue(false);
}

// No thread: the messages go to the provider as they are, once the
// tenant's limits admit them (docs/limits.md): counted, reserved and
// settled as an exchange is.
void stateless(router& r, std::shared_ptr<async_call> call, chat_request c,
               completion_head head) {
  auto& principal = who(call->req());
  std::string tenant = principal.tenant.empty() ? std::string{"default"}
                                                : principal.tenant;
  auto count_prompt = [&r](const chat_request& req) {
    uint64_t prompt = reply_primer_tokens;
    if (auto counter = r.rt().token_counter())
      for (auto& m : req.messages)
        prompt += count_message_tokens(*counter, m);
    return prompt;
  };
  auto limiter = r.rt().limiter();
  if (!limiter) {
    auto q = r.rt().upstream();
    auto prompt = q && q->limits().bounded() ? count_prompt(c) : 0;
    return stateless_upstream(r, std::move(call), std::move(c),
                              std::move(head), nullptr, tenant, prompt);
  }
  auto ticket = std::make_shared<admission::request_ticket>();
  auto s = limiter->take_request(tenant, *ticket);
  if (!s.refused_by.empty()) {
    call->add_headers(admission::rate_headers(s));
    return call->fail(
      make_error(errc::rate_limited, admission::refusal_text(s)));
  }
  auto q = r.rt().upstream();
  uint64_t prompt = s.limited || (q && q->limits().bounded())
                      ? count_prompt(c)
                      : 0;
  if (!s.limited)
    return stateless_upstream(r, std::move(call), std::move(c),
                              std::move(head), nullptr, tenant, prompt);
  // A queued call goes on from the thread that freed its slot; the queue
  // timeout withdraws it, unless it was admitted first.
  struct pending {
    router* r;
    std::shared_ptr<async_call> call;
    chat_request c;
    completion_head head;
    std::string tenant;
    uint64_t prompt = 0;
    std::mutex mx;
    bool decided = false;
    /// The queue timeout's, on a strand of its own: cancelled when the
    /// call is admitted first.
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  auto p = std::make_shared<pending>();
  p->r = &r;
  p->call = call;
  p->head = std::move(head);
  auto max_tokens = c.completion.max_tokens;
  p->c = std::move(c);
  p->tenant = tenant;
  p->prompt = prompt;
  auto go = [p](admission::grant_ptr g, const rate_state& state) {
    {
      std::lock_guard<std::mutex> guard{p->mx};
      if (p->decided)
        return;
      p->decided = true;
      if (p->timer)
        boost::asio::post(p->timer->get_executor(),
                          [t = p->timer] { t->cancel(); });
    }
    p->call->add_headers(admission::rate_headers(state));
    if (g && g->reply_bound() != 0 && p->c.completion.max_tokens == 0)
      p->c.completion.max_tokens = static_cast<uint32_t>(
        std::min<uint64_t>(g->reply_bound(), UINT32_MAX));
    stateless_upstream(*p->r, p->call, std::move(p->c), std::move(p->head),
                       std::move(g), p->tenant, p->prompt);
  };
  auto a = limiter->admit(tenant, prompt, max_tokens,
                          [go](admission::grant_ptr g, rate_state st) {
                            go(std::move(g), st);
                          });
  using outcome = admission::admission::outcome;
  switch (a.result) {
    case outcome::admitted:
      return go(std::move(a.granted), a.state);
    case outcome::refused:
    case outcome::too_large:
      limiter->take_back(*ticket);
      call->add_headers(admission::rate_headers(a.state));
      return call->fail(make_error(a.result == outcome::refused
                                     ? errc::rate_limited
                                     : errc::too_large,
                                   a.result == outcome::refused
                                     ? admission::refusal_text(a.state)
                                     : a.why));
    case outcome::queued:
      break;
  }
  auto timeout = r.rt().options().conversation.queue_timeout;
  auto timer = std::make_shared<boost::asio::steady_timer>(
    boost::asio::make_strand(r.workers()), timeout);
  {
    std::lock_guard<std::mutex> guard{p->mx};
    if (!p->decided)
      p->timer = timer;
  }
  boost::asio::post(timer->get_executor(), [p, timer, limiter, ticket, tenant,
                                            waiter = a.waiter,
                                            state = a.state, timeout] {
   {
     std::lock_guard<std::mutex> guard{p->mx};
     if (p->decided) {
       p->timer.reset();
       return;
     }
   }
   timer->async_wait([p, limiter, ticket, tenant, waiter, state,
                      timeout](boost::system::error_code ec) {
    {
      std::lock_guard<std::mutex> guard{p->mx};
      p->timer.reset();
      if (ec || p->decided || !limiter->withdraw(tenant, waiter))
        return;
      p->decided = true;
    }
    limiter->take_back(*ticket);
    p->call->add_headers(admission::rate_headers(state));
    p->call->fail(make_error(errc::timeout,
                             "no slot of the tenant's concurrent_exchanges "
                             "freed within "
                               + std::to_string(timeout.count()) + " ms"));
   });
  });
}

} // namespace

void add_openai_routes(router& r) {
  r.post_async(
    R"(/v1/chat/completions)", "POST /v1/chat/completions",
    [&r](std::shared_ptr<async_call> call) {
      auto c = parse_chat(call->req());
      completion_head head;
      head.id = "chatcmpl-" + make_uuid_v4();
      head.created = unix_seconds();
      head.model = c.model;
      head.include_usage = c.include_usage;
      call->ctx.log["model"] = c.model;
      if (!c.threaded) {
        stateless(r, std::move(call), std::move(c), std::move(head));
        return;
      }
      // A new thread gets its ID here, so the first chunk can carry it;
      // the thread is stored under the tenant's IDs, shown with the
      // client's.
      auto& principal = who(call->req());
      c.thread_id = principal.qualify(c.thread_id == "new" ? make_uuid_v4()
                                                           : c.thread_id);
      head.thread_id = local(call->req(), c.thread_id);
      call->ctx.log["thread_id"] = c.thread_id;
      threaded(r, std::move(call), std::move(c), std::move(head));
    });
}

} // namespace spindle::http
