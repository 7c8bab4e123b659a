#include "support.hpp"
#include "byte_counter.hpp"

#include <algorithm>
#include <array>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <atomic>
#include <fstream>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <sqlite3.h>

#include "spindle/messages/error.hpp"
#include "storage/database.hpp"
#include "storage/postgres/postgres.hpp"
#include "storage/sql_connection.hpp"
#include "spindle/runtime/storage.hpp"
#include "storage/state_store.hpp"

extern char** environ;

namespace spindle::test {

namespace {

std::vector<std::string> make_env(const std::map<std::string, std::string>& add) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv{*e};
    auto eq = kv.find('=');
    if (eq != std::string::npos)
      merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (auto& [k, v] : add)
    merged[k] = v;
  std::vector<std::string> out;
  for (auto& [k, v] : merged)
    out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_array(std::vector<std::string>& xs) {
  std::vector<char*> out;
  for (auto& x : xs)
    out.push_back(x.data());
  out.push_back(nullptr);
  return out;
}

// Starts `argv` (argv[0] is a path or a name on PATH) with `env` added to
// the environment and `fds[i]` as its descriptor i (-1: inherited).
// Returns posix_spawnp's error number: 0 when it started.
int spawn(pid_t& pid, const std::vector<std::string>& argv,
          const std::map<std::string, std::string>& env,
          std::array<int, 3> fds) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int i = 0; i < 3; ++i)
    if (fds[i] >= 0)
      posix_spawn_file_actions_adddup2(&actions, fds[i], i);
  auto args = argv;
  auto envs = make_env(env);
  auto c_args = c_array(args);
  auto c_env = c_array(envs);
  auto rc = posix_spawnp(&pid, c_args[0], &actions, nullptr, c_args.data(),
                         c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc;
}

int decode(int status, int* sig) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status) && sig != nullptr)
    *sig = WTERMSIG(status);
  return -1;
}

} // namespace

void barrier::arrive_and_wait() {
  std::unique_lock<std::mutex> lock{mx_};
  auto phase = phase_;
  if (++arrived_ == parties_) {
    arrived_ = 0;
    ++phase_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return phase_ != phase; });
}

temp_dir::temp_dir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int i = 0; i < 100; ++i) {
    auto candidate = base / ("spindle-test-" + std::to_string(rd()));
    std::error_code ec;
    if (std::filesystem::create_directory(candidate, ec)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

bool postgres_run() {
  const char* v = std::getenv("SPINDLE_TEST_PG_DIR");
  return v != nullptr && *v != 0;
}

std::string postgres_admin_url() {
  const char* dir = std::getenv("SPINDLE_TEST_PG_DIR");
  if (dir == nullptr || *dir == 0)
    throw std::runtime_error("no SPINDLE_TEST_PG_DIR: the directory of a "
                             "cluster .ci/postgres started");
  std::ifstream in{std::filesystem::path{dir} / "url"};
  std::string url;
  if (!std::getline(in, url) || url.empty())
    throw std::runtime_error(std::string{"no PostgreSQL cluster runs in "}
                             + dir);
  // .../spindle -> .../postgres
  auto slash = url.rfind('/');
  return url.substr(0, slash + 1) + "postgres";
}

namespace {

std::unique_ptr<sql_connection> connect_or_throw(const std::string& url) {
  auto conn = open_postgres(url, false);
  if (!conn)
    throw std::runtime_error("cannot connect to " + redact_url(url) + ": "
                             + describe(conn.error()));
  return std::move(*conn);
}

} // namespace

test_store::test_store() {
  if (!postgres_run())
    return;
  static std::atomic<uint64_t> next{0};
  std::random_device rd;
  name_ = "spindle_test_" + std::to_string(::getpid()) + "_"
          + std::to_string(next++) + "_" + std::to_string(rd() % 100000);
  auto admin = postgres_admin_url();
  auto conn = connect_or_throw(admin);
  if (auto err = conn->exec("CREATE DATABASE " + name_ + ";"))
    throw std::runtime_error("CREATE DATABASE " + name_ + ": "
                             + describe(err));
  url_ = admin.substr(0, admin.rfind('/') + 1) + name_;
}

test_store::~test_store() {
  if (name_.empty())
    return;
  try {
    auto conn = connect_or_throw(postgres_admin_url());
    // FORCE: connections a killed child left are ended.
    conn->exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE);");
  } catch (...) {
  }
}

void test_store::exec(const std::string& sql) const {
  if (on_postgres()) {
    auto conn = connect_or_throw(url_);
    if (auto err = conn->exec(sql))
      throw std::runtime_error(sql + ": " + describe(err));
    return;
  }
  auto db = database::open((dir_.path() / "spindle.db").string(),
                           sync_mode::normal);
  if (!db)
    throw std::runtime_error("spindle.db: " + describe(db.error()));
  if (auto err = (*db)->exec(sql))
    throw std::runtime_error(sql + ": " + describe(err));
}

std::vector<std::string> test_store::query_row(const std::string& sql) const {
  std::unique_ptr<sql_connection> conn;
  if (on_postgres()) {
    conn = connect_or_throw(url_);
  } else {
    auto db = database::open((dir_.path() / "spindle.db").string(),
                             sync_mode::normal);
    if (!db)
      throw std::runtime_error("spindle.db: " + describe(db.error()));
    conn = sqlite_connection(std::move(*db));
  }
  auto q = conn->prepare(sql);
  if (!q)
    throw std::runtime_error(sql + ": " + describe(q.error()));
  auto row = (*q)->step();
  if (!row)
    throw std::runtime_error(sql + ": " + describe(row.error()));
  std::vector<std::string> out;
  if (!*row)
    return out;
  for (int i = 0; i < (*q)->column_count(); ++i) {
    auto v = (*q)->column(i);
    out.push_back(v.type == sql_value::kind::integer
                    ? std::to_string(v.integer)
                    : v.text);
  }
  return out;
}

std::string test_store::query(const std::string& sql) const {
  auto row = query_row(sql);
  return row.empty() ? std::string{} : row.front();
}

void test_store::refuse(const std::string& name, const std::string& event,
                        const std::string& table, const std::string& when,
                        const std::string& message) const {
  if (on_postgres())
    exec("CREATE FUNCTION " + name
         + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE "
           "EXCEPTION '"
         + message + "'; END $$; CREATE TRIGGER " + name + " " + event
         + " ON " + table + " FOR EACH ROW WHEN (" + when
         + ") EXECUTE FUNCTION " + name + "();");
  else
    exec("CREATE TRIGGER " + name + " " + event + " ON " + table + " WHEN "
         + when + " BEGIN SELECT RAISE(ABORT, '" + message + "'); END;");
}

std::unique_ptr<sql_connection> test_store::memory_connection() const {
  if (on_postgres()) {
    auto conn = open_postgres(url_);
    if (!conn)
      throw std::runtime_error("cannot connect to " + url_ + ": "
                               + describe(conn.error()));
    return std::move(*conn);
  }
  storage_options opts;
  apply(opts);
  auto db = database::open(memory_database_path(opts), sync_mode::normal);
  if (!db)
    throw std::runtime_error("cannot open memory.db: " + describe(db.error()));
  return sqlite_connection(std::move(*db));
}

void test_store::allow(const std::string& name,
                       const std::string& table) const {
  if (on_postgres())
    exec("DROP TRIGGER " + name + " ON " + table + "; DROP FUNCTION " + name
         + "();");
  else
    exec("DROP TRIGGER " + name + ";");
}

process_result run(const std::vector<std::string>& argv,
                   const std::string& input,
                   const std::map<std::string, std::string>& env) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0
      || pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  pid_t pid = -1;
  auto rc = spawn(pid, argv, env, {in_pipe[0], out_pipe[1], err_pipe[1]});
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw std::runtime_error("cannot run " + argv[0] + ": " + strerror(rc));
  }
  // Feed stdin and drain stdout/stderr together so no pipe fills up.
  process_result result;
  size_t written = 0;
  if (input.empty()) {
    close(in_pipe[1]);
    in_pipe[1] = -1;
  } else {
    fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  }
  signal(SIGPIPE, SIG_IGN);
  pollfd fds[3] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0},
                   {in_pipe[1], POLLOUT, 0}};
  int open_outputs = 2;
  char buf[65536];
  while (open_outputs > 0) {
    nfds_t n = in_pipe[1] >= 0 ? 3 : 2;
    if (poll(fds, n, -1) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP))) {
        auto got = read(fds[i].fd, buf, sizeof(buf));
        if (got <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_outputs;
        } else {
          (i == 0 ? result.out : result.err).append(buf, got);
        }
      }
    }
    if (n == 3 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      auto got = write(in_pipe[1], input.data() + written,
                       input.size() - written);
      if (got > 0)
        written += got;
      if (got < 0 || written == input.size()) {
        close(in_pipe[1]);
        in_pipe[1] = -1;
        fds[2].fd = -1;
      }
    }
  }
  if (in_pipe[1] >= 0)
    close(in_pipe[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = decode(status, &result.signal);
  return result;
}

child::child(const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& env) {
  auto rc = spawn(pid_, argv, env, {-1, -1, -1});
  if (rc != 0)
    throw std::runtime_error("cannot run " + argv[0] + ": " + strerror(rc));
}

child::~child() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

void child::kill(int sig) {
  ::kill(pid_, sig);
}

int child::wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  return decode(status, nullptr);
}

namespace {

// A fresh path for a child's log under the system's temp dir.
std::string new_log_path() {
  static std::atomic<int> serial{0};
  return (std::filesystem::temp_directory_path()
          / ("spindle-child-" + std::to_string(getpid()) + "-"
             + std::to_string(serial++) + ".log"))
    .string();
}

std::string read_log(const std::string& path) {
  std::ifstream in{path};
  return std::string{std::istreambuf_iterator<char>{in}, {}};
}

// Reaps `pid` if it ends within `timeout`: its exit code, else nullopt.
std::optional<int> reap_within(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return decode(status, nullptr);
    if (std::chrono::steady_clock::now() >= deadline)
      return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

} // namespace

logged_process::logged_process(const std::vector<std::string>& argv,
                               const std::map<std::string, std::string>& env)
  : log_path_(new_log_path()) {
  int log_fd = ::open(log_path_.c_str(),
                      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0)
    throw std::runtime_error("cannot create " + log_path_);
  auto rc = spawn(pid_, argv, env, {-1, log_fd, log_fd});
  close(log_fd);
  if (rc != 0)
    throw std::runtime_error("cannot run " + argv[0] + ": " + strerror(rc));
}

logged_process::~logged_process() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove(log_path_, ec);
}

void logged_process::kill(int sig) {
  if (!reaped_)
    ::kill(pid_, sig);
}

std::optional<int> logged_process::wait_for(std::chrono::milliseconds timeout) {
  if (!reaped_) {
    auto code = reap_within(pid_, timeout);
    if (!code)
      return std::nullopt;
    reaped_ = true;
    exit_code_ = *code;
  }
  return exit_code_;
}

std::string logged_process::log() const {
  return read_log(log_path_);
}

announcing_process::announcing_process(
  std::vector<std::string> argv, const std::map<std::string, std::string>& env)
  : log_path_(new_log_path()) {
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      0644);
  auto rc = spawn(pid_, argv, env, {-1, out_pipe[1], log_fd});
  close(out_pipe[1]);
  close(log_fd);
  if (rc != 0) {
    close(out_pipe[0]);
    throw std::runtime_error("cannot start " + argv[0]);
  }
  char c;
  pollfd pfd{out_pipe[0], POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (poll(&pfd, 1, 100) <= 0)
      continue;
    if (read(out_pipe[0], &c, 1) != 1)
      break;
    if (c == '\n')
      break;
    first_line_ += c;
  }
  close(out_pipe[0]);
}

announcing_process::~announcing_process() {
  if (!reaped_)
    stop(SIGKILL);
  std::error_code ec;
  std::filesystem::remove(log_path_, ec);
}

int announcing_process::stop(int sig) {
  if (reaped_)
    return -1;
  ::kill(pid_, sig);
  reaped_ = true;
  if (auto code = reap_within(pid_, std::chrono::seconds(10)))
    return *code;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  return -2; // did not stop within 10 s
}

std::string announcing_process::log() const {
  return read_log(log_path_);
}

namespace {

std::vector<std::string> serve_args(const std::vector<std::string>& extra) {
  std::vector<std::string> args{spindle_binary(), "serve"};
  if (std::find(extra.begin(), extra.end(), "--port") == extra.end()) {
    args.push_back("--port");
    args.push_back("0");
  }
  if (std::find(extra.begin(), extra.end(), "--data") == extra.end()) {
    args.push_back("--data");
    args.push_back(":memory:");
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

} // namespace

server_process::server_process(const std::vector<std::string>& extra,
                               const std::map<std::string, std::string>& env)
  : process_(serve_args(extra), env) {
  // The first line on stdout is "spindle X serving on http://HOST:PORT".
  const auto& line = process_.first_line();
  auto colon = line.rfind(':');
  if (line.find("serving on") == std::string::npos
      || colon == std::string::npos)
    throw std::runtime_error("the server did not start: '" + line
                             + "'; log: " + log());
  port_ = std::stoi(line.substr(colon + 1));
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw std::runtime_error(std::string{"socket: "} + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
                 == 0
               && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                    == 0;
  auto err = errno;
  ::close(fd);
  if (!bound)
    throw std::runtime_error(std::string{"no free loopback port: "}
                             + std::strerror(err));
  return ntohs(addr.sin_port);
}

cluster::cluster(size_t n, std::vector<std::string> extra)
  : extra_(std::move(extra)) {
  if (!store_.on_postgres())
    throw std::runtime_error("a cluster needs the PostgreSQL run "
                             "(SPINDLE_TEST_PG_DIR)");
  for (size_t i = 0; i < n; ++i)
    add("node" + std::to_string(i));
}

cluster::~cluster() = default;

void cluster::add(const std::string& name) {
  add(name, store_.url());
}

void cluster::add(const std::string& name, const std::string& url) {
  auto port = free_port();
  dirs_.push_back(std::make_unique<temp_dir>());
  std::vector<std::string> args{"--store", url, "--port",
                                std::to_string(port), "--node-name", name,
                                "--advertise",
                                "http://127.0.0.1:" + std::to_string(port),
                                "--node-lease-ms", lease_ms, "--data",
                                dirs_.back()->str()};
  args.insert(args.end(), extra_.begin(), extra_.end());
  nodes_.push_back(std::make_unique<server_process>(args));
  names_.push_back(name);
}

size_t cluster::index_of(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name)
      return i;
  throw std::runtime_error("no node named " + name);
}

std::string cluster::owner(const std::string& thread) {
  return store_.query("SELECT coalesce(node, '') FROM thread_leases "
                      "WHERE thread_id = '"
                      + thread + "';");
}

size_t cluster::forwarded(size_t i, const std::string& to) const {
  auto log = nodes_.at(i)->log();
  auto what = "forwarded_to" + (to.empty() ? to : "=" + to);
  size_t n = 0;
  for (auto at = log.find(what); at != std::string::npos;
       at = log.find(what, at + 1))
    ++n;
  return n;
}

size_t cluster::forwarded() const {
  size_t n = 0;
  for (size_t i = 0; i < nodes_.size(); ++i)
    n += forwarded(i);
  return n;
}

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0')
    return fallback;
  char* end = nullptr;
  errno = 0;
  auto value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || *text == '-')
    throw std::runtime_error(std::string{name} + " is not a whole number: '"
                             + text + "'");
  return value;
}

std::string integrity_check(const std::filesystem::path& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr)
      != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return "cannot open " + path.string() + ": " + why;
  }
  sqlite3_stmt* stmt = nullptr;
  std::string found;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check;", -1, &stmt, nullptr)
      != SQLITE_OK) {
    found = std::string{"cannot check: "} + sqlite3_errmsg(db);
  } else {
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      if (!found.empty())
        found += '\n';
      auto row = sqlite3_column_text(stmt, 0);
      found += row ? reinterpret_cast<const char*>(row) : "(null)";
    }
    if (rc != SQLITE_DONE)
      found += std::string{found.empty() ? "" : "\n"} + "check failed: "
               + sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return found;
}

std::string spindle_binary() {
  return SPINDLE_BINARY;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line))
    out.push_back(line);
  return out;
}

pid_t dead_pid() {
  // Fork a child that exits at once and reap it: its PID is free until the
  // kernel cycles through the PID space.
  pid_t pid = fork();
  if (pid == 0)
    _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

namespace {

std::vector<std::string> upstream_arguments(std::vector<std::string> flags) {
  std::vector<std::string> args{SPINDLE_FAKE_UPSTREAM, "--port", "0",
                                "--exit-with-parent"};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

} // namespace

fake_upstream::fake_upstream(std::vector<std::string> flags)
  : process_(upstream_arguments(std::move(flags))) {
  const auto& line = process_.first_line();
  if (line.empty() || line.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error("spindle_fake_upstream did not start: '" + line
                             + "'; log: " + process_.log());
  port_ = std::stoi(line);
}

std::string fake_upstream::url(const std::string& scheme,
                               const std::string& host) const {
  return scheme + "://" + host + ":" + std::to_string(port_);
}

nlohmann::json fake_upstream::stats() const {
  httplib::Client cli{"127.0.0.1", port_};
  auto r = cli.Get("/stats");
  if (!r || r->status != 200)
    throw std::runtime_error("spindle_fake_upstream gave no /stats");
  return nlohmann::json::parse(r->body);
}

void raise_fd_limit() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
}

int connect_to(int port, int receive_buffer) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (receive_buffer > 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer,
               sizeof receive_buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

fd_guard::~fd_guard() {
  for (int fd : fds)
    if (fd >= 0)
      ::close(fd);
}

bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    auto n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0)
      return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::pair<int, nlohmann::json> post_json(httplib::Client& cli,
                                         const std::string& path,
                                         const nlohmann::json& body) {
  auto r = cli.Post(path, body.dump(), "application/json");
  if (!r)
    throw std::runtime_error("POST " + path + ": no reply");
  return {r->status, r->body.empty() ? nlohmann::json{}
                                     : nlohmann::json::parse(r->body, nullptr,
                                                             false)};
}

std::pair<int, nlohmann::json> get_json(httplib::Client& cli,
                                        const std::string& path) {
  auto r = cli.Get(path);
  if (!r)
    throw std::runtime_error("GET " + path + ": no reply");
  return {r->status, r->body.empty() ? nlohmann::json{}
                                     : nlohmann::json::parse(r->body, nullptr,
                                                             false)};
}

// -- event streams --------------------------------------------------------------

std::vector<sse_event> sse_events(const std::string& body) {
  std::vector<sse_event> out;
  std::string type;
  for (auto& line : lines(body)) {
    if (line.rfind("event: ", 0) == 0)
      type = line.substr(7);
    else if (line.rfind("data: ", 0) == 0)
      out.push_back(sse_event{{}, type,
                              nlohmann::json::parse(line.substr(6), nullptr,
                                                    false)});
  }
  return out;
}

sse_client::sse_client(int port, const std::string& target,
                       const std::map<std::string, std::string>& headers) {
  fd_ = connect_to(port);
  if (fd_ < 0)
    throw std::runtime_error("cannot connect to port " + std::to_string(port));
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Accept: text/event-stream\r\n";
  for (auto& [name, value] : headers)
    req += name + ": " + value + "\r\n";
  req += "\r\n";
  if (!send_all(fd_, req))
    throw std::runtime_error("cannot send the event stream request");
}

sse_client::~sse_client() {
  close();
}

void sse_client::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
  closed_ = true;
}

bool sse_client::read_some(int timeout_ms) {
  if (fd_ < 0)
    return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0)
    return true;
  char buf[65536];
  auto n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    close();
    return false;
  }
  if (n > 0)
    feed(buf, static_cast<size_t>(n));
  return true;
}

bool sse_client::wait_for(size_t n, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (events_.size() < n && !closed_
         && std::chrono::steady_clock::now() < until)
    read_some(20);
  return events_.size() >= n;
}

int sse_client::wait_status(std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (status_ == 0 && !closed_ && std::chrono::steady_clock::now() < until)
    read_some(20);
  // A reply that is not a stream: read it to its end.
  while (status_ != 0 && status_ != 200 && !closed_
         && std::chrono::steady_clock::now() < until
         && body_.find('}') == std::string::npos)
    read_some(20);
  return status_;
}

void sse_client::feed(const char* data, size_t n) {
  if (status_ == 0) {
    head_.append(data, n);
    auto end = head_.find("\r\n\r\n");
    if (end == std::string::npos)
      return;
    auto space = head_.find(' ');
    status_ = std::atoi(head_.c_str() + space + 1);
    auto lower = head_.substr(0, end);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    chunked_ = lower.find("transfer-encoding: chunked") != std::string::npos;
    raw_ = head_.substr(end + 4);
    head_.clear();
  } else {
    raw_.append(data, n);
  }
  if (!chunked_) {
    body_ += raw_;
    text_ += raw_;
    raw_.clear();
  } else {
    for (;;) {
      auto line = raw_.find("\r\n");
      if (line == std::string::npos)
        break;
      auto size = std::strtoul(raw_.c_str(), nullptr, 16);
      if (raw_.size() < line + 2 + size + 2)
        break;
      auto chunk = raw_.substr(line + 2, size);
      body_ += chunk;
      text_ += chunk;
      raw_.erase(0, line + 2 + size + 2);
      if (size == 0) {
        close();
        break;
      }
    }
  }
  if (status_ == 200)
    parse_events();
}

void sse_client::parse_events() {
  for (;;) {
    auto end = text_.find("\n\n");
    if (end == std::string::npos)
      return;
    auto frame = text_.substr(0, end);
    text_.erase(0, end + 2);
    sse_event e;
    std::string data;
    bool any = false;
    std::istringstream in{frame};
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("id: ", 0) == 0) {
        e.id = line.substr(4);
        any = true;
      } else if (line.rfind("event: ", 0) == 0) {
        e.type = line.substr(7);
        any = true;
      } else if (line.rfind("data: ", 0) == 0) {
        data += line.substr(6);
        any = true;
      }
    }
    if (!any || e.type.empty())
      continue; // a comment (keep-alive) or the retry hint
    e.data = data.empty() ? nlohmann::json{}
                          : nlohmann::json::parse(data, nullptr, false);
    events_.push_back(std::move(e));
  }
}

} // namespace spindle::test

// -- byte_counter -------------------------------------------------------------

namespace spindle::test {

token_encoding_id byte_counter::id() const noexcept {
  return token_encoding_id::none;
}

std::string_view byte_counter::name() const noexcept {
  return "bytes";
}

size_t byte_counter::count_text(std::string_view text) const {
  return text.size();
}

} // namespace spindle::test
