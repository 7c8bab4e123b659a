#include "spindle/runtime/cluster.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "spindle/actors/records.hpp"
#include "spindle/messages/error.hpp"
#include "storage/postgres/postgres.hpp"
#include "storage/sql_connection.hpp"
#include "net/url.hpp"

namespace spindle {

namespace {

using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

int64_t wall_ms() {
  return std::chrono::duration_cast<milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

// The membership's own connection gives up on a silent database instead
// of waiting on a dead socket: connecting, an unanswered packet and a
// statement are each bounded by the lease.
std::string with_bounds(const std::string& url, milliseconds lease) {
  auto ms = std::to_string(lease.count());
  auto secs = std::to_string(std::max<int64_t>(1, lease.count() / 1000));
  if (url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0)
    return url + (url.find('?') == std::string::npos ? "?" : "&")
           + "connect_timeout=" + secs + "&tcp_user_timeout=" + ms
           + "&options=-c%20statement_timeout%3D" + ms;
  return url + " connect_timeout=" + secs + " tcp_user_timeout=" + ms
         + " options='-c statement_timeout=" + ms + "'";
}

// Runs `sql` with `params`; the rows it returned, or an error.
caf::expected<sql_rows> run(sql_connection& db, const std::string& sql,
                            const std::vector<sql_value>& params) {
  return run_query(db, sql, params);
}

// Whether a node at `advertise` (http://host:port) is certainly gone:
// nothing listens there (the connection is refused). A node that answers,
// or cannot be told within a second, may be running.
bool certainly_gone(const std::string& advertise) {
  net::http_origin origin;
  std::string problem;
  if (advertise.empty() || !net::parse_http_url(advertise, origin, problem))
    return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(origin.host.c_str(), origin.port.c_str(), &hints, &found)
      != 0)
    return false;
  bool refused = found != nullptr;
  for (auto* a = found; a != nullptr && refused; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      0);
    if (fd < 0) {
      refused = false;
      break;
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, 1000) == 1 ? 0 : -1;
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc == 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
          && err == ECONNREFUSED)
        rc = -2;
      else if (rc == -1)
        rc = -1; // no answer within a second: cannot tell
    } else if (rc != 0 && errno == ECONNREFUSED) {
      rc = -2;
    }
    ::close(fd);
    refused = rc == -2;
  }
  ::freeaddrinfo(found);
  return refused;
}

// Takes the name over from an incarnation whose lease still runs: only
// when its node is certainly gone (a restart after a crash).
constexpr const char* take_over_sql
  = "UPDATE cluster_nodes SET advertise = ?2, "
    "  incarnation = incarnation + 1, started_ms = ?3, "
    "  heartbeat_at = clock_timestamp(), "
    "  expires_at = clock_timestamp() "
    "    + make_interval(secs => ?4::float8 / 1000), state = 'serving' "
    "WHERE name = ?1 AND incarnation = ?5 "
    "RETURNING incarnation;";

constexpr const char* register_sql
  = "INSERT INTO cluster_nodes AS n (name, advertise, incarnation, "
    "  started_ms, heartbeat_at, expires_at, state) "
    "VALUES (?1, ?2, 1, ?3, clock_timestamp(), "
    "  clock_timestamp() + make_interval(secs => ?4::float8 / 1000), "
    "  'serving') "
    "ON CONFLICT (name) DO UPDATE SET advertise = excluded.advertise, "
    "  incarnation = n.incarnation + 1, started_ms = excluded.started_ms, "
    "  heartbeat_at = excluded.heartbeat_at, "
    "  expires_at = excluded.expires_at, state = 'serving' "
    "WHERE n.expires_at <= clock_timestamp() OR n.state = 'stopped' "
    "RETURNING incarnation;";

constexpr const char* holder_sql
  = "SELECT advertise, incarnation FROM cluster_nodes WHERE name = ?1;";

constexpr const char* renew_sql
  = "UPDATE cluster_nodes SET heartbeat_at = clock_timestamp(), "
    "  expires_at = clock_timestamp() "
    "    + make_interval(secs => ?3::float8 / 1000), state = 'serving' "
    "WHERE name = ?1 AND incarnation = ?2;";

constexpr const char* live_sql
  = "SELECT count(*) FROM cluster_nodes "
    "WHERE state = 'serving' AND expires_at > clock_timestamp();";

constexpr const char* seat_sql
  = "SELECT 1 FROM thread_leases WHERE thread_id = '#scheduler' "
    "  AND node = ?1 AND incarnation = ?2 AND epoch = ?3;";

// The seat's holder, its address, and whether this node may take the seat
// (free, this node's, or its holder's lease ran out): 1 or 0.
constexpr const char* seat_holder_sql
  = "SELECT coalesce(l.node, ''), coalesce(n.advertise, ''), "
    "  (l.node IS NULL OR n.name IS NULL "
    "   OR n.expires_at <= clock_timestamp() "
    "   OR (l.node = ?1 AND l.incarnation = ?2))::int "
    "FROM (SELECT 1 AS one) AS o "
    "LEFT JOIN thread_leases l ON l.thread_id = '#scheduler' "
    "LEFT JOIN cluster_nodes n "
    "  ON n.name = l.node AND n.incarnation = l.incarnation;";

constexpr const char* nodes_sql
  = "SELECT n.name, n.advertise, n.incarnation, n.started_ms, "
    "  (extract(epoch FROM clock_timestamp() - n.heartbeat_at) "
    "    * 1000)::bigint, "
    "  (extract(epoch FROM n.expires_at - clock_timestamp()) "
    "    * 1000)::bigint, "
    "  n.state, "
    "  (SELECT count(*) FROM thread_leases l "
    "    WHERE l.node = n.name AND l.incarnation = n.incarnation "
    "      AND l.thread_id <> '#scheduler'), "
    "  EXISTS (SELECT 1 FROM thread_leases l "
    "    WHERE l.node = n.name AND l.incarnation = n.incarnation "
    "      AND l.thread_id = '#scheduler')::int "
    "FROM cluster_nodes n ORDER BY n.name;";

} // namespace

struct cluster_membership::impl {
  cluster_options options;
  std::unique_ptr<sql_connection> db;
  std::shared_ptr<cluster_standing> standing;
  std::mutex db_mtx; // one statement at a time on `db`
  std::mutex mtx;
  std::condition_variable wake;
  bool stopping = false;
  bool left = false;
  bool lost = false; // the loss of the lease was logged
  std::thread heartbeat;
  std::atomic<uint32_t> live{1}; // nodes serving, as last counted

  // -- the scheduler seat --
  std::mutex seat_mtx; // guards `seat`, `seat_term`, `advertised`
  cluster_membership::seat seat;
  uint64_t seat_term = 0; // the standing's term it was taken in
  std::string advertised; // the address in the node's row now
  std::mutex contend_mtx; // one contention at a time
  std::mutex callback_mtx; // held while `on_seat` runs or is replaced
  std::function<void(uint64_t)> on_seat;

  void notify_seat(uint64_t epoch) {
    std::lock_guard<std::mutex> guard{callback_mtx};
    if (on_seat)
      on_seat(epoch);
  }

  bool seat_term_is(uint64_t term) {
    std::lock_guard<std::mutex> guard{seat_mtx};
    return seat_term == term;
  }

  enum class seat_result { here, elsewhere, failed };

  // Takes the seat or learns its holder (see `contend_for_scheduler`).
  bool contend() {
    return contend_once() == seat_result::here;
  }

  seat_result contend_once() {
    std::lock_guard<std::mutex> contending{contend_mtx};
    auto now = standing->read();
    bool held = false;
    uint64_t epoch = 0;
    {
      std::lock_guard<std::mutex> guard{seat_mtx};
      held = seat.here;
      epoch = seat.epoch;
    }
    if (held && now.live && seat_term_is(now.term)) {
      // Still the seat's epoch? (Another node takes it only once this
      // node's lease ran out on the database's clock, which this node's
      // own deadline should have seen first; if the clocks disagreed
      // beyond the margin, the scheduler's writes are being refused.)
      auto params = who();
      params.push_back(sql_value::of(static_cast<int64_t>(epoch)));
      caf::expected<sql_rows> mine{sql_rows{}};
      {
        std::lock_guard<std::mutex> guard{db_mtx};
        mine = run(*db, seat_sql, params);
      }
      if (!mine || !mine->empty())
        return seat_result::here;
      spdlog::error("cluster: node '{}' finds the scheduler seat taken by "
                    "another node while its own lease ran",
                    options.node_name);
    }
    // Not live, or live again after a lapse (another node may have taken
    // the seat meanwhile): what ran under the seat stops first.
    if (!now.live || held) {
      if (held) {
        {
          std::lock_guard<std::mutex> guard{seat_mtx};
          seat.here = false;
          seat.epoch = 0;
          seat.holder.clear();
          seat.holder_url.clear();
        }
        spdlog::warn("cluster: node '{}' gives up the scheduler seat: its "
                     "lease lapsed, or another node holds the seat",
                     options.node_name);
        notify_seat(0);
        held = false;
      }
      if (!now.live)
        return seat_result::failed;
    }
    // Held by a live node: learn who, without the row lock a take would
    // wait for behind the holder's writes.
    {
      caf::expected<sql_rows> seen{sql_rows{}};
      {
        std::lock_guard<std::mutex> guard{db_mtx};
        seen = run(*db, seat_holder_sql, who());
      }
      if (seen && seen->size() == 1 && (*seen)[0].size() == 3
          && (*seen)[0][2].integer == 0) {
        std::lock_guard<std::mutex> guard{seat_mtx};
        seat.here = false;
        seat.epoch = 0;
        seat.holder = (*seen)[0][0].text;
        seat.holder_url = (*seen)[0][1].text;
        return seat_result::elsewhere;
      }
    }
    auto take = records::acquire_thread_lease(
      cluster_membership::scheduler_key, options.node_name,
      standing->incarnation(), wall_ms());
    caf::expected<sql_rows> rows{sql_rows{}};
    {
      std::lock_guard<std::mutex> guard{db_mtx};
      rows = run(*db, take.sql, take.params);
    }
    if (!rows) {
      spdlog::warn("cluster: node '{}' cannot take the scheduler seat now "
                   "({}); it tries again",
                   options.node_name, describe(rows.error()));
      return seat_result::failed;
    }
    auto answer = records::decode_lease(*rows);
    if (!answer || (answer->epoch == 0 && answer->holder.empty()))
      return seat_result::failed; // raced with another node: ask again
    if (answer->epoch > 0) {
      {
        std::lock_guard<std::mutex> guard{seat_mtx};
        seat.here = true;
        seat.epoch = answer->epoch;
        seat.holder = options.node_name;
        seat.holder_url = advertised;
        seat_term = now.term;
      }
      spdlog::info("cluster: node '{}' holds the scheduler seat (epoch {})",
                   options.node_name, answer->epoch);
      notify_seat(answer->epoch);
      return seat_result::here;
    }
    {
      std::lock_guard<std::mutex> guard{seat_mtx};
      seat.here = false;
      seat.epoch = 0;
      seat.holder = answer->holder;
      seat.holder_url = answer->holder_url;
    }
    return seat_result::elsewhere;
  }

  std::vector<sql_value> who() const {
    return {sql_value::of(options.node_name),
            sql_value::of(static_cast<int64_t>(standing->incarnation()))};
  }

  // How many nodes serve now (the shares of tenants' limits).
  void count_live() {
    caf::expected<sql_rows> rows{sql_rows{}};
    {
      std::lock_guard<std::mutex> guard{db_mtx};
      rows = run(*db, live_sql, {});
    }
    if (!rows || rows->empty() || rows->front().empty())
      return;
    auto n = rows->front().front().integer;
    live = static_cast<uint32_t>(std::clamp<int64_t>(n, 1, 1 << 20));
  }

  // One renewal; false when the node's row is gone or another process
  // took its name (nothing left to renew).
  bool renew(bool& failing) {
    auto params = who();
    params.push_back(sql_value::of(static_cast<int64_t>(options.lease.count())));
    auto sent = clock_type::now();
    caf::expected<sql_rows> done{sql_rows{}};
    int64_t changed = 0;
    {
      std::lock_guard<std::mutex> guard{db_mtx};
      done = run(*db, renew_sql, params);
      if (done)
        changed = db->changes();
    }
    auto& name = options.node_name;
    if (!done) {
      if (!failing)
        spdlog::error("cluster: node '{}' cannot renew its lease: {}", name,
                      describe(done.error()));
      failing = true;
      if (!standing->live() && !lost) {
        lost = true;
        spdlog::error("cluster: node '{}' lost its lease: it serves none of "
                      "its threads until it renews (others take them over)",
                      name);
      }
      return true;
    }
    if (changed == 0) {
      standing->supersede();
      spdlog::critical("cluster: node '{}' (incarnation {}) was replaced by "
                       "a newer process of the same name: it serves no "
                       "thread again; stop it",
                       name, standing->incarnation());
      return false;
    }
    bool lapsed = !standing->live();
    standing->renewed(sent, options.lease - options.margin);
    count_live();
    if (failing || lapsed)
      spdlog::warn("cluster: node '{}' renews its lease again{}", name,
                   lapsed ? "; threads it held before are loaded afresh" : "");
    failing = false;
    lost = false;
    return true;
  }

  void run_heartbeat() {
    bool failing = false;
    std::unique_lock<std::mutex> lock{mtx};
    while (!stopping) {
      wake.wait_for(lock, options.heartbeat, [this] { return stopping; });
      if (stopping)
        break;
      lock.unlock();
      bool more = renew(failing);
      if (more)
        contend();
      lock.lock();
      if (!more)
        break;
    }
  }
};

cluster_membership::cluster_membership(std::unique_ptr<impl> p)
  : impl_(std::move(p)), options_(impl_->options),
    standing_(impl_->standing) {
}

cluster_membership::~cluster_membership() {
  leave();
}

uint32_t cluster_membership::live_nodes() const noexcept {
  return impl_->live.load();
}

caf::error validate_cluster_options(const cluster_options& options) {
  auto& name = options.node_name;
  if (name.empty() || name.size() > 64)
    return make_error(errc::invalid_argument,
                      "the node name must have 1 to 64 characters, not "
                        + std::to_string(name.size()));
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_'
          || c == '-'))
      return make_error(errc::invalid_argument,
                        "the node name '" + name
                          + "' may hold only letters, digits, '.', '_' and "
                            "'-'");
  net::http_origin url;
  std::string problem;
  // Empty: not known yet (a server on port 0 advertises once bound).
  if (options.advertise.empty()) {
  } else if (!net::parse_http_url(options.advertise, url, problem))
    return make_error(errc::invalid_argument,
                      "the advertised URL " + problem);
  else if (url.tls || url.path.size() > 1)
    return make_error(errc::invalid_argument,
                      "the advertised URL must be http://host:port (nodes "
                      "speak plain HTTP to each other; no path), not '"
                        + options.advertise + "'");
  if (options.heartbeat.count() <= 0
      || options.lease < 2 * options.heartbeat + options.margin)
    return make_error(errc::invalid_argument,
                      "the lease (" + std::to_string(options.lease.count())
                        + " ms) must cover two heartbeats ("
                        + std::to_string(options.heartbeat.count())
                        + " ms each) and the margin ("
                        + std::to_string(options.margin.count()) + " ms)");
  return caf::none;
}

caf::expected<std::unique_ptr<cluster_membership>>
cluster_membership::join(const std::string& url, cluster_options options) {
  if (auto err = validate_cluster_options(options))
    return err;
  auto conn = open_postgres(with_bounds(url, options.lease), false);
  if (!conn)
    return conn.error();
  auto p = std::make_unique<impl>();
  p->options = options;
  p->db = std::move(*conn);
  auto& db = *p->db;
  auto give_up = clock_type::now() + options.name_wait;
  bool waited = false;
  for (;;) {
    auto sent = clock_type::now();
    auto rows = run(db, register_sql,
                    {sql_value::of(options.node_name),
                     sql_value::of(options.advertise),
                     sql_value::of(wall_ms()),
                     sql_value::of(
                       static_cast<int64_t>(options.lease.count()))});
    if (!rows)
      return rows.error();
    if (!rows->empty()) {
      auto incarnation = static_cast<uint64_t>((*rows)[0][0].integer);
      p->standing = std::make_shared<cluster_standing>(options.node_name,
                                                       incarnation);
      p->standing->renewed(sent, options.lease - options.margin);
      break;
    }
    auto holder = run(db, holder_sql, {sql_value::of(options.node_name)});
    std::string where = holder && !holder->empty()
                          ? (*holder)[0][0].text
                          : std::string{"?"};
    // The node of the name does not listen at its address any more: it
    // crashed, and this is its restart. Its thread leases go with its
    // incarnation (fenced: an old process that still ran would find its
    // writes refused and its name taken).
    if (holder && !holder->empty() && certainly_gone(where)) {
      sent = clock_type::now();
      auto taken = run(db, take_over_sql,
                       {sql_value::of(options.node_name),
                        sql_value::of(options.advertise),
                        sql_value::of(wall_ms()),
                        sql_value::of(
                          static_cast<int64_t>(options.lease.count())),
                        (*holder)[0][1]});
      if (taken && !taken->empty()) {
        spdlog::warn("cluster: node name '{}' was held by a node that no "
                     "longer answers at {}: taken over",
                     options.node_name, where);
        p->standing = std::make_shared<cluster_standing>(
          options.node_name, static_cast<uint64_t>((*taken)[0][0].integer));
        p->standing->renewed(sent, options.lease - options.margin);
        break;
      }
    }
    if (clock_type::now() >= give_up)
      return make_error(errc::already_exists,
                        "node name '" + options.node_name
                          + "' is held by a running node (advertising "
                          + where
                          + ") whose lease does not run out; stop it or "
                            "choose another --node-name");
    if (!waited)
      spdlog::warn("cluster: node name '{}' is still held by a node "
                   "advertising {}; waiting for its lease to run out",
                   options.node_name, where);
    waited = true;
    std::this_thread::sleep_for(milliseconds{250});
  }
  spdlog::info("cluster: node '{}' (incarnation {}) joined, advertising {}",
               options.node_name, p->standing->incarnation(),
               options.advertise.empty() ? std::string{"once bound"}
                                         : options.advertise);
  p->advertised = options.advertise;
  p->count_live();
  auto* raw = p.get();
  p->heartbeat = std::thread{[raw] { raw->run_heartbeat(); }};
  return std::unique_ptr<cluster_membership>{
    new cluster_membership(std::move(p))};
}

caf::expected<std::vector<cluster_node_info>> cluster_membership::nodes() {
  caf::expected<sql_rows> rows{sql_rows{}};
  {
    std::lock_guard<std::mutex> guard{impl_->db_mtx};
    rows = run(*impl_->db, nodes_sql, {});
  }
  if (!rows)
    return rows.error();
  std::vector<cluster_node_info> out;
  for (auto& row : *rows) {
    if (row.size() != 9)
      continue;
    cluster_node_info n;
    n.name = row[0].text;
    n.advertise = row[1].text;
    n.incarnation = static_cast<uint64_t>(row[2].integer);
    n.started_ms = row[3].integer;
    n.heartbeat_age_ms = row[4].integer;
    n.lease_left_ms = row[5].integer;
    n.state = row[6].text == "stopped" ? "stopped"
              : n.lease_left_ms > 0    ? "serving"
                                       : "expired";
    n.threads = static_cast<uint64_t>(row[7].integer);
    n.scheduler = row[8].integer != 0;
    out.push_back(std::move(n));
  }
  return out;
}

caf::error cluster_membership::advertise(const std::string& url) {
  auto params = impl_->who();
  params.push_back(sql_value::of(url));
  std::lock_guard<std::mutex> guard{impl_->db_mtx};
  auto done = run(*impl_->db,
                  "UPDATE cluster_nodes SET advertise = ?3 "
                  "WHERE name = ?1 AND incarnation = ?2;",
                  params);
  if (!done)
    return done.error();
  std::lock_guard<std::mutex> seat_guard{impl_->seat_mtx};
  impl_->advertised = url;
  if (impl_->seat.here)
    impl_->seat.holder_url = url;
  return caf::none;
}

cluster_membership::seat cluster_membership::scheduler_seat() const {
  std::lock_guard<std::mutex> guard{impl_->seat_mtx};
  auto out = impl_->seat;
  if (out.here && !standing_->live()) {
    out.here = false;
    out.holder.clear();
    out.holder_url.clear();
  }
  return out;
}

void cluster_membership::on_scheduler_seat(
  std::function<void(uint64_t epoch)> f) {
  std::lock_guard<std::mutex> guard{impl_->callback_mtx};
  impl_->on_seat = std::move(f);
}

bool cluster_membership::contend_for_scheduler() {
  // A failure (the statement's error, a race with another node) is tried
  // again a few times: a lone node that starts should hold the seat when
  // its runtime answers.
  using result = impl::seat_result;
  auto got = impl_->contend_once();
  for (int retry = 0; got == result::failed && retry < 10; ++retry) {
    std::this_thread::sleep_for(milliseconds{100});
    got = impl_->contend_once();
  }
  return got == result::here;
}

void cluster_membership::scheduler_failed(uint64_t epoch) {
  std::lock_guard<std::mutex> guard{impl_->seat_mtx};
  if (impl_->seat.here && impl_->seat.epoch == epoch)
    impl_->seat.here = false; // taken again, with a new epoch, next time
}

void cluster_membership::leave() {
  auto& p = *impl_;
  {
    std::lock_guard<std::mutex> guard{p.mtx};
    if (p.left)
      return;
    p.left = p.stopping = true;
  }
  p.wake.notify_all();
  if (p.heartbeat.joinable())
    p.heartbeat.join();
  if (p.standing->superseded())
    return;
  p.standing->end();
  std::lock_guard<std::mutex> guard{p.db_mtx};
  auto params = p.who();
  caf::error err;
  if (!(err = p.db->begin())) {
    auto released = run(*p.db,
                        "UPDATE thread_leases SET node = NULL "
                        "WHERE node = ?1 AND incarnation = ?2;",
                        params);
    auto stopped = run(*p.db,
                       "UPDATE cluster_nodes SET state = 'stopped', "
                       "  expires_at = clock_timestamp() "
                       "WHERE name = ?1 AND incarnation = ?2;",
                       params);
    if (!released)
      err = released.error();
    else if (!stopped)
      err = stopped.error();
    if (err)
      p.db->rollback();
    else
      err = p.db->commit();
  }
  if (err)
    spdlog::warn("cluster: node '{}' could not mark itself stopped ({}); "
                 "its threads move when its lease runs out",
                 p.options.node_name, describe(err));
  else
    spdlog::info("cluster: node '{}' left the cluster", p.options.node_name);
}

} // namespace spindle
