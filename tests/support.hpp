#pragma once

// Shared helpers for spindle's tests: temporary directories and running the
// spindle binary (or any command) as a child process.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/types.h>

namespace httplib {
class Client;
} // namespace httplib

namespace spindle {
class sql_connection;
} // namespace spindle

namespace spindle::test {

/// A fresh directory under the system's temp dir, removed on destruction.
class temp_dir {
public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const noexcept {
    return path_;
  }
  std::string str() const {
    return path_.string();
  }

private:
  std::filesystem::path path_;
};

/// Where a test keeps its durable state: a temporary data directory, and
/// on the PostgreSQL run of the store suites (CTest's tests labelled
/// `postgres`, which set SPINDLE_TEST_PG_DIR to the directory of the
/// throwaway cluster CTest's fixture started with .ci/postgres) also a
/// database of its own there, created empty and dropped on destruction. `apply` points storage options at it.
class test_store {
public:
  test_store();
  ~test_store();
  test_store(const test_store&) = delete;
  test_store& operator=(const test_store&) = delete;

  /// The data directory (spindle.db, memory.db and idempotency.db on
  /// SQLite; nothing of the state on PostgreSQL).
  const temp_dir& dir() const noexcept {
    return dir_;
  }
  std::string str() const {
    return dir_.str();
  }
  const std::filesystem::path& path() const noexcept {
    return dir_.path();
  }
  /// The PostgreSQL database's URL; empty on SQLite.
  const std::string& url() const noexcept {
    return url_;
  }
  bool on_postgres() const noexcept {
    return !url_.empty();
  }
  /// Sets `data_dir` and, on PostgreSQL, `store`, of any options type
  /// with those members (storage_options).
  template <class StorageOptions>
  void apply(StorageOptions& opts) const {
    opts.data_dir = dir_.str();
    opts.store = url_;
  }
  /// `spindle serve`'s flags for it: `--data DIR` and, on PostgreSQL,
  /// `--store URL` and one node name, so that a server started again on
  /// the store after a crash is the same cluster node and takes its name
  /// (and its threads) over at once (docs/cluster.md).
  std::vector<std::string> serve_flags() const {
    std::vector<std::string> out{"--data", dir_.str()};
    if (on_postgres()) {
      out.push_back("--store");
      out.push_back(url_);
      out.push_back("--node-name");
      out.push_back("test-node");
    }
    return out;
  }
  /// Runs `sql` on a connection of its own beside the runtime's, as an
  /// operator would: on spindle.db, or on the PostgreSQL database. Throws
  /// when it fails.
  void exec(const std::string& sql) const;
  /// The first column of the first row of `sql`, as text ("" for none).
  std::string query(const std::string& sql) const;
  /// Every column of the first row of `sql`, as text (empty for no row).
  std::vector<std::string> query_row(const std::string& sql) const;
  /// Makes the store refuse the rows `event` ("BEFORE INSERT", "BEFORE
  /// UPDATE") brings into `table` when `when` holds (an expression on
  /// NEW.column), with the error `message`, as a failing disk would: a
  /// trigger `name`, in SQLite or in PostgreSQL. `allow` drops it.
  void refuse(const std::string& name, const std::string& event,
              const std::string& table, const std::string& when,
              const std::string& message) const;
  void allow(const std::string& name, const std::string& table) const;
  /// A connection of its own to the database long-term memory keeps its
  /// entries in: memory.db in the data directory (sync normal), or the
  /// PostgreSQL database.
  std::unique_ptr<sql_connection> memory_connection() const;

private:
  temp_dir dir_;
  std::string url_;
  std::string name_;
};

/// Whether this run is the PostgreSQL run of the store suites.
bool postgres_run();

/// `opts` as a store suite's runtime takes them: unchanged (in memory, or
/// whatever the test chose) on the default run; on the PostgreSQL run
/// pointed at `store`'s database, so that the same test pins the same
/// behaviour with every write going through PostgreSQL.
template <class RuntimeOptions>
RuntimeOptions on_test_store(RuntimeOptions opts, const test_store& store) {
  if (store.on_postgres())
    store.apply(opts.storage);
  return opts;
}

/// The URL of the cluster's maintenance database (`postgres`), from which
/// test databases are created; throws when no cluster is set up.
std::string postgres_admin_url();

/// Holds `parties` threads at `arrive_and_wait` until all of them have
/// arrived, then lets them all go; usable again for the next phase.
class barrier {
public:
  explicit barrier(size_t parties) : parties_(parties) {
  }
  void arrive_and_wait();

private:
  std::mutex mx_;
  std::condition_variable cv_;
  size_t parties_;
  size_t arrived_ = 0;
  size_t phase_ = 0;
};

/// What a finished child process left behind.
struct process_result {
  int exit_code = -1;     // -1 when killed by a signal
  int signal = 0;         // the signal that ended it, or 0
  std::string out;
  std::string err;
};

/// Runs `argv` (argv[0] is a path or a name on PATH) with `input` on its
/// standard input and waits for it. `env` entries are added to (or replace)
/// the environment.
process_result run(const std::vector<std::string>& argv,
                   const std::string& input = {},
                   const std::map<std::string, std::string>& env = {});

/// A child process running in the background; killed on destruction.
class child {
public:
  explicit child(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env = {});
  ~child();
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  pid_t pid() const noexcept {
    return pid_;
  }
  /// Sends `sig` to the child.
  void kill(int sig);
  /// Waits for the child to end; returns its exit code (-1 if signalled).
  int wait();

private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

/// A child process that says it is ready with the first line it prints on
/// its standard output (an address, a port); its standard error goes to a
/// log file. Stopped (SIGKILL) on destruction.
class announcing_process {
public:
  /// Starts `argv` (argv[0] is a path) and waits up to 30 s for its first
  /// line; throws when it cannot start.
  explicit announcing_process(std::vector<std::string> argv,
                              const std::map<std::string, std::string>& env
                              = {});
  ~announcing_process();
  announcing_process(const announcing_process&) = delete;
  announcing_process& operator=(const announcing_process&) = delete;

  /// The first line it printed, without the newline; empty when none came.
  const std::string& first_line() const noexcept {
    return first_line_;
  }
  pid_t pid() const noexcept {
    return pid_;
  }
  /// Sends `sig` and waits for the exit code (-1 if killed by a signal; -2
  /// when it had to be killed after 10 s).
  int stop(int sig);
  /// Everything it wrote to its standard error so far.
  std::string log() const;

private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
  std::string first_line_;
};

/// A child process in the background whose standard output and error go
/// to a log file; killed (SIGKILL) on destruction.
class logged_process {
public:
  explicit logged_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {});
  ~logged_process();
  logged_process(const logged_process&) = delete;
  logged_process& operator=(const logged_process&) = delete;

  pid_t pid() const noexcept {
    return pid_;
  }
  /// Sends `sig` to it.
  void kill(int sig);
  /// Waits up to `timeout` for it to end: its exit code (-1 if a signal
  /// ended it), or nullopt while it still runs.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  /// Everything it printed so far.
  std::string log() const;

private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string log_path_;
};

/// `spindle serve` running as a child on a free loopback port; stopped
/// (SIGTERM, then SIGKILL after 10 s) on destruction. stderr (the log) is
/// collected in a file.
class server_process {
public:
  /// Starts `spindle serve --port 0 --data :memory: <extra>` (without
  /// `--port 0` when `extra` names a --port; without
  /// `--data :memory:` when `extra` names a --data) and waits
  /// until it prints its address.
  explicit server_process(const std::vector<std::string>& extra = {},
                          const std::map<std::string, std::string>& env = {});
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  int port() const noexcept {
    return port_;
  }
  pid_t pid() const noexcept {
    return process_.pid();
  }
  /// Sends `sig` and waits for the exit code (-1 if killed by a signal).
  int stop(int sig) {
    return process_.stop(sig);
  }
  /// Everything the server logged so far.
  std::string log() const {
    return process_.log();
  }

private:
  announcing_process process_;
  int port_ = 0;
};

/// A loopback port nothing listens on now; throws when none can be had.
int free_port();

/// Nodes of one cluster (docs/cluster.md) on a test database of their own
/// (a `test_store`, which must be on PostgreSQL: the fixture throws
/// otherwise): `spindle serve` processes, each with a data directory of
/// its own, named "node0", "node1", ... by the constructor, advertising
/// their loopback port, with `--node-lease-ms` `lease_ms`. A node still
/// running when the fixture goes is killed, then the database dropped.
class cluster {
public:
  static constexpr const char* lease_ms = "2000";

  /// Starts `n` nodes, each with `extra` added to its flags.
  explicit cluster(size_t n, std::vector<std::string> extra = {});
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// Starts one more node named `name` on the fixture's database.
  void add(const std::string& name);
  /// A node reaching the database at `url` (through a relay).
  void add(const std::string& name, const std::string& url);

  size_t size() const noexcept {
    return nodes_.size();
  }
  server_process& node(size_t i) {
    return *nodes_.at(i);
  }
  const std::string& name(size_t i) const {
    return names_.at(i);
  }
  /// The index of the node named `name`; throws when there is none.
  size_t index_of(const std::string& name) const;
  test_store& store() noexcept {
    return store_;
  }

  /// The node that holds `thread`'s lease now ("" for none).
  std::string owner(const std::string& thread);

  /// How many request log lines of node `i` (killed or not) name the
  /// node they forwarded the request to (`forwarded_to=NODE`): to any
  /// node, or to `to` only.
  size_t forwarded(size_t i, const std::string& to = {}) const;
  /// The same over every node.
  size_t forwarded() const;

private:
  test_store store_;
  std::vector<std::string> extra_;
  std::vector<std::unique_ptr<temp_dir>> dirs_;
  std::vector<std::unique_ptr<server_process>> nodes_;
  std::vector<std::string> names_;
};

/// spindle_fake_upstream (tests/fake_upstream.cpp, docs/llm.md) on a free
/// loopback port with `flags`; it ends with the test process.
class fake_upstream {
public:
  explicit fake_upstream(std::vector<std::string> flags = {});

  int port() const noexcept {
    return port_;
  }
  /// "http://127.0.0.1:PORT" (or another scheme or host).
  std::string url(const std::string& scheme = "http",
                  const std::string& host = "127.0.0.1") const;
  /// Its counters: requests, open, max_open, completed, aborted. Throws
  /// when it does not answer.
  nlohmann::json stats() const;

private:
  announcing_process process_;
  int port_ = 0;
};

/// The number in environment variable `name`, or `fallback` when it is
/// unset or empty; throws when it is not a whole number.
uint64_t env_number(const char* name, uint64_t fallback);

/// `PRAGMA integrity_check` of the SQLite database at `path`, opened read
/// only beside no other connection: "ok", or what SQLite found (its rows,
/// one a line), or why the file could not be opened.
std::string integrity_check(const std::filesystem::path& path);

/// Path of the spindle binary under test.
std::string spindle_binary();

/// Splits text into lines (without the trailing newline).
std::vector<std::string> lines(const std::string& text);

/// A PID that belongs to no running process right now.
pid_t dead_pid();

// -- raw loopback sockets, for tests that hold many connections --------------

/// Raises this process's open-file limit to its hard limit.
void raise_fd_limit();

/// A blocking loopback connection to `port`; -1 on failure. A receive
/// buffer set before connecting bounds the window the client offers.
int connect_to(int port, int receive_buffer = 0);

/// Closes its descriptors when it goes.
struct fd_guard {
  std::vector<int> fds;
  fd_guard() = default;
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard();
};

/// Sends all of `data`; false if the connection failed.
bool send_all(int fd, const std::string& data);

/// POSTs `body` as JSON to `path`; the status and the parsed reply (null
/// for an empty one). Fails the test when no reply came.
std::pair<int, nlohmann::json> post_json(httplib::Client& cli,
                                         const std::string& path,
                                         const nlohmann::json& body);
/// GETs `path`; the status and the parsed reply.
std::pair<int, nlohmann::json> get_json(httplib::Client& cli,
                                        const std::string& path);

// -- event streams --------------------------------------------------------------

/// One event of a text/event-stream.
struct sse_event {
  std::string id;
  std::string type;
  nlohmann::json data;
};

/// The events of a whole text/event-stream body, in order: each `data:`
/// line parsed as JSON, with the `event:` before it (`id` stays empty).
std::vector<sse_event> sse_events(const std::string& body);

/// A client of `GET target` on a loopback server that answers with a
/// text/event-stream (chunked): it parses the reply's head, then the
/// chunks, then the events. Reading is explicit, so one thread can drive
/// hundreds of them with poll().
class sse_client {
public:
  sse_client(int port, const std::string& target,
             const std::map<std::string, std::string>& headers = {});
  ~sse_client();
  sse_client(const sse_client&) = delete;
  sse_client& operator=(const sse_client&) = delete;

  int fd() const noexcept {
    return fd_;
  }
  /// The reply's status; 0 until its head arrived.
  int status() const noexcept {
    return status_;
  }
  /// The body of a reply that is not a stream, once it ended.
  const std::string& body() const noexcept {
    return body_;
  }
  /// True once the server closed the connection.
  bool closed() const noexcept {
    return closed_;
  }
  const std::vector<sse_event>& events() const noexcept {
    return events_;
  }
  /// Reads what has arrived (waiting at most `timeout_ms` for it); false
  /// once the connection is closed.
  bool read_some(int timeout_ms = 0);
  /// Reads until `n` events arrived, the connection closed, or `timeout`
  /// passed; true if `n` arrived.
  bool wait_for(size_t n, std::chrono::milliseconds timeout);
  /// Reads until the reply's head arrived; its status.
  int wait_status(std::chrono::milliseconds timeout);
  /// Closes the connection.
  void close();

private:
  void feed(const char* data, size_t n);
  void parse_events();

  int fd_ = -1;
  int status_ = 0;
  bool closed_ = false;
  bool chunked_ = false;
  std::string head_;
  std::string raw_;     // body bytes not decoded yet (chunked framing)
  std::string text_;    // decoded stream text not parsed into events yet
  std::string body_;
  std::vector<sse_event> events_;
};

} // namespace spindle::test
