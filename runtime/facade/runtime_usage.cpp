// The usage counters (docs/usage.md): read by tenant and hour, grouped by
// thread, user or day. Every exchange adds to one row in the same write
// as its assistant turn (actors/src/records.cpp, `count_usage`); nothing
// here reads a turn.

#include <algorithm>
#include <chrono>
#include <string>

#include <caf/logger.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/records.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle {

namespace {

constexpr int64_t hour_s = 3600;
constexpr int64_t day_s = 86400;
constexpr size_t max_usage_groups = 10000;

// The first hour that may hold `from_s`'s usage, and the first that holds
// none of [from_s, to_s): the range widened to whole hours.
int64_t floor_hour(int64_t s) {
  return s >= 0 ? s / hour_s * hour_s : -((-s + hour_s - 1) / hour_s) * hour_s;
}

int64_t ceil_hour(int64_t s) {
  if (s > std::numeric_limits<int64_t>::max() - hour_s)
    return std::numeric_limits<int64_t>::max();
  return floor_hour(s + hour_s - 1);
}

uint64_t count_of(const sql_value& v) {
  return v.type == sql_value::kind::integer && v.integer > 0
           ? static_cast<uint64_t>(v.integer)
           : 0;
}

} // namespace

caf::expected<usage_page> runtime::usage(const usage_query& q) {
  if (!running() || !state_store_)
    return make_error(errc::unavailable, "the runtime has no state store");
  if (q.limit == 0 || q.limit > max_usage_groups)
    return make_error(errc::invalid_argument,
                      "limit must be between 1 and "
                        + std::to_string(max_usage_groups));
  if (q.from_s > q.to_s)
    return make_error(errc::invalid_argument, "from is after to");
  // The key of a group, as SQL computes it.
  std::string key;
  switch (q.group_by) {
    case usage_grouping::none:
      key = "''";
      break;
    case usage_grouping::thread:
      key = "thread_id";
      break;
    case usage_grouping::user:
      key = "user_id";
      break;
    case usage_grouping::day:
      key = "hour - hour % " + std::to_string(day_s);
      break;
  }
  std::vector<sql_value> params;
  params.push_back(sql_value::of(q.tenant));
  params.push_back(sql_value::of(floor_hour(q.from_s)));
  params.push_back(sql_value::of(ceil_hour(q.to_s)));
  std::string where = "tenant = ?1 AND hour >= ?2 AND hour < ?3";
  auto bind = [&params](sql_value v) {
    params.push_back(std::move(v));
    return "?" + std::to_string(params.size());
  };
  if (!q.thread_id.empty())
    where += " AND thread_id = " + bind(sql_value::of(q.thread_id));
  if (!q.user_id.empty())
    where += " AND user_id = " + bind(sql_value::of(q.user_id));
  if (!q.after.empty() && q.group_by != usage_grouping::none) {
    if (q.group_by == usage_grouping::day) {
      int64_t day = 0;
      try {
        size_t used = 0;
        day = std::stoll(q.after, &used);
        if (used != q.after.size())
          throw std::invalid_argument{"after"};
      } catch (const std::exception&) {
        return make_error(errc::invalid_argument,
                          "after must be a day's first second");
      }
      where += " AND hour >= " + bind(sql_value::of(day + day_s));
    } else {
      where += " AND " + key + " > " + bind(sql_value::of(q.after));
    }
  }
  // Each group has a row per source, at most two: enough rows to see
  // whether one more group follows the last one asked for.
  auto rows_wanted = static_cast<int64_t>(2 * q.limit + 2);
  auto sql = "SELECT " + key
             + " AS k, source, CAST(SUM(exchanges) AS BIGINT), "
               "CAST(SUM(prompt_tokens) AS BIGINT), "
               "CAST(SUM(completion_tokens) AS BIGINT) "
               "FROM usage_counters WHERE "
             + where
             + (q.group_by == usage_grouping::none
                  ? std::string{" GROUP BY source ORDER BY source LIMIT "}
                  : " GROUP BY " + key + ", source ORDER BY 1, 2 LIMIT ")
             + bind(sql_value::of(rows_wanted)) + ";";
  auto rows = call<sql_rows>(state_store_, options_.default_timeout,
                             load_atom::value,
                             sql_statement{std::move(sql), std::move(params)});
  if (!rows)
    return rows.error();
  usage_page page;
  for (auto& row : *rows) {
    if (row.size() < 5)
      return make_error(errc::storage_failure,
                        "the state store holds a usage row this build "
                        "cannot read");
    std::string k = row[0].type == sql_value::kind::integer
                      ? std::to_string(row[0].integer)
                      : row[0].text;
    if (page.groups.empty() || page.groups.back().key != k) {
      if (page.groups.size() == q.limit) {
        page.more = true;
        break;
      }
      page.groups.push_back(usage_group{k, {}, {}});
    }
    auto& g = page.groups.back();
    auto source = row[1].type == sql_value::kind::integer ? row[1].integer : 0;
    auto& f = source == static_cast<int64_t>(usage_source::upstream)
                ? g.upstream
                : g.counted;
    f.exchanges += count_of(row[2]);
    f.prompt_tokens += count_of(row[3]);
    f.completion_tokens += count_of(row[4]);
  }
  return page;
}

void runtime::record_usage(const std::string& tenant,
                           const turn_usage& usage) {
  if (!usage.known() || !running() || !state_store_)
    return;
  auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  call_async<uint64_t>(
    state_store_, options_.default_timeout,
    [tenant](caf::expected<uint64_t> done) {
      if (!done)
        spdlog::warn("usage of tenant '{}' not counted: {}", tenant,
                     describe(done.error()));
    },
    store_atom::value,
    sql_write{records::count_usage(tenant, "", usage, now_ms)});
  caf::logger::set_current_actor_system(nullptr);
}

caf::expected<uint64_t> runtime::delete_usage(const std::string& tenant) {
  if (!running() || !state_store_)
    return make_error(errc::unavailable, "the runtime has no state store");
  return call<uint64_t>(
    state_store_, options_.default_timeout, store_atom::value,
    sql_write{make_sql("DELETE FROM usage_counters WHERE tenant = ?1;",
                       tenant)});
}

} // namespace spindle
