// Conversation routes: threads, messages (plain and streamed), history,
// clear, and the context builder's output.

#include <spdlog/spdlog.h>

#include "metrics.hpp"
#include "auth.hpp"
#include "router.hpp"
#include "core/logging.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

constexpr int64_t max_max_turns = 100000;

uint64_t max_turns_of(std::optional<int64_t> value, uint64_t fallback) {
  if (!value)
    return fallback;
  if (*value < 2 || *value > max_max_turns)
    throw api_error{400, "invalid_argument",
                    "max_turns must be between 2 and "
                      + std::to_string(max_max_turns) + ", not "
                      + std::to_string(*value)};
  return static_cast<uint64_t>(*value);
}

// `max_context_tokens`: 1 to the limit here; the builder checks it against
// the reply's reserve. 0: the server's default.
uint64_t context_tokens_of(std::optional<int64_t> value) {
  if (!value)
    return 0;
  if (*value < 1 || *value > static_cast<int64_t>(max_context_tokens_limit))
    throw api_error{400, "invalid_argument",
                    "max_context_tokens must be between 1 and "
                      + std::to_string(max_context_tokens_limit) + ", not "
                      + std::to_string(*value),
                    "max_context_tokens"};
  return static_cast<uint64_t>(*value);
}

json manifest_json(const context_manifest& m,
                   const std::string& rewritten_query) {
  return json{{"encoding", m.encoding},
              {"max_context_tokens", m.max_context_tokens},
              {"reply_tokens", m.reply_tokens},
              {"budget", m.budget},
              {"tokens",
               {{"system", m.system_tokens},
                {"summary", m.summary_tokens},
                {"memory", m.memory_tokens},
                {"history", m.history_tokens},
                {"message", m.message_tokens},
                {"total", m.total_tokens}}},
              {"turns", m.turns},
              {"turns_left_out", m.turns_left_out},
              {"summary_upto", m.summary_upto},
              {"summary_left_out", m.summary_left_out},
              {"memory_entries", m.memory_entries},
              {"memory_left_out", m.memory_left_out},
              {"rewritten_query", rewritten_query},
              {"rewrite_left_out", m.rewrite_left_out}};
}

// What an exchange spent (docs/usage.md): OpenAI's three counts and
// where they came from.
json usage_json(const turn_usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.total_tokens()},
          {"source", to_string(u.source)}};
}

json turn_json(const turn& t) {
  json out{{"role", to_string(t.role)},
           {"content", t.content},
           {"timestamp", t.timestamp_ms}};
  if (!t.tool_call_id.empty())
    out["tool_call_id"] = t.tool_call_id;
  if (t.interrupted)
    out["interrupted"] = true;
  if (!t.tool_calls.empty())
    out["tool_calls"] = json::parse(tool_calls_to_json(t.tool_calls));
  if (t.token_encoding != 0)
    out["tokens"] = t.tokens;
  if (t.usage.known())
    out["usage"] = usage_json(t.usage);
  return out;
}

json turns_json(const std::vector<turn>& turns) {
  json out = json::array();
  for (auto& t : turns)
    out.push_back(turn_json(t));
  return out;
}

json messages_json(const prompt& messages) {
  json out = json::array();
  for (auto m : messages) {
    json msg{{"role", std::string{m.role}},
             {"content", std::string{m.content}}};
    if (!m.tool_call_id.empty())
      msg["tool_call_id"] = std::string{m.tool_call_id};
    if (!m.tool_calls.empty())
      msg["tool_calls"] = json::parse(tool_calls_to_json(m.tool_calls));
    out.push_back(std::move(msg));
  }
  return out;
}

// One turn of a POST .../turns body: OpenAI's message form (`role`,
// `content`, `tool_calls`, `tool_call_id`).
turn turn_of(const json& x, size_t i) {
  auto field = "turns[" + std::to_string(i) + "]";
  if (!x.is_object())
    throw api_error{400, "malformed", field + " must be an object", field};
  for (auto& [key, value] : x.items())
    if (key != "role" && key != "content" && key != "tool_calls"
        && key != "tool_call_id")
      throw api_error{400, "unknown_field",
                      field + " has an unknown field '" + key.substr(0, 64)
                        + "'; a turn has role, content, tool_calls, "
                          "tool_call_id",
                      field + "." + key.substr(0, 64)};
  turn t;
  auto role = x.find("role");
  if (role == x.end() || !role->is_string())
    throw api_error{400, "malformed", field + ".role must be a string",
                    field + ".role"};
  auto parsed = parse_turn_role(role->get<std::string>());
  if (!parsed)
    throw api_error{400, "invalid_argument",
                    field + ".role must be system, user, assistant or tool",
                    field + ".role"};
  t.role = *parsed;
  auto content = x.find("content");
  if (content != x.end() && !content->is_null()) {
    if (!content->is_string())
      throw api_error{400, "malformed",
                      field + ".content must be a string (or null for an "
                              "assistant turn that only calls tools)",
                      field + ".content"};
    t.content = content->get<std::string>();
  }
  auto id = x.find("tool_call_id");
  if (id != x.end() && !id->is_null()) {
    if (!id->is_string())
      throw api_error{400, "malformed", field + ".tool_call_id must be a string",
                      field + ".tool_call_id"};
    t.tool_call_id = id->get<std::string>();
  }
  auto calls = x.find("tool_calls");
  if (calls != x.end() && !calls->is_null()) {
    auto parsed_calls = tool_calls_from_json(calls->dump());
    if (!parsed_calls)
      throw api_error{400, "malformed",
                      field + ": " + describe(parsed_calls.error()),
                      field + ".tool_calls"};
    t.tool_calls = std::move(*parsed_calls);
  }
  return t;
}

// Parses the body of both message routes into an exchange request.
exchange_request message_request(const request& req,
                                 const std::string& thread_id) {
  auto body = parse_body(req, {"content", "user_id", "on_conflict",
                               "max_turns", "max_context_tokens", "tools",
                               "tool_choice"});
  exchange_request x;
  x.thread_id = thread_id;
  x.content = required_string(body, "content");
  x.user_id = scoped_user(req, optional_string(body, "user_id").value_or(""));
  if (auto policy = optional_string(body, "on_conflict")) {
    auto parsed = parse_conflict_policy(*policy);
    if (!parsed)
      fail(parsed.error());
    x.on_conflict = *parsed;
  }
  x.build.max_turns = max_turns_of(optional_int(body, "max_turns"),
                                   builder_default_max_turns);
  x.build.max_context_tokens
    = context_tokens_of(optional_int(body, "max_context_tokens"));
  parse_tools(body, x.completion.tools, x.completion.tool_choice);
  return x;
}

void log_exchange(request_context& ctx, const exchange_result& r) {
  ctx.log["thread_id"] = r.thread_id;
  ctx.log["turns_loaded"] = r.history_turns;
  ctx.log["found_or_created"] = r.created ? "created" : "found";
  ctx.log["thread_actor"] = r.thread_actor_id;
  ctx.log["turns"] = r.turns;
  if (!r.forked_from.empty())
    ctx.log["forked_from"] = r.forked_from;
}

json result_json(const request& req, const exchange_result& r) {
  json out{{"thread_id", local(req, r.thread_id)},
           {"reply", r.reply},
           {"turns", r.turns}};
  if (!r.tool_calls.empty())
    out["tool_calls"] = json::parse(tool_calls_to_json(r.tool_calls));
  if (r.created)
    out["created"] = true;
  if (!r.forked_from.empty())
    out["forked_from"] = local(req, r.forked_from);
  if (r.interrupted)
    out["interrupted"] = true;
  if (r.cancelled)
    out["cancelled"] = true;
  if (r.usage.known())
    out["usage"] = usage_json(r.usage);
  return out;
}

std::string sse(const char* event, const json& data) {
  return std::string{"event: "} + event + "\ndata: " + dump(data) + "\n\n";
}

} // namespace

void add_thread_routes(router& r) {
  auto timeout = [&r] { return r.rt().options().default_timeout; };

  r.post(R"(/v1/threads/([^/]+)/cancel)", "POST /v1/threads/{id}/cancel",
         [&r](const request& req, response& res, request_context& ctx) {
           auto id = path_thread(req, false);
           ctx.log["thread_id"] = id;
           if (!r.rt().cancel_exchange(id))
             throw api_error{409, "conflict",
                             "no message is running on thread '" + id
                               + "' (or its reply was cancelled already)"};
           reply(res, 200, {{"thread_id", local(req, id)}, {"cancelled", true}});
         });

  r.post_async(
    R"(/v1/threads/([^/]+)/messages)", "POST /v1/threads/{id}/messages",
    [&r](std::shared_ptr<async_call> call) {
      auto x = message_request(call->req(), path_thread(call->req(), true));
      call->ctx.log["thread_id"] = x.thread_id;
      auto* metrics = &r.metrics();
      exchange_callbacks cb;
      cb.on_limits = limits_to(call);
      // The reply goes out once the assistant turn is stored, without
      // waiting for long-term memory.
      cb.on_reply = [call, metrics](const exchange_result& result) {
        log_exchange(call->ctx, result);
        metrics->count("turns", 2);
        metrics->count_usage(static_cast<uint8_t>(result.usage.source),
                             result.usage.prompt_tokens,
                             result.usage.completion_tokens);
        call->reply(200, result_json(call->req(), result));
      };
      cb.done = [call](caf::expected<exchange_result> result) {
        if (!result)
          call->fail(result.error());
      };
      r.rt().start_exchange(std::move(x), std::move(cb));
    });

  r.post_async(
    R"(/v1/threads/([^/]+)/messages/stream)",
    "POST /v1/threads/{id}/messages/stream",
    [&r](std::shared_ptr<async_call> call) {
      auto x = message_request(call->req(), path_thread(call->req(), true));
      // A new thread gets its ID here, so the first event can carry it.
      if (local(call->req(), x.thread_id) == "new")
        x.thread_id = who(call->req()).qualify(make_uuid_v4());
      call->ctx.log["thread_id"] = x.thread_id;
      auto requested = x.thread_id;
      auto* metrics = &r.metrics();
      exchange_callbacks cb;
      cb.on_limits = limits_to(call);
      // The first event goes out as soon as the thread is held, before the
      // prompt is built (for a tenant with limits, once it is admitted);
      // an error before it is a plain JSON error.
      cb.on_held = [call, requested](const exchange_result&) {
        call->ctx.log["streamed"] = true;
        call->begin_stream(200, "text/event-stream",
                           {{"Cache-Control", "no-cache"}});
        call->write(sse("thread", {{"thread_id", local(call->req(), requested)}}));
      };
      // Waiting for the upstream's room (docs/limits.md, "The upstream").
      cb.on_queued = [call](const upstream_place& place) {
        call->write(sse("queued", {{"position", place.position},
                                   {"waiting", place.waiting}}));
      };
      cb.on_delta = [call](std::string_view delta) {
        // False stops the generation: nobody is listening.
        return call->write(sse("delta", {{"content", std::string{delta}}}));
      };
      cb.on_tool_call = [call](const tool_call_delta& piece) {
        json data{{"index", piece.index}, {"arguments", piece.arguments}};
        if (!piece.id.empty())
          data["id"] = piece.id;
        if (!piece.name.empty())
          data["name"] = piece.name;
        return call->write(sse("tool_call", data));
      };
      // A client that reads slowly pauses the generation.
      cb.flow = call->flow();
      cb.on_reply = [call, metrics](const exchange_result& result) {
        // The request line was logged when streaming started; the
        // exchange's own line follows now.
        request_context line;
        log_exchange(line, result);
        line.log["interrupted"] = result.interrupted;
        metrics->count("turns", 2);
        metrics->count_usage(static_cast<uint8_t>(result.usage.source),
                             result.usage.prompt_tokens,
                             result.usage.completion_tokens);
        spdlog::info(log_fields("stream_exchange", line.log));
        auto done = result_json(call->req(), result);
        done.erase("reply");
        // A cancelled reply ends with `cancelled` instead of `done`.
        call->write(sse(result.cancelled ? "cancelled" : "done", done));
        call->end_stream();
      };
      cb.done = [call](caf::expected<exchange_result> result) {
        if (result)
          return;
        // Before the stream started: an ordinary error reply (a no-op once
        // streaming); after: an `error` event ends the stream.
        auto e = scrubbed(to_api_error(result.error()), call->req());
        call->fail(e);
        call->write(sse("error", {{"error", {{"code", e.code},
                                             {"message", e.message}}}}));
        call->end_stream();
      };
      r.rt().start_exchange(std::move(x), std::move(cb));
    });

  r.get(R"(/v1/threads/([^/]+)/history)", "GET /v1/threads/{id}/history",
        [&r, timeout](const request& req, response& res,
                      request_context& ctx) {
          auto id = path_thread(req, false);
          auto max_turns = max_turns_of(query_int(req, "max_turns"),
                                        store_default_max_turns);
          ctx.log["thread_id"] = id;
          auto ref = r.rt().call<thread_ref>(r.rt().thread_registry(),
                                             timeout(), caf::get_atom::value,
                                             id);
          if (!ref)
            fail(ref.error());
          if (!ref->found)
            throw api_error{404, "not_found",
                            "thread '" + id + "' does not exist"};
          auto window = r.rt().read_history(id, max_turns);
          if (!window)
            fail(window.error());
          ctx.log["turns_loaded"] = window->turns.size();
          ctx.log["found_or_created"] = "found";
          auto& sum = window->summary;
          reply(res, 200,
                {{"thread_id", local(req, id)},
                 {"turns", turns_json(window->turns)},
                 {"total_turns", window->total_turns},
                 {"summary", sum.upto == 0
                               ? json(nullptr)
                               : json{{"content", sum.content},
                                      {"upto", sum.upto},
                                      {"tokens", sum.tokens},
                                      {"updated", sum.updated_ms}}}});
        });

  r.post(R"(/v1/threads/([^/]+)/turns)", "POST /v1/threads/{id}/turns",
         [&r](const request& req, response& res, request_context& ctx) {
           auto id = path_thread(req, false);
           ctx.log["thread_id"] = id;
           auto body = parse_body(req, {"turns"});
           auto list = body.find("turns");
           if (list == body.end() || !list->is_array())
             throw api_error{400, "malformed",
                             "field 'turns' must be an array of turns",
                             "turns"};
           if (list->size() > max_turn_batch)
             throw api_error{413, "too_large",
                             "turns holds " + std::to_string(list->size())
                               + " turns; a batch appends at most "
                               + std::to_string(max_turn_batch),
                             "turns"};
           std::vector<turn> turns;
           turns.reserve(list->size());
           for (size_t i = 0; i < list->size(); ++i)
             turns.push_back(turn_of((*list)[i], i));
           auto appended = turns.size();
           auto count = r.rt().append_turns(id, std::move(turns));
           if (!count)
             fail(count.error());
           ctx.log["appended"] = appended;
           reply(res, 200, {{"thread_id", local(req, id)},
                            {"appended", appended},
                            {"turns", *count}});
         });

  r.del(R"(/v1/threads/([^/]+)/turns)", "DELETE /v1/threads/{id}/turns",
        [&r](const request& req, response& res,
             request_context& ctx) {
          auto id = path_thread(req, false);
          ctx.log["thread_id"] = id;
          auto cleared = r.rt().clear_thread(id);
          if (!cleared)
            fail(cleared.error());
          reply(res, 200, {{"thread_id", local(req, id)}, {"cleared", *cleared}});
        });

  r.post(R"(/v1/threads/([^/]+)/context)", "POST /v1/threads/{id}/context",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto id = path_thread(req, false);
           auto body = parse_body(req, {"content", "user_id", "max_turns",
                                        "max_context_tokens"});
           auto content = required_string(body, "content");
           auto user = scoped_user(
             req, optional_string(body, "user_id").value_or(""));
           build_options opts;
           opts.max_turns = max_turns_of(optional_int(body, "max_turns"),
                                         builder_default_max_turns);
           opts.max_context_tokens
             = context_tokens_of(optional_int(body, "max_context_tokens"));
           ctx.log["thread_id"] = id;
           auto built = r.rt().build_context(id, user, content, opts);
           if (!built)
             fail(built.error());
           ctx.log["turns_loaded"] = built->history_turns;
           ctx.log["found_or_created"] = built->thread_found ? "found"
                                                             : "not_found";
           reply(res, 200,
                 {{"thread_id", local(req, id)},
                  {"messages", messages_json(built->messages)},
                  {"short_term_history", turns_json(built->short_term_history)},
                  {"memory_snippet", built->memory_snippet},
                  {"rewritten_query", built->rewritten_query},
                  {"thread_found", built->thread_found},
                  {"manifest", manifest_json(built->manifest,
                                             built->rewritten_query)}});
         });
}

} // namespace spindle::http
