// Threads as resources: create with metadata, list (a stable walk, newest
// change first), read, change metadata, delete (docs/api.md, "Threads as
// resources"; docs/threads.md, "Threads as resources").

#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "auth.hpp"
#include "router.hpp"
#include "spindle/actors/thread_catalog.hpp"
#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

json thread_json(const request& req, const thread_info& t) {
  json metadata = json::object();
  for (auto& [key, value] : t.metadata)
    metadata[key] = value;
  return json{{"thread_id", local(req, t.thread_id)},
              {"object", "thread"},
              {"created_at", t.created_ms},
              {"updated_at", t.updated_ms()},
              {"turns", t.turns},
              {"metadata", std::move(metadata)}};
}

// -- cursors --------------------------------------------------------------------
//
// A cursor names a walk and a place in it: the walk's snapshot, the time
// its first page was read (a walk lives `thread_walk_ttl`), the place of
// the page's last thread (its version as of the snapshot and its ID), and
// a check over them, so that a cursor that was not issued (edited,
// truncated, made up) is refused instead of walking from a wrong place.
// Form: <snapshot>.<started_ms>.<place>.<check>.<thread_id>, numbers in
// hexadecimal.

struct cursor {
  uint64_t snapshot = 0;
  uint64_t started_ms = 0;
  uint64_t place = 0;
  std::string thread_id;
};

uint64_t check_of(const cursor& c) {
  // FNV-1a over the fields: catches edits, not an adversary (a cursor
  // grants nothing a caller could not list anyway).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  };
  mix(&c.snapshot, sizeof c.snapshot);
  mix(&c.started_ms, sizeof c.started_ms);
  mix(&c.place, sizeof c.place);
  mix(c.thread_id.data(), c.thread_id.size());
  return h & 0xffffffffffull;
}

std::string encode(const cursor& c) {
  char head[96];
  std::snprintf(head, sizeof head, "%" PRIx64 ".%" PRIx64 ".%" PRIx64
                                   ".%" PRIx64 ".",
                c.snapshot, c.started_ms, c.place, check_of(c));
  return head + c.thread_id;
}

[[noreturn]] void bad_cursor(const std::string& text, const std::string& why) {
  throw api_error{400, "invalid_argument",
                  "cursor '" + text.substr(0, 64) + "' " + why
                    + "; pass an earlier page's next_cursor as it was",
                  "cursor"};
}

cursor decode(const request& req, const std::string& text) {
  cursor c;
  uint64_t fields[4];
  size_t at = 0;
  for (auto& field : fields) {
    auto dot = text.find('.', at);
    if (dot == std::string::npos || dot == at || dot - at > 16)
      bad_cursor(text, "was not issued by this server");
    field = 0;
    for (auto i = at; i < dot; ++i) {
      auto ch = text[i];
      int digit = ch >= '0' && ch <= '9'   ? ch - '0'
                  : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                           : -1;
      if (digit < 0)
        bad_cursor(text, "was not issued by this server");
      field = field * 16 + static_cast<uint64_t>(digit);
    }
    at = dot + 1;
  }
  c.snapshot = fields[0];
  c.started_ms = fields[1];
  c.place = fields[2];
  c.thread_id = text.substr(at);
  if (c.snapshot == 0 || !try_scoped_thread(req, c.thread_id)
      || check_of(c) != fields[3] || c.place > c.snapshot)
    bad_cursor(text, "was not issued by this server");
  auto now = static_cast<uint64_t>(unix_time_ms());
  auto ttl = static_cast<uint64_t>(
    std::chrono::milliseconds{thread_walk_ttl}.count());
  if (c.started_ms > now + 60'000)
    bad_cursor(text, "was not issued by this server");
  if (c.started_ms + ttl < now)
    bad_cursor(text, "has expired (a walk lives "
                       + std::to_string(thread_walk_ttl.count())
                       + " s); start again without a cursor");
  return c;
}

// -- bodies -----------------------------------------------------------------------

// The "metadata" object of a body: string values, or null to remove a key
// where `allow_null`.
thread_metadata_patch metadata_of(const json& body, bool allow_null) {
  thread_metadata_patch patch;
  if (!body.contains("metadata") || body["metadata"].is_null())
    return patch;
  auto& m = body["metadata"];
  if (!m.is_object())
    throw api_error{400, "malformed",
                    "field 'metadata' must be an object of strings",
                    "metadata"};
  if (m.size() > 4 * max_metadata_keys)
    throw api_error{413, "too_large",
                    "metadata: at most " + std::to_string(max_metadata_keys)
                      + " keys per thread",
                    "metadata"};
  for (auto& [key, value] : m.items()) {
    if (value.is_string())
      patch.set.emplace(key, value.get<std::string>());
    else if (value.is_null() && allow_null)
      patch.remove.push_back(key);
    else
      throw api_error{400, "malformed",
                      "metadata value of '" + key.substr(0, 64)
                        + "' must be a string"
                        + (allow_null ? " (or null to remove it)" : ""),
                      "metadata"};
  }
  if (auto err = validate_metadata_patch(patch))
    fail(err);
  return patch;
}

} // namespace

void add_thread_resource_routes(router& r) {
  r.post(R"(/v1/threads)", "POST /v1/threads",
         [&r](const request& req, response& res, request_context& ctx) {
           auto body = parse_body(req, {"metadata"}, /*allow_empty=*/true);
           auto patch = metadata_of(body, false);
           auto created = r.rt().create_thread(std::move(patch.set),
                                               who(req).thread_prefix);
           if (!created)
             fail(created.error());
           ctx.log["thread_id"] = created->thread_id;
           ctx.log["found_or_created"] = "created";
           reply(res, 201, thread_json(req, *created));
         });

  r.get(R"(/v1/threads)", "GET /v1/threads",
        [&r](const request& req, response& res, request_context& ctx) {
          thread_list_request lr;
          // The request's tenant's threads only (with tenancy off, the
          // default tenant's: every thread a client could name).
          lr.scoped = true;
          lr.tenant_prefix = who(req).thread_prefix;
          for (auto& [key, value] : req.params) {
            if (key.rfind("metadata.", 0) == 0) {
              auto name = key.substr(9);
              if (auto err = validate_metadata_key(name, "metadata filter"))
                fail(err);
              if (!lr.filters.emplace(name, value).second)
                throw api_error{400, "invalid_argument",
                                "metadata filter '" + name
                                  + "' is given twice",
                                key.substr(0, 80)};
              continue;
            }
            if (key != "limit" && key != "cursor" && key != "updated_after")
              throw api_error{400, "unknown_field",
                              "unknown query parameter '" + key.substr(0, 64)
                                + "'; this route accepts: limit, cursor, "
                                  "updated_after, metadata.KEY",
                              key.substr(0, 64)};
            if (req.params.count(key) > 1)
              throw api_error{400, "invalid_argument",
                              "query parameter '" + key + "' is given twice",
                              key};
          }
          if (auto limit = query_int(req, "limit")) {
            if (*limit < 1 || *limit > static_cast<int64_t>(max_thread_page))
              throw api_error{400, "invalid_argument",
                              "limit must be between 1 and "
                                + std::to_string(max_thread_page),
                              "limit"};
            lr.limit = static_cast<uint64_t>(*limit);
          }
          if (auto after = query_int(req, "updated_after")) {
            if (*after < 0)
              throw api_error{400, "invalid_argument",
                              "updated_after must be milliseconds since the "
                              "Unix epoch, not negative",
                              "updated_after"};
            lr.updated_after_ms = *after;
          }
          auto started = static_cast<uint64_t>(unix_time_ms());
          if (req.has_param("cursor")) {
            auto c = decode(req, req.get_param_value("cursor"));
            lr.snapshot = c.snapshot;
            lr.after_version = c.place;
            lr.after_id = who(req).qualify(c.thread_id);
            started = c.started_ms;
          }
          auto page = r.rt().list_threads(lr);
          if (!page)
            fail(page.error());
          json data = json::array();
          for (auto& t : page->threads)
            data.push_back(thread_json(req, t));
          json next = nullptr;
          if (page->more && !page->threads.empty())
            next = encode(cursor{page->snapshot, started, page->last_version,
                                 local(req, page->threads.back().thread_id)});
          ctx.log["threads"] = page->threads.size();
          reply(res, 200,
                {{"object", "list"},
                 {"data", std::move(data)},
                 {"has_more", page->more},
                 {"next_cursor", std::move(next)}});
        });

  r.get(R"(/v1/threads/([^/]+))", "GET /v1/threads/{id}",
        [&r](const request& req, response& res, request_context& ctx) {
          auto id = path_thread(req, false);
          ctx.log["thread_id"] = id;
          auto info = r.rt().thread_details(id);
          if (!info)
            fail(info.error());
          reply(res, 200, thread_json(req, *info));
        });

  r.patch(R"(/v1/threads/([^/]+))", "PATCH /v1/threads/{id}",
          [&r](const request& req, response& res, request_context& ctx) {
            auto id = path_thread(req, false);
            ctx.log["thread_id"] = id;
            auto body = parse_body(req, {"metadata"});
            if (!body.contains("metadata") || !body["metadata"].is_object())
              throw api_error{400, "malformed",
                              "field 'metadata' is required: an object of "
                              "strings (null to remove a key)",
                              "metadata"};
            auto info = r.rt().update_thread_metadata(
              id, metadata_of(body, true));
            if (!info)
              fail(info.error());
            reply(res, 200, thread_json(req, *info));
          });

  r.post(R"(/v1/threads/([^/]+)/copy)", "POST /v1/threads/{id}/copy",
         [&r](const request& req, response& res, request_context& ctx) {
           auto id = path_thread(req, false);
           ctx.log["thread_id"] = id;
           auto body = parse_body(req, {"at_turn"}, /*allow_empty=*/true);
           std::optional<uint64_t> at_turn;
           if (body.contains("at_turn") && !body["at_turn"].is_null()) {
             auto& n = body["at_turn"];
             if (!n.is_number_integer() || n.get<int64_t>() < 0)
               throw api_error{400, "malformed",
                               "field 'at_turn' must be a whole number of "
                               "turns, 0 or more",
                               "at_turn"};
             at_turn = n.get<uint64_t>();
           }
           auto copy = r.rt().copy_thread(id, at_turn);
           if (!copy)
             fail(copy.error());
           ctx.log["copy"] = copy->thread_id;
           ctx.log["turns"] = copy->turns;
           auto out = thread_json(req, *copy);
           out["copied_from"] = local(req, id);
           reply(res, 201, out);
         });

  r.del(R"(/v1/threads/([^/]+))", "DELETE /v1/threads/{id}",
        [&r](const request& req, response& res, request_context& ctx) {
          auto id = path_thread(req, false);
          ctx.log["thread_id"] = id;
          auto gone = r.rt().delete_thread(id);
          if (!gone)
            fail(gone.error());
          ctx.log["turns"] = gone->turns;
          ctx.log["context_items"] = gone->context_items;
          ctx.log["memories"] = gone->memories;
          res.status = 204;
        });
}

} // namespace spindle::http
