// GET /v1/usage: what the caller's tenant spent, from the usage counters
// (docs/usage.md); GET /v1/limits: where its limits on the model stand now
// (docs/limits.md). Both are the tenant's fair use of the model.

#include <ctime>
#include <string>

#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "auth.hpp"
#include "router.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"
#include "tenancy/principal.hpp"

namespace spindle::http {

namespace {

const char* gate_name(admission::upstream_queue::gate_state s) {
  using gs = admission::upstream_queue::gate_state;
  switch (s) {
    case gs::open:
      return "open";
    case gs::closed:
      return "closed";
    case gs::probing:
      return "probing";
    case gs::releasing:
      return "releasing";
  }
  return "open";
}


// Two digits at `at` of `s`, or -1.
int digits2(std::string_view s, size_t at) {
  if (at + 2 > s.size() || s[at] < '0' || s[at] > '9' || s[at + 1] < '0'
      || s[at + 1] > '9')
    return -1;
  return (s[at] - '0') * 10 + (s[at + 1] - '0');
}

// `text` as seconds since the Unix epoch: decimal seconds, a day
// (YYYY-MM-DD, its first second, UTC) or a UTC time
// (YYYY-MM-DDTHH:MM:SSZ). nullopt for anything else.
std::optional<int64_t> parse_instant(std::string_view text) {
  if (auto n = parse_int(text))
    return n;
  if (text.size() != 10 && text.size() != 20)
    return std::nullopt;
  if (text[4] != '-' || text[7] != '-')
    return std::nullopt;
  int year = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (text[i] < '0' || text[i] > '9')
      return std::nullopt;
    year = year * 10 + (text[i] - '0');
  }
  int month = digits2(text, 5);
  int day = digits2(text, 8);
  int hour = 0, minute = 0, second = 0;
  if (text.size() == 20) {
    if (text[10] != 'T' || text[13] != ':' || text[16] != ':'
        || text[19] != 'Z')
      return std::nullopt;
    hour = digits2(text, 11);
    minute = digits2(text, 14);
    second = digits2(text, 17);
  }
  if (year < 1970 || month < 1 || month > 12 || day < 1 || day > 31
      || hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0
      || second > 59)
    return std::nullopt;
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  auto t = timegm(&tm);
  // 31 February and the like come back as another day.
  if (tm.tm_mday != day || tm.tm_mon != month - 1)
    return std::nullopt;
  return static_cast<int64_t>(t);
}

std::string utc_text(int64_t s, bool day_only) {
  auto t = static_cast<time_t>(s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char out[32];
  std::strftime(out, sizeof out, day_only ? "%Y-%m-%d" : "%Y-%m-%dT%H:%M:%SZ",
                &tm);
  return out;
}

json figures_json(const usage_figures& f) {
  return {{"exchanges", f.exchanges},
          {"prompt_tokens", f.prompt_tokens},
          {"completion_tokens", f.completion_tokens},
          {"total_tokens", f.prompt_tokens + f.completion_tokens}};
}

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

} // namespace

void add_usage_routes(router& r) {
  r.get(R"(/v1/usage)", "GET /v1/usage",
        [&r](const request& req, response& res, request_context& ctx) {
          only_params(req, {"from", "to", "group_by", "thread_id", "user_id",
                            "limit", "after"});
          no_empty_params(req, {"from", "to", "group_by", "thread_id",
                                "user_id", "limit", "after"});
          usage_query q;
          auto& principal = who(req);
          q.tenant = std::string{tenant_of_id(principal.prefix + "x")};
          auto instant = [&req](const char* name,
                                int64_t otherwise) -> int64_t {
            if (!req.has_param(name))
              return otherwise;
            auto v = parse_instant(req.get_param_value(name));
            // Up to the last second of 9999, as every date-time answered.
            if (!v || *v < 0 || *v > 253402300799)
              throw api_error{400, "invalid_argument",
                              std::string{name}
                                + " must be seconds since the Unix epoch, "
                                  "a day (2026-11-28) or a UTC time "
                                  "(2026-11-28T13:00:00Z)",
                              name};
            return *v;
          };
          q.from_s = instant("from", 0);
          q.to_s = instant("to", now_s() + 1);
          if (q.from_s > q.to_s)
            throw api_error{400, "invalid_argument", "from is after to",
                            "from"};
          auto group = req.get_param_value("group_by");
          if (group.empty())
            q.group_by = usage_grouping::none;
          else if (group == "thread")
            q.group_by = usage_grouping::thread;
          else if (group == "user")
            q.group_by = usage_grouping::user;
          else if (group == "day")
            q.group_by = usage_grouping::day;
          else
            throw api_error{400, "invalid_argument",
                            "group_by must be thread, user or day",
                            "group_by"};
          if (req.has_param("thread_id"))
            q.thread_id
              = scoped_thread(req, req.get_param_value("thread_id"));
          if (req.has_param("user_id"))
            q.user_id = scoped_user(req, req.get_param_value("user_id"));
          if (auto limit = query_int(req, "limit")) {
            if (*limit < 1 || *limit > 10000)
              throw api_error{400, "invalid_argument",
                              "limit must be between 1 and 10000", "limit"};
            q.limit = static_cast<size_t>(*limit);
          }
          if (req.has_param("after")) {
            auto after = req.get_param_value("after");
            switch (q.group_by) {
              case usage_grouping::none:
                throw api_error{400, "invalid_argument",
                                "after needs group_by", "after"};
              case usage_grouping::day: {
                auto day = parse_instant(after);
                if (!day || after.size() != 10)
                  throw api_error{400, "invalid_argument",
                                  "after must be a day (2026-11-28) with "
                                  "group_by=day",
                                  "after"};
                q.after = std::to_string(*day);
                break;
              }
              case usage_grouping::thread:
                q.after = scoped_thread(req, after, "after");
                break;
              case usage_grouping::user:
                q.after = scoped_user(req, after, "after");
                break;
            }
          }
          auto page = r.rt().usage(q);
          if (!page)
            fail(page.error());
          json data = json::array();
          const char* key_name = q.group_by == usage_grouping::thread
                                   ? "thread_id"
                                 : q.group_by == usage_grouping::user
                                   ? "user_id"
                                   : "day";
          // Without grouping, one total, zero when nothing was spent.
          if (q.group_by == usage_grouping::none && page->groups.empty())
            page->groups.push_back(usage_group{});
          for (auto& g : page->groups) {
            usage_figures both{
              g.counted.exchanges + g.upstream.exchanges,
              g.counted.prompt_tokens + g.upstream.prompt_tokens,
              g.counted.completion_tokens + g.upstream.completion_tokens};
            auto item = figures_json(both);
            item["by_source"] = {{"counted", figures_json(g.counted)},
                                 {"upstream", figures_json(g.upstream)}};
            if (q.group_by == usage_grouping::day)
              item[key_name] = utc_text(std::stoll(g.key), true);
            else if (q.group_by != usage_grouping::none)
              item[key_name] = g.key.empty() ? json(nullptr)
                                             : json(local(req, g.key));
            data.push_back(std::move(item));
          }
          ctx.log["groups"] = page->groups.size();
          json out{{"object", "usage"},
                   {"from", utc_text(q.from_s / 3600 * 3600, false)},
                   {"to", utc_text((q.to_s + 3599) / 3600 * 3600, false)},
                   {"group_by", group.empty() ? json(nullptr) : json(group)},
                   {"data", std::move(data)},
                   {"has_more", page->more}};
          reply(res, 200, out);
        });

  // Where the caller's tenant stands: the limits in force, what is left of
  // its rates, its calls running and waiting, and the upstream's queue.
  r.get(R"(/v1/limits)", "GET /v1/limits",
        [&r](const request& req, response& res, request_context&) {
          only_params(req, {});
          auto& principal = who(req);
          std::string tenant{tenant_of_id(principal.prefix + "x")};
          if (tenant.empty())
            tenant = tenancy::default_tenant;
          auto limiter = r.rt().limiter();
          rate_limits l = limiter ? limiter->limits_of(tenant) : rate_limits{};
          auto s = limiter ? limiter->state_of(tenant) : rate_state{};
          auto load = limiter ? limiter->load_of(tenant)
                              : std::pair<uint64_t, uint64_t>{0, 0};
          auto mine_counts = limiter ? limiter->counts_of(tenant)
                                     : admission::limiter::totals{};
          auto window = [](bool on, uint64_t limit, uint64_t remaining,
                           int64_t reset_ms) {
            return on ? json{{"limit", limit},
                             {"remaining", remaining},
                             {"reset_ms", reset_ms}}
                      : json(nullptr);
          };
          auto q = r.rt().upstream();
          auto c = q->counts();
          uint64_t mine = 0;
          for (auto& [t, n] : q->waiting_by_tenant())
            if (t == tenant)
              mine = n;
          auto g = q->gate();
          auto waits = q->counts_of(tenant);
          json upstream = {{"concurrency", q->limits().concurrency},
                           {"tokens_per_min", q->limits().tokens_per_min},
                           {"running", c.running},
                           {"waiting", c.waiting},
                           {"waiting_tenant", mine},
                           {"waited_tenant", waits.queued},
                           {"wait_ms_tenant", waits.waited_ms},
                           {"max_wait_ms_tenant", waits.max_wait_ms},
                           {"gate", gate_name(g.state)},
                           {"reopens_in_ms", g.reopens_in_ms},
                           {"refused", g.refused}};
          reply(res, 200,
                {{"object", "limits"},
                 {"limits",
                  {{"requests_per_min", l.requests_per_min},
                   {"tokens_per_min", l.tokens_per_min},
                   {"concurrent_exchanges", l.concurrent_exchanges},
                   {"max_queued", l.max_queued},
                   {"reply_reserve", l.reply_reserve}}},
                 {"requests", window(s.requests, s.limit_requests,
                                     s.remaining_requests,
                                     s.reset_requests_ms)},
                 {"tokens", window(s.tokens, s.limit_tokens,
                                   s.remaining_tokens, s.reset_tokens_ms)},
                 {"exchanges",
                  {{"running", load.first},
                   {"queued", load.second},
                   {"waited", mine_counts.queued},
                   {"wait_ms", mine_counts.waited_ms},
                   {"max_wait_ms", mine_counts.max_wait_ms}}},
                 {"refused",
                  {{"requests_per_min", mine_counts.refused_requests},
                   {"tokens_per_min", mine_counts.refused_tokens},
                   {"max_queued", mine_counts.refused_queue}}},
                 {"upstream", std::move(upstream)}});
        });
}

} // namespace spindle::http
