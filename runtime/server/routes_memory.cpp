// Long-term memory routes (D8).

#include <optional>

#include "auth.hpp"
#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

// A positive decimal integer, whole; nullopt for anything else.
std::optional<int64_t> positive_int(const std::string& text) {
  auto value = parse_int(text);
  if (!value || *value < 1)
    return std::nullopt;
  return value;
}

json record_json(const request& req, const memory_record& m) {
  json out{{"id", m.id}, {"content", m.content}, {"created", m.created_ms}};
  out["user_id"] = m.user_id.empty() ? json(nullptr) : json(local(req, m.user_id));
  out["thread_id"]
    = m.thread_id.empty() ? json(nullptr) : json(local(req, m.thread_id));
  return out;
}

} // namespace

void add_memory_routes(router& r) {
  r.post(R"(/v1/memories)", "POST /v1/memories",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto body = parse_body(req, {"content", "user_id", "thread_id"});
           auto content = required_string(body, "content");
           // An end user's memory is its own, given or not.
           auto user = scoped_user(
             req, optional_string(body, "user_id").value_or(""));
           auto thread = optional_string(body, "thread_id").value_or("");
           if (user.empty() && thread.empty())
             throw api_error{400, "malformed",
                             "at least one of 'user_id' and 'thread_id' is "
                             "required: a memory belongs to a user or a "
                             "thread"};
           if (!thread.empty())
             thread = scoped_thread(req, thread);
           // Stored under the tenant's IDs; answered with the client's.
           auto tags = memory_tags(user.empty() ? user : local(req, user),
                                   thread.empty() ? thread
                                                  : local(req, thread));
           auto stored
             = r.rt().store_memory(content, memory_tags(user, thread));
           if (!stored)
             fail(stored.error());
           ctx.log["memory_id"] = *stored;
           reply(res, 201, {{"id", *stored}, {"tags", tags}});
         });

  r.get(R"(/v1/memories)", "GET /v1/memories",
        [&r](const request& req, response& res,
             request_context&) {
          only_params(req, {"user_id", "thread_id", "q", "max_chars"});
          no_empty_params(req, {"user_id", "thread_id"});
          auto user = scoped_user(req, req.get_param_value("user_id"));
          auto thread = req.get_param_value("thread_id");
          if (!thread.empty())
            thread = scoped_thread(req, thread);
          auto query = req.get_param_value("q");
          auto max_chars = query_int(req, "max_chars");
          if (max_chars && (*max_chars < 1
                            || *max_chars > int64_t{max_memory_snippet}))
            throw api_error{400, "invalid_argument",
                            "max_chars must be between 1 and 2000"};
          auto snippet = r.rt().retrieve_memory(
            user, thread, query,
            max_chars ? static_cast<uint64_t>(*max_chars)
                      : max_memory_snippet);
          if (!snippet)
            fail(snippet.error());
          reply(res, 200, {{"snippet", snippet->text},
                           {"entries", snippet->entries},
                           {"matched", snippet->matched}});
        });

  r.get(R"(/v1/memories/entries)", "GET /v1/memories/entries",
        [&r](const request& req, response& res, request_context&) {
          only_params(req, {"user_id", "thread_id", "limit", "cursor"});
          no_empty_params(req, {"user_id", "thread_id"});
          memory_list_request lr;
          lr.user_id = scoped_user(req, req.get_param_value("user_id"));
          lr.thread_id = req.get_param_value("thread_id");
          if (!lr.thread_id.empty())
            lr.thread_id = scoped_thread(req, lr.thread_id);
          if (auto limit = query_int(req, "limit")) {
            if (*limit < 1 || *limit > int64_t{max_memory_listing})
              throw api_error{400, "invalid_argument",
                              "limit must be between 1 and "
                                + std::to_string(max_memory_listing),
                              "limit"};
            lr.limit = static_cast<uint64_t>(*limit);
          }
          if (req.has_param("cursor")) {
            // A cursor is what an earlier page's next_cursor said.
            auto cursor = req.get_param_value("cursor");
            auto before = positive_int(cursor);
            if (!before)
              throw api_error{400, "invalid_argument",
                              "cursor '" + cursor.substr(0, 64)
                                + "' was not issued by this route: pass "
                                  "an earlier page's next_cursor",
                              "cursor"};
            lr.before = *before;
          }
          auto page = r.rt().list_memories(lr);
          if (!page)
            fail(page.error());
          json entries = json::array();
          for (auto& m : page->entries)
            entries.push_back(record_json(req, m));
          reply(res, 200,
                {{"entries", std::move(entries)},
                 {"next_cursor", page->next_before > 0
                                   ? json(std::to_string(page->next_before))
                                   : json(nullptr)}});
        });

  r.del(R"(/v1/memories)", "DELETE /v1/memories",
        [&r](const request& req, response& res, request_context& ctx) {
          only_params(req, {"user_id", "thread_id"});
          no_empty_params(req, {"user_id", "thread_id"});
          auto thread = req.get_param_value("thread_id");
          // An end user naming only its thread: that thread's memories
          // stored without a user.
          auto user = who(req).is_end_user() && !thread.empty()
                          && !req.has_param("user_id")
                        ? std::string{}
                        : scoped_user(req, req.get_param_value("user_id"));
          if (!thread.empty())
            thread = scoped_thread(req, thread);
          if (user.empty() == thread.empty())
            throw api_error{400, "invalid_argument",
                            "give user_id (every memory of the user) or "
                            "thread_id (a thread's memories stored without a "
                            "user), one of them",
                            "user_id"};
          auto n = r.rt().delete_memories(user, thread);
          if (!n)
            fail(n.error());
          ctx.log["deleted"] = *n;
          reply(res, 200, {{"deleted", *n}});
        });

  r.del(R"(/v1/memories/([^/]+))", "DELETE /v1/memories/{id}",
        [&r](const request& req, response& res, request_context&) {
          auto& text = req.matches[1];
          auto parsed = positive_int(text);
          if (!parsed)
            throw api_error{400, "invalid_id",
                            "a memory entry's ID is a positive integer, not '"
                              + text.substr(0, 64) + "'"};
          auto id = *parsed;
          // Only an entry of the request's tenant: another's answers as a
          // missing one.
          auto gone = r.rt().delete_memory(id, who(req).thread_prefix);
          if (!gone)
            fail(gone.error());
          if (!*gone)
            throw api_error{404, "not_found",
                            "memory entry " + text + " does not exist"};
          reply(res, 200, {{"id", id}, {"deleted", true}});
        });
}

} // namespace spindle::http
