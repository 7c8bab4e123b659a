// PostgreSQL behind the sql_connection interface, through libpq: the same
// SQL as SQLite's (parameters ?N become $N), statements prepared once per
// connection, parameters always bound, never spliced into the text.

#include "storage/postgres/postgres.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include "schema.hpp"
#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

// Type OIDs (PostgreSQL's catalog/pg_type.h, which only the server's
// headers ship).
constexpr Oid bool_oid = 16;
constexpr Oid bytea_oid = 17;
constexpr Oid int8_oid = 20;
constexpr Oid int2_oid = 21;
constexpr Oid int4_oid = 23;
constexpr Oid text_oid = 25;
constexpr Oid oid_oid = 26;
constexpr Oid numeric_oid = 1700;

struct result_deleter {
  void operator()(PGresult* r) const noexcept {
    PQclear(r);
  }
};
using result_ptr = std::unique_ptr<PGresult, result_deleter>;

// SQLite's parameters (?N, or ? for the next) as PostgreSQL's ($N),
// outside quoted text and identifiers.
std::string translate_parameters(const std::string& sql) {
  std::string out;
  out.reserve(sql.size() + 8);
  char quote = 0;
  int next = 1;
  for (size_t i = 0; i < sql.size(); ++i) {
    char c = sql[i];
    if (quote != 0) {
      out += c;
      if (c == quote)
        quote = 0; // a doubled quote closes and reopens: same result
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      out += c;
      continue;
    }
    if (c != '?') {
      out += c;
      continue;
    }
    size_t j = i + 1;
    while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9')
      ++j;
    out += '$';
    if (j == i + 1) {
      out += std::to_string(next++);
    } else {
      auto digits = sql.substr(i + 1, j - i - 1);
      next = std::atoi(digits.c_str()) + 1;
      out += digits;
    }
    i = j - 1;
  }
  return out;
}

bool is_integer_text(const char* text) {
  if (*text == '-')
    ++text;
  if (*text == 0)
    return false;
  for (; *text != 0; ++text)
    if (*text < '0' || *text > '9')
      return false;
  return true;
}

// A bytea column in text form (\x followed by hex digits) as its bytes.
std::string bytea_bytes(const char* text) {
  size_t size = 0;
  auto* bytes = PQunescapeBytea(reinterpret_cast<const unsigned char*>(text),
                                &size);
  if (bytes == nullptr)
    return {};
  std::string out{reinterpret_cast<const char*>(bytes), size};
  PQfreemem(bytes);
  return out;
}

// The password of a postgres:// URL ("" for none): between the first ':'
// of the authority and its last '@', or a password= parameter.
std::string password_in(std::string_view url) {
  auto scheme = url.find("://");
  if (scheme != std::string_view::npos) {
    auto start = scheme + 3;
    auto path = url.find('/', start);
    auto authority = url.substr(start, path == std::string_view::npos
                                         ? std::string_view::npos
                                         : path - start);
    auto at = authority.rfind('@');
    if (at != std::string_view::npos) {
      auto colon = authority.substr(0, at).find(':');
      if (colon != std::string_view::npos && at > colon + 1)
        return std::string{authority.substr(colon + 1, at - colon - 1)};
    }
  }
  auto q = url.find("password=");
  if (q != std::string_view::npos) {
    auto end = url.find('&', q);
    return std::string{url.substr(q + 9, end == std::string_view::npos
                                           ? std::string_view::npos
                                           : end - q - 9)};
  }
  return {};
}

class pg_connection;

class pg_query final : public sql_query {
public:
  pg_query(pg_connection* conn, std::string sql)
    : conn_(conn), sql_(translate_parameters(sql)) {
  }

  void bind(int index, const sql_value& value) override {
    if (index < 1)
      return;
    auto i = static_cast<size_t>(index - 1);
    if (params_.size() <= i)
      params_.resize(i + 1);
    params_[i] = value;
  }

  caf::expected<bool> step() override;

  caf::error send() override;

  /// Prepares the statement again (under a new name) at its next use:
  /// its preparation was in a pipeline that failed.
  void forget_prepared() noexcept {
    prepared_in_ = 0;
  }

  int column_count() const override {
    return result_ ? PQnfields(result_.get()) : 0;
  }

  sql_value column(int index) const override {
    auto* r = result_.get();
    if (r == nullptr || row_ < 0 || row_ >= rows_ || index < 0
        || index >= PQnfields(r) || PQgetisnull(r, row_, index))
      return sql_value{};
    const char* text = PQgetvalue(r, row_, index);
    switch (PQftype(r, index)) {
      case int8_oid:
      case int4_oid:
      case int2_oid:
      case oid_oid:
        return sql_value::of(static_cast<int64_t>(std::strtoll(text, nullptr,
                                                               10)));
      case bool_oid:
        return sql_value::of(static_cast<int64_t>(text[0] == 't' ? 1 : 0));
      case numeric_oid:
        // sum() of BIGINT is numeric: an integer when it is one.
        if (is_integer_text(text))
          return sql_value::of(
            static_cast<int64_t>(std::strtoll(text, nullptr, 10)));
        return sql_value::of(std::string{text});
      case bytea_oid:
        return sql_value::of(bytea_bytes(text));
      default:
        return sql_value::of(
          std::string{text, static_cast<size_t>(PQgetlength(r, row_, index))});
    }
  }

  void reset() override {
    result_.reset();
    executed_ = false;
    row_ = -1;
    rows_ = 0;
    params_.clear();
  }

private:
  /// The bound parameters as libpq takes them.
  struct encoded {
    std::vector<const char*> values;
    std::vector<std::string> texts;
    std::vector<Oid> types;
  };
  caf::error encode(encoded& out) const;

  pg_connection* conn_;
  std::string sql_;
  std::string name_;
  uint64_t prepared_in_ = 0; // the connection's generation (0: never)
  std::vector<sql_value> params_;
  result_ptr result_;
  bool executed_ = false;
  int row_ = -1;
  int rows_ = 0;
};

class pg_connection final : public sql_connection {
public:
  explicit pg_connection(std::string url)
    : url_(std::move(url)), where_("PostgreSQL at " + redact_url(url_)) {
  }

  ~pg_connection() override {
    if (conn_ != nullptr)
      PQfinish(conn_);
  }

  /// Connects. Errors: `storage_failure` naming the redacted URL.
  caf::error connect() {
    // libpq reads the URL (expand_dbname); what comes before it are
    // defaults the URL may override.
    const char* keys[] = {"connect_timeout", "fallback_application_name",
                          "dbname", nullptr};
    const char* values[] = {"5", "spindle", url_.c_str(), nullptr};
    conn_ = PQconnectdbParams(keys, values, 1);
    if (conn_ == nullptr)
      return make_error(errc::storage_failure,
                        "cannot connect to " + where_ + ": out of memory");
    if (PQstatus(conn_) != CONNECTION_OK)
      return make_error(errc::storage_unavailable,
                        "cannot connect to " + where_ + ": "
                          + last_message());
    return setup();
  }

  sql_backend backend() const noexcept override {
    return sql_backend::postgres;
  }

  caf::error exec(std::string_view sql) override {
    if (auto err = usable())
      return err;
    std::string text{sql};
    result_ptr r{PQexec(conn_, text.c_str())};
    if (auto err = check(r.get()))
      return err;
    note_changes(r.get());
    return caf::none;
  }

  caf::expected<std::unique_ptr<sql_query>>
  prepare(const std::string& sql) override {
    return std::unique_ptr<sql_query>{new pg_query(this, sql)};
  }

  int64_t changes() override {
    return changes_;
  }

  caf::error begin() override {
    if (auto err = ready_to_begin())
      return err;
    // The transaction's ID, to look its outcome up should the answer to
    // COMMIT be lost with the connection. One round trip for both.
    result_ptr r{PQexec(conn_, "BEGIN; SELECT txid_current();")};
    if (auto err = check(r.get()))
      return err;
    in_transaction_ = true;
    txid_ = PQntuples(r.get()) > 0
              ? std::strtoll(PQgetvalue(r.get(), 0, 0), nullptr, 10)
              : 0;
    return caf::none;
  }

  caf::error commit() override {
    if (!in_transaction_)
      return make_error(errc::storage_failure,
                        where_ + ": no transaction to commit");
    if (in_pipeline_ && !leave_pipeline()) {
      rollback();
      return make_error(errc::storage_failure,
                        where_ + ": statements of the transaction were not "
                                 "run; it was rolled back");
    }
    result_ptr r{PQexec(conn_, "COMMIT;")};
    in_transaction_ = false;
    if (PQresultStatus(r.get()) == PGRES_COMMAND_OK) {
      // COMMIT of a transaction an error spoiled rolls it back, and says so
      // only in its tag.
      if (std::string_view{PQcmdStatus(r.get())} == "COMMIT")
        return caf::none;
      return make_error(errc::storage_failure,
                        where_ + ": the transaction was rolled back");
    }
    if (PQstatus(conn_) == CONNECTION_OK)
      return check(r.get());
    // The answer was lost with the connection: ask a new one what became
    // of the transaction.
    auto lost = last_message();
    return outcome_of(txid_, lost);
  }

  void rollback() override {
    in_transaction_ = false;
    if (in_pipeline_) {
      if (!queued_.empty())
        sync(); // what was queued runs (up to a failure) and is read
      leave_pipeline();
    }
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK)
      result_ptr{PQexec(conn_, "ROLLBACK;")};
  }

  bool failure_spoils_transaction() const noexcept override {
    return true;
  }

  bool pipelines() const noexcept override {
    return true;
  }

  caf::error begin_pipelined() override {
    if (auto err = ready_to_begin())
      return err;
    if (PQenterPipelineMode(conn_) != 1)
      return make_error(code_of(nullptr), where_
                                            + ": cannot pipeline statements: "
                                            + last_message());
    in_pipeline_ = true;
    in_transaction_ = true;
    txid_ = 0;
    // The transaction's ID, as begin() takes it.
    for (auto [sql, what] : {std::pair{"BEGIN", queued::kind_t::begin},
                             std::pair{"SELECT txid_current()",
                                       queued::kind_t::txid}}) {
      if (PQsendQueryParams(conn_, sql, 0, nullptr, nullptr, nullptr,
                            nullptr, 0)
          != 1) {
        auto err = send_failed();
        rollback();
        return err;
      }
      queued_.push_back({what, nullptr});
    }
    return caf::none;
  }

  sql_pipeline_result sync() override {
    sql_pipeline_result out;
    if (!in_pipeline_) {
      out.error = make_error(errc::storage_failure,
                             where_ + ": no pipelined transaction");
      return out;
    }
    auto batch = std::move(queued_);
    queued_.clear();
    caf::error first;
    auto lost = [&] {
      return make_error(errc::storage_unavailable,
                        where_ + ": the connection was lost during the "
                                 "transaction: "
                          + last_message());
    };
    bool gone = PQpipelineSync(conn_) != 1;
    if (gone)
      first = lost();
    for (auto& q : batch) {
      if (gone)
        break;
      result_ptr r{PQgetResult(conn_)};
      if (r == nullptr) {
        // A command without a result: the connection is gone.
        gone = true;
        first = first ? first : lost();
        break;
      }
      // Each command's results end with a null.
      while (auto* extra = PQgetResult(conn_))
        PQclear(extra);
      if (PQresultStatus(r.get()) == PGRES_PIPELINE_ABORTED)
        continue; // after the first failure, up to the sync
      if (auto err = check(r.get())) {
        if (!first)
          first = std::move(err);
        continue;
      }
      if (q.kind == queued::kind_t::txid && PQntuples(r.get()) > 0)
        txid_ = std::strtoll(PQgetvalue(r.get(), 0, 0), nullptr, 10);
      if (q.kind == queued::kind_t::statement) {
        note_changes(r.get());
        out.changes.push_back(changes_);
      }
    }
    if (!gone) {
      result_ptr r{PQgetResult(conn_)};
      if (PQresultStatus(r.get()) != PGRES_PIPELINE_SYNC)
        first = first ? first : lost();
    }
    if (first) {
      // A statement prepared in a pipeline that failed may not exist:
      // prepared again, under a new name, at its next use.
      for (auto& q : batch)
        if (q.kind == queued::kind_t::prepare)
          q.query->forget_prepared();
    }
    out.error = std::move(first);
    return out;
  }

  std::string where() const override {
    return where_;
  }

  // -- for pg_query -----------------------------------------------------

  /// Fails inside a transaction whose connection was lost; outside one,
  /// reconnects a lost connection.
  caf::error usable() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK)
      return caf::none;
    if (in_transaction_)
      return make_error(errc::storage_unavailable,
                        where_ + ": the connection was lost during the "
                                 "transaction");
    if (conn_ == nullptr)
      return connect();
    PQreset(conn_);
    if (PQstatus(conn_) != CONNECTION_OK)
      return make_error(errc::storage_unavailable,
                        where_ + " is unreachable: " + last_message());
    spdlog::info("storage: reconnected to {}", where_);
    return setup();
  }

  uint64_t generation() const noexcept {
    return generation_;
  }

  PGconn* handle() noexcept {
    return conn_;
  }

  std::string next_statement_name() {
    return "s" + std::to_string(++statements_);
  }

  bool in_pipeline() const noexcept {
    return in_pipeline_;
  }

  /// Notes a preparation (`query` non-null) or a statement queued in the
  /// pipeline, whose result `sync` reads in this order.
  void queued_prepare(pg_query* query) {
    queued_.push_back({queued::kind_t::prepare, query});
  }
  void queued_statement() {
    queued_.push_back({queued::kind_t::statement, nullptr});
  }

  /// The error of a command libpq could not queue.
  caf::error send_failed() {
    return make_error(code_of(nullptr), where_ + ": " + last_message());
  }

  /// An error for a result that is not a success (null when it is one).
  caf::error check(PGresult* r) {
    auto status = PQresultStatus(r);
    if (r != nullptr
        && (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK
            || status == PGRES_EMPTY_QUERY))
      return caf::none;
    std::string msg = r != nullptr ? PQresultErrorMessage(r) : "";
    if (msg.empty())
      msg = last_message();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' '))
      msg.pop_back();
    const char* state = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE)
                                     : nullptr;
    return make_error(code_of(state), where_ + ": " + msg);
  }

  /// The code of a failure with SQLSTATE `state` (null: none came): a
  /// full disk, a database that cannot be reached now (the connection
  /// lost, class 08; the server shutting down or starting up, 57P01..03),
  /// or any other failure.
  errc code_of(const char* state) const {
    std::string_view s = state != nullptr ? state : "";
    if (s == "53100")
      return errc::storage_full;
    // A value the database cannot hold (bytes that are not UTF-8, a
    // character its encoding lacks): the caller's to fix.
    if (s == "22021" || s == "22P05")
      return errc::invalid_argument;
    // spindle_fence(): a thread write under a cluster lease that is no
    // longer current (docs/cluster.md, "Fencing").
    if (s == "SPF01")
      return errc::not_owner;
    if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK
        || s.rfind("08", 0) == 0 || s == "57P01" || s == "57P02"
        || s == "57P03")
      return errc::storage_unavailable;
    return errc::storage_failure;
  }

  void note_changes(PGresult* r) {
    // Rows a statement changed, as SQLite's changes() counts them: a
    // SELECT (the fence of a thread's write among them) changes none,
    // though PostgreSQL reports the rows it returned.
    const char* status = PQcmdStatus(r);
    if (status != nullptr && std::strncmp(status, "SELECT", 6) == 0) {
      changes_ = 0;
      return;
    }
    const char* n = PQcmdTuples(r);
    changes_ = n != nullptr && *n != 0 ? std::strtoll(n, nullptr, 10) : 0;
  }

private:
  /// None if a transaction can begin: none is open, and the connection
  /// works (reopened if it was lost).
  caf::error ready_to_begin() {
    if (in_transaction_)
      return make_error(errc::storage_failure,
                        where_ + ": a transaction is already open");
    return usable();
  }

  /// Leaves pipeline mode, every result read. False if the connection
  /// could not (it broke, or results were left unread): it is closed
  /// then, and the next statement outside a transaction opens a new one.
  bool leave_pipeline() {
    in_pipeline_ = false;
    queued_.clear();
    if (conn_ == nullptr)
      return false;
    if (PQexitPipelineMode(conn_) == 1)
      return true;
    PQfinish(conn_);
    conn_ = nullptr;
    return false;
  }

  caf::error setup() {
    ++generation_;
    // A new connection is not in pipeline mode.
    in_pipeline_ = false;
    queued_.clear();
    PQsetNoticeProcessor(
      conn_,
      [](void*, const char* message) {
        spdlog::debug("storage: PostgreSQL: {}", message);
      },
      nullptr);
    result_ptr r{PQexec(conn_, "SET client_min_messages = warning;")};
    return check(r.get());
  }

  std::string last_message() const {
    std::string msg = conn_ != nullptr ? PQerrorMessage(conn_) : "";
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' '))
      msg.pop_back();
    // libpq names host and port, not the password, but it may quote a
    // piece of a URL it could not read: the password never goes out.
    if (auto secret = password_in(url_); !secret.empty())
      for (auto at = msg.find(secret); at != std::string::npos;
           at = msg.find(secret, at))
        msg.replace(at, secret.size(), "***");
    return msg.empty() ? "connection lost" : msg;
  }

  // The outcome of transaction `txid` after its COMMIT's answer was lost:
  // none if it committed.
  caf::error outcome_of(int64_t txid, const std::string& lost) {
    auto unknown = [&](const std::string& why) {
      return make_error(errc::storage_unavailable,
                        where_ + ": the connection was lost at commit ("
                          + lost + ") and its outcome is unknown: " + why);
    };
    if (txid == 0)
      return unknown("no transaction ID");
    for (int attempt = 0; attempt < 20; ++attempt) {
      if (attempt > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (usable())
        continue;
      auto sql = "SELECT txid_status(" + std::to_string(txid) + ");";
      result_ptr r{PQexec(conn_, sql.c_str())};
      if (PQresultStatus(r.get()) != PGRES_TUPLES_OK
          || PQntuples(r.get()) != 1)
        continue;
      std::string_view status = PQgetvalue(r.get(), 0, 0);
      if (status == "committed")
        return caf::none;
      if (status == "aborted")
        return make_error(errc::storage_unavailable,
                          where_ + ": the connection was lost at commit ("
                            + lost + "); the transaction was rolled back");
      // "in progress": the server has not finished with it yet.
    }
    return unknown("the database did not say within 2 s");
  }

  std::string url_;
  std::string where_;
  PGconn* conn_ = nullptr;
  uint64_t generation_ = 0;
  uint64_t statements_ = 0;
  bool in_transaction_ = false;
  int64_t txid_ = 0;
  int64_t changes_ = 0;
  /// Pipeline mode (begin_pipelined to the end of the transaction), and
  /// the commands queued since the last sync.
  struct queued {
    enum class kind_t { begin, txid, prepare, statement } kind;
    pg_query* query; // prepare: the query prepared
  };
  bool in_pipeline_ = false;
  std::vector<queued> queued_;
};

caf::expected<bool> pg_query::step() {
  if (executed_) {
    if (result_ == nullptr)
      return false;
    return ++row_ < rows_;
  }
  executed_ = true;
  if (auto err = conn_->usable())
    return err;
  encoded e;
  if (auto err = encode(e))
    return err;
  auto n = static_cast<int>(e.values.size());
  if (prepared_in_ != conn_->generation()) {
    // Prepared on this connection with the types of the first values
    // bound (integers BIGINT, texts TEXT); NULLs leave theirs to the
    // server.
    name_ = conn_->next_statement_name();
    result_ptr p{PQprepare(conn_->handle(), name_.c_str(), sql_.c_str(), n,
                           e.types.data())};
    if (auto err = conn_->check(p.get()))
      return err;
    prepared_in_ = conn_->generation();
  }
  result_.reset(PQexecPrepared(conn_->handle(), name_.c_str(), n,
                               e.values.data(), nullptr, nullptr, 0));
  if (auto err = conn_->check(result_.get())) {
    result_.reset();
    // The statement may be gone with a lost connection: prepare again.
    if (PQstatus(conn_->handle()) != CONNECTION_OK)
      prepared_in_ = 0;
    return err;
  }
  conn_->note_changes(result_.get());
  rows_ = PQresultStatus(result_.get()) == PGRES_TUPLES_OK
            ? PQntuples(result_.get())
            : 0;
  row_ = 0;
  return rows_ > 0;
}

caf::error pg_query::encode(encoded& out) const {
  auto n = params_.size();
  out.values.assign(n, nullptr);
  out.texts.assign(n, std::string{});
  out.types.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto& p = params_[i];
    switch (p.type) {
      case sql_value::kind::integer:
        out.texts[i] = std::to_string(p.integer);
        out.values[i] = out.texts[i].c_str();
        out.types[i] = int8_oid;
        break;
      case sql_value::kind::text:
        // Parameters travel as C strings: a NUL would cut the text short.
        if (p.text.find('\0') != std::string::npos)
          return make_error(errc::invalid_argument,
                            conn_->where()
                              + ": a text with a NUL character cannot be "
                                "stored in PostgreSQL");
        out.values[i] = p.text.c_str();
        out.types[i] = text_oid;
        break;
      default:
        break; // NULL
    }
  }
  return caf::none;
}

caf::error pg_query::send() {
  if (!conn_->in_pipeline())
    return make_error(errc::storage_failure,
                      conn_->where() + ": no pipelined transaction");
  encoded e;
  if (auto err = encode(e))
    return err;
  auto n = static_cast<int>(e.values.size());
  auto* h = conn_->handle();
  if (prepared_in_ != conn_->generation()) {
    // As step() prepares it, queued before its first use.
    name_ = conn_->next_statement_name();
    if (PQsendPrepare(h, name_.c_str(), sql_.c_str(), n, e.types.data())
        != 1)
      return conn_->send_failed();
    prepared_in_ = conn_->generation();
    conn_->queued_prepare(this);
  }
  // libpq copies the values into its buffer: the bindings can go.
  if (PQsendQueryPrepared(h, name_.c_str(), n, e.values.data(), nullptr,
                          nullptr, 0)
      != 1)
    return conn_->send_failed();
  conn_->queued_statement();
  params_.clear();
  return caf::none;
}

} // namespace

bool is_postgres_url(std::string_view store) {
  return store.rfind("postgres://", 0) == 0
         || store.rfind("postgresql://", 0) == 0;
}

std::string redact_url(std::string_view url) {
  std::string out{url};
  auto secret = password_in(url);
  if (secret.empty())
    return out;
  for (auto form : {":" + secret + "@", "password=" + secret}) {
    auto at = out.find(form);
    if (at != std::string::npos)
      out.replace(at, form.size(),
                  form.front() == ':' ? ":***@" : "password=***");
  }
  return out;
}

caf::expected<std::unique_ptr<sql_connection>>
open_postgres(const std::string& url, bool migrate) {
  auto conn = std::make_unique<pg_connection>(url);
  if (auto err = conn->connect())
    return err;
  if (migrate)
    if (auto err = migrate_postgres(*conn, conn->where()))
      return err;
  return std::unique_ptr<sql_connection>{std::move(conn)};
}

caf::expected<int> postgres_schema_version(const std::string& url) {
  auto conn = std::make_unique<pg_connection>(url);
  if (auto err = conn->connect())
    return err;
  return read_postgres_schema_version(*conn);
}

} // namespace spindle
