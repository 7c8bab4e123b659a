// `spindle worker`: turns a command into a leased HTTP worker. It claims
// tasks from a server (waiting up to --wait-s for one), runs the command
// for each with the task's payload on stdin, heartbeats the lease while the
// command runs, and completes the task with what the command printed, or
// fails it with how the command ended (docs/cli.md, "spindle worker").
//
// One thread does the work; signals (stop requests and the command's end)
// arrive through a signalfd, so they are handled between steps, never in a
// handler. Only a waiting claim runs on a thread of its own, so that a
// second stop request can end the worker while the claim waits.

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/orchestration.hpp"
#include "net/http_client.hpp"

extern char** environ;

namespace spindle::cli {

namespace {

using json = nlohmann::json;
using namespace std::chrono;
using steady = steady_clock;

/// Bytes of the command's standard error kept for a failure's reason.
constexpr size_t stderr_tail_bytes = 4096;
/// A payload's JSON text is put into SPINDLE_TASK_PAYLOAD only up to this
/// size (the kernel refuses an environment string over 128 KiB); it is
/// always on stdin.
constexpr size_t payload_env_bytes = 64 * 1024;
/// After SIGTERM, the time a command has before SIGKILL.
constexpr milliseconds kill_grace{5000};
/// Claims that find nothing are at most this frequent (with --wait-s 0).
constexpr milliseconds idle_claim_gap{1000};
constexpr milliseconds max_backoff{30000};

struct worker_args {
  std::string server;
  std::string token;
  std::string name;
  double lease_s = 30;
  double wait_s = 30;
  bool once = false;
  long max_tasks = 0;
  size_t max_output = 512 * 1024;
  std::vector<std::string> command;
};

void say(const std::string& text) {
  std::cerr << "spindle worker: " << text << "\n" << std::flush;
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string seconds_text(milliseconds d) {
  auto tenths = (d.count() + 50) / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10)
         + " s";
}

// -- signals --------------------------------------------------------------------

// SIGINT, SIGTERM and SIGHUP (stop requests) and SIGCHLD (the command
// ended), blocked from the start and read from a signalfd: none is lost
// between two checks. Construct it before any thread starts, so every
// thread inherits the mask.
class signal_inbox {
public:
  signal_inbox() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD})
      sigaddset(&set_, sig);
    ::pthread_sigmask(SIG_BLOCK, &set_, &previous_);
    fd_ = ::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd_ < 0)
      throw std::runtime_error(std::string{"signalfd: "}
                               + std::strerror(errno));
  }
  ~signal_inbox() {
    ::close(fd_);
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  signal_inbox(const signal_inbox&) = delete;
  signal_inbox& operator=(const signal_inbox&) = delete;

  int fd() const noexcept {
    return fd_;
  }
  /// The mask the process had before; a command runs with it.
  const sigset_t& previous() const noexcept {
    return previous_;
  }
  /// Reads what arrived; counts stop requests.
  void collect() {
    signalfd_siginfo info{};
    while (::read(fd_, &info, sizeof(info)) == sizeof(info))
      if (info.ssi_signo != SIGCHLD)
        ++stops_;
  }
  /// Stop requests so far.
  int stops() const noexcept {
    return stops_;
  }
  /// Sleeps for `d`, or less when a stop request comes.
  void sleep(milliseconds d) {
    auto until = steady::now() + d;
    auto before = stops_;
    while (stops_ == before) {
      auto left = duration_cast<milliseconds>(until - steady::now());
      if (left.count() <= 0)
        return;
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(left.count()) + 1);
      collect();
    }
  }

private:
  sigset_t set_{};
  sigset_t previous_{};
  int fd_ = -1;
  int stops_ = 0;
};

// -- the server -----------------------------------------------------------------

struct answer {
  int status = 0;      // 0: no answer came (`message` says why)
  json body;           // the JSON reply, null when none
  std::string code;    // the error's code, for an error reply
  std::string message; // the transport error, or the error's message

  bool transient() const {
    return status == 0 || status >= 500;
  }
  std::string describe() const {
    if (status == 0)
      return message;
    auto out = std::to_string(status);
    if (!code.empty())
      out += " " + code;
    if (!message.empty())
      out += ": " + message;
    return out;
  }
};

class server_api {
public:
  explicit server_api(const worker_args& args)
    : claims_(args.server,
              milliseconds{static_cast<int64_t>(args.wait_s * 1000) + 15000}),
      calls_(args.server,
             std::clamp(milliseconds{static_cast<int64_t>(args.lease_s * 1000)},
                        milliseconds{1000}, milliseconds{10000})) {
    if (!args.token.empty())
      headers_ = {{"Authorization", "Bearer " + args.token}};
  }

  answer claim(const json& body) {
    return finish(claims_.request("POST", "/v1/tasks/claim", dump(body),
                                  headers_));
  }
  answer post(const std::string& path, const json& body) {
    return finish(calls_.request("POST", path, dump(body), headers_));
  }
  answer get(const std::string& path) {
    return finish(calls_.request("GET", path, {}, headers_));
  }

private:
  static answer finish(net::blocking_http_client::response r) {
    answer out;
    out.status = r.status;
    if (r.status == 0) {
      out.message = r.error;
      return out;
    }
    if (!r.body.empty())
      out.body = json::parse(r.body, nullptr, false);
    if (out.body.is_discarded())
      out.body = nullptr;
    if (r.status >= 300) {
      auto error = out.body.is_object() ? out.body.value("error", json{})
                                        : json{};
      if (error.is_object()) {
        out.code = error.value("code", "");
        out.message = error.value("message", "");
      } else {
        out.message = r.body.substr(0, 200);
      }
    }
    return out;
  }

  net::blocking_http_client claims_;
  net::blocking_http_client calls_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

// Claims on a thread of its own while this one watches the signals: the
// first stop request lets the claim end (a task it brings is worked on, as
// a claimed task must be: nobody else can take it before its lease ends);
// a second one ends the worker at once.
answer claim_watching_signals(server_api& api, const json& body,
                              signal_inbox& signals, double wait_s) {
  int done = ::eventfd(0, EFD_CLOEXEC);
  if (done < 0)
    return api.claim(body);
  answer out;
  std::thread claimer{[&] {
    out = api.claim(body);
    uint64_t one = 1;
    auto ignored = ::write(done, &one, sizeof(one));
    (void) ignored;
  }};
  auto stops = signals.stops();
  while (true) {
    pollfd fds[2] = {{done, POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    ::poll(fds, 2, -1);
    if (fds[0].revents & POLLIN)
      break;
    signals.collect();
    if (signals.stops() == stops)
      continue;
    stops = signals.stops();
    if (stops >= 2) {
      say("stopping now; a task the claim under way takes after this "
          "becomes stale when its lease ends");
      std::_Exit(exit_code::ok);
    }
    say("stopping: waiting for the claim under way to end (up to "
        + seconds_text(milliseconds{static_cast<int64_t>(wait_s * 1000)})
        + "); a second signal stops at once");
  }
  claimer.join();
  ::close(done);
  return out;
}

// -- running a task's command ---------------------------------------------------

struct claimed_task {
  std::string id;
  std::string lease;
  std::string payload; // JSON text
};

struct run_outcome {
  bool started = false;     // fork succeeded
  bool exited = false;      // else a signal ended it
  int status = 0;           // exit status or signal number
  std::string out;          // stdout, at most max_output bytes
  bool out_overflow = false;
  std::string err_tail;     // the last stderr_tail_bytes of stderr
  bool lease_lost = false;  // the server took the lease back: stopped
  bool stopped = false;     // the worker was told to stop at once
  std::string start_error;  // why it did not start
  steady::time_point lease_until; // when the last confirmed lease ends
  milliseconds took{0};
};

std::vector<std::string> command_environment(const worker_args& args,
                                             const claimed_task& task) {
  std::vector<std::pair<std::string, std::string>> ours{
    {"SPINDLE_TASK_ID", task.id},
    {"SPINDLE_LEASE", task.lease},
    {"SPINDLE_SERVER", args.server},
    {"SPINDLE_WORKER", args.name}};
  if (task.payload.size() <= payload_env_bytes)
    ours.emplace_back("SPINDLE_TASK_PAYLOAD", task.payload);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry{*e};
    auto name = entry.substr(0, entry.find('='));
    // The payload variable goes even when it is not set again: a stale one
    // from the worker's own environment would mislead the command.
    if (name == "SPINDLE_TASK_PAYLOAD"
        || std::any_of(ours.begin(), ours.end(),
                       [&](auto& kv) { return kv.first == name; }))
      continue;
    env.push_back(std::move(entry));
  }
  for (auto& [name, value] : ours)
    env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& xs) {
  std::vector<char*> out;
  for (auto& x : xs)
    out.push_back(x.data());
  out.push_back(nullptr);
  return out;
}

void close_fd(int& fd) {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
}

// The command as a child in a process group of its own (a terminal's ^C
// reaches the worker only, and a stop reaches the command's children too),
// ended with SIGTERM if the worker dies. Its ends of the pipes: in, out, err.
struct child_process {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
  int err = -1;
};

child_process start_command(const worker_args& args, const claimed_task& task,
                            const signal_inbox& signals, std::string& why) {
  child_process c;
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0
      || ::pipe2(err, O_CLOEXEC) != 0) {
    why = std::string{"pipe: "} + std::strerror(errno);
    return c;
  }
  auto argv_text = args.command;
  auto env_text = command_environment(args, task);
  auto argv = c_strings(argv_text);
  auto envp = c_strings(env_text);
  auto parent = ::getpid();
  std::cout << std::flush;
  std::cerr << std::flush;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(127);
    ::pthread_sigmask(SIG_SETMASK, &signals.previous(), nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    std::string msg = "spindle worker: cannot run '" + args.command[0]
                      + "': " + std::strerror(errno) + "\n";
    auto ignored = ::write(2, msg.data(), msg.size());
    (void) ignored;
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (c.pid < 0) {
    why = std::string{"fork: "} + std::strerror(fork_errno);
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    return c;
  }
  ::setpgid(c.pid, c.pid); // also here: whichever runs first
  c.in = in[1];
  c.out = out[0];
  c.err = err[0];
  for (int fd : {c.in, c.out, c.err})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return c;
}

// Hands what `fd` holds now to `take`, at most 1 MiB (a command writing
// without pause must not keep the heartbeats waiting); closes `fd` at its
// end.
void read_available(int& fd,
                    const std::function<void(const char*, size_t)>& take) {
  char buf[65536];
  for (int reads = 0; fd >= 0 && reads < 16; ++reads) {
    auto got = ::read(fd, buf, sizeof(buf));
    if (got > 0) {
      take(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
      return;
    close_fd(fd); // end of file, or an error
  }
}

class task_run {
public:
  // `claimed_at`: when the claim's answer came; the lease started before.
  task_run(const worker_args& args, server_api& api, signal_inbox& signals,
           const claimed_task& task, steady::time_point claimed_at)
    : args_(args), api_(api), signals_(signals), task_(task) {
    lease_ = milliseconds{static_cast<int64_t>(args.lease_s * 1000)};
    beat_every_ = std::max(lease_ / 3, milliseconds{100});
    out_.lease_until = claimed_at + lease_;
    next_beat_ = claimed_at + beat_every_;
  }

  run_outcome run() {
    auto started = steady::now();
    child_ = start_command(args_, task_, signals_, out_.start_error);
    if (child_.pid < 0)
      return out_;
    out_.started = true;
    input_ = task_.payload + "\n";
    stops_seen_ = signals_.stops();
    if (stops_seen_ > 0)
      say("task " + task_.id + " was claimed before the stop request came; "
          "running it first (a second signal ends its command)");
    while (!reaped_)
      step();
    // Everything the command wrote before it ended is in the pipes now.
    read_output();
    close_fd(child_.in);
    close_fd(child_.out);
    close_fd(child_.err);
    out_.took = duration_cast<milliseconds>(steady::now() - started);
    return out_;
  }

private:
  void step() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    if (child_.out >= 0)
      fds.push_back({child_.out, POLLIN, 0});
    if (child_.err >= 0)
      fds.push_back({child_.err, POLLIN, 0});
    if (child_.in >= 0)
      fds.push_back({child_.in, POLLOUT, 0});
    ::poll(fds.data(), fds.size(), wait_ms());
    signals_.collect();
    reap();
    if (reaped_)
      return;
    on_stop_requests();
    read_output();
    write_input();
    auto now = steady::now();
    if (!out_.lease_lost && now >= next_beat_)
      heartbeat();
    if (kill_at_ && steady::now() >= *kill_at_) {
      ::kill(-child_.pid, SIGKILL);
      kill_at_.reset();
    }
  }

  int wait_ms() const {
    auto due = out_.lease_lost ? steady::time_point::max() : next_beat_;
    if (kill_at_)
      due = std::min(due, *kill_at_);
    if (due == steady::time_point::max())
      return -1;
    auto left = duration_cast<milliseconds>(due - steady::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60000));
  }

  void reap() {
    int status = 0;
    if (::waitpid(child_.pid, &status, WNOHANG) != child_.pid)
      return;
    reaped_ = true;
    out_.exited = WIFEXITED(status);
    out_.status = out_.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  }

  // SIGTERM to the command's process group, SIGKILL after the grace.
  void terminate() {
    if (terminating_)
      return;
    terminating_ = true;
    ::kill(-child_.pid, SIGTERM);
    kill_at_ = steady::now() + kill_grace;
  }

  void on_stop_requests() {
    auto stops = signals_.stops();
    if (stops == stops_seen_)
      return;
    stops_seen_ = stops;
    if (stops == 1) {
      say("stopping after task " + task_.id + ": its command is left to "
          "finish; a second signal ends it");
      return;
    }
    if (!out_.stopped) {
      out_.stopped = true;
      say("ending the command of task " + task_.id + " (SIGTERM, SIGKILL "
          "after " + seconds_text(kill_grace) + ")");
      terminate();
    }
  }

  void read_output() {
    read_available(child_.out, [this](const char* data, size_t n) {
      auto room = args_.max_output - std::min(args_.max_output,
                                              out_.out.size());
      out_.out.append(data, std::min(n, room));
      if (n > room)
        out_.out_overflow = true;
    });
    read_available(child_.err, [this](const char* data, size_t n) {
      // The worker's own stderr shows what the command says.
      for (size_t done = 0; done < n;) {
        auto wrote = ::write(2, data + done, n - done);
        if (wrote <= 0)
          break;
        done += static_cast<size_t>(wrote);
      }
      out_.err_tail.append(data, n);
      if (out_.err_tail.size() > stderr_tail_bytes)
        out_.err_tail.erase(0, out_.err_tail.size() - stderr_tail_bytes);
    });
  }

  void write_input() {
    while (child_.in >= 0 && written_ < input_.size()) {
      auto wrote = ::write(child_.in, input_.data() + written_,
                           input_.size() - written_);
      if (wrote > 0) {
        written_ += static_cast<size_t>(wrote);
        continue;
      }
      if (wrote < 0 && (errno == EAGAIN || errno == EINTR))
        return;
      close_fd(child_.in); // the command closed its stdin: fine
    }
    close_fd(child_.in);
  }

  void heartbeat() {
    auto sent = steady::now();
    auto r = api_.post("/v1/tasks/" + task_.id + "/heartbeat",
                       {{"lease", task_.lease}, {"lease_s", args_.lease_s}});
    if (r.status == 200) {
      out_.lease_until = sent + lease_;
      next_beat_ = sent + beat_every_;
      return;
    }
    if (r.status == 409 || r.status == 404) {
      out_.lease_lost = true;
      say("task " + task_.id + ": the lease is lost (" + r.describe()
          + "); ending its command, its result will not be reported");
      terminate();
      return;
    }
    say("task " + task_.id + ": heartbeat failed (" + r.describe()
        + "); trying again");
    next_beat_ = steady::now() + beat_every_ / 2;
  }

  const worker_args& args_;
  server_api& api_;
  signal_inbox& signals_;
  const claimed_task& task_;
  milliseconds lease_{};
  milliseconds beat_every_{};
  steady::time_point next_beat_;
  std::optional<steady::time_point> kill_at_;
  child_process child_;
  std::string input_;
  size_t written_ = 0;
  int stops_seen_ = 0;
  bool reaped_ = false;
  bool terminating_ = false;
  run_outcome out_;
};

// -- reporting ------------------------------------------------------------------

// A command's output as a result: its JSON value when it is JSON, else the
// text without its trailing newlines (as a shell's $(...) gives it).
json result_of(std::string out) {
  auto parsed = json::parse(out, nullptr, false);
  if (!parsed.is_discarded())
    return parsed;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out;
}

json reason_of(const run_outcome& r, const worker_args& args) {
  json reason = json::object();
  if (!r.started) {
    reason["error"] = "the command did not start: " + r.start_error;
    return reason;
  }
  if (r.exited)
    reason["exit_status"] = r.status;
  else
    reason["signal"] = r.status;
  if (r.out_overflow)
    reason["error"] = "the command printed more than "
                      + std::to_string(args.max_output)
                      + " bytes (--max-output)";
  else if (r.stopped)
    reason["error"] = "the worker was stopped and ended the command";
  reason["stderr"] = r.err_tail;
  return reason;
}

std::string ending_of(const run_outcome& r) {
  if (!r.started)
    return "did not start";
  return (r.exited ? "exit " : "signal ") + std::to_string(r.status) + ", "
         + seconds_text(r.took);
}

// Completes or fails the task. Retries a request the server did not answer
// while the lease may still hold; a retry answered 409 looks at the task,
// since the first attempt may have reached the server.
void report(server_api& api, signal_inbox& signals, const worker_args& args,
            const claimed_task& task, const run_outcome& r) {
  bool complete = r.started && r.exited && r.status == 0 && !r.out_overflow;
  json body{{"lease", task.lease}};
  if (complete)
    body["result"] = result_of(r.out);
  else
    body["reason"] = reason_of(r, args);
  milliseconds pause{250};
  bool retried = false;
  while (true) {
    auto verb = complete ? "complete" : "fail";
    auto a = api.post("/v1/tasks/" + task.id + "/" + verb, body);
    if (a.status == 200) {
      say("task " + task.id + (complete ? " completed (" : " failed (")
          + ending_of(r) + ")");
      return;
    }
    if (a.status == 413 && complete) {
      // Larger than the server takes: the task fails, saying so.
      complete = false;
      json reason{{"exit_status", 0},
                  {"error", "the server refused the result as too large ("
                              + a.describe() + ")"},
                  {"stderr", r.err_tail}};
      body.erase("result");
      body["reason"] = reason;
      continue;
    }
    if (a.transient() && steady::now() + pause < r.lease_until
        && signals.stops() < 2) {
      say("cannot report task " + task.id + " yet (" + a.describe()
          + "); retrying in " + seconds_text(pause));
      signals.sleep(pause);
      pause = std::min(pause * 2, milliseconds{5000});
      retried = true;
      continue;
    }
    if (retried && a.status == 409) {
      auto t = api.get("/v1/tasks/" + task.id);
      auto state = complete ? "completed" : "failed";
      if (t.status == 200 && t.body.is_object()
          && t.body.value("state", "") == state
          && t.body.value("worker", "") == args.name) {
        say("task " + task.id + " " + state + " (" + ending_of(r) + ")");
        return;
      }
    }
    say("task " + task.id + ": the server did not take its "
        + (complete ? "result" : "failure") + " (" + a.describe() + ")");
    return;
  }
}

// -- the loop -------------------------------------------------------------------

std::optional<claimed_task> read_claim(const answer& a) {
  if (!a.body.is_object())
    return std::nullopt;
  auto id = a.body.find("id");
  auto lease = a.body.find("lease");
  if (id == a.body.end() || !id->is_string() || lease == a.body.end()
      || !lease->is_object() || !lease->value("token", json{}).is_string())
    return std::nullopt;
  return claimed_task{id->get<std::string>(),
                      (*lease)["token"].get<std::string>(),
                      dump(a.body.value("payload", json{}))};
}

// Makes sure descriptors 0, 1 and 2 are open, so that no pipe of a command
// lands on one of them.
void open_standard_descriptors() {
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0)
      ::open("/dev/null", O_RDWR);
}

int work(const worker_args& args) {
  if (auto err = validate_worker_name(args.name)) {
    say("--name: " + describe(err));
    return exit_code::usage;
  }
  if (args.command.empty()) {
    say("no command given (spindle worker ... -- COMMAND [ARGS...])");
    return exit_code::usage;
  }
  open_standard_descriptors();
  ::signal(SIGPIPE, SIG_IGN);
  signal_inbox signals;
  std::unique_ptr<server_api> api;
  try {
    api = std::make_unique<server_api>(args);
  } catch (const std::invalid_argument& e) {
    say(std::string{"--server: "} + e.what());
    return exit_code::usage;
  }
  json claim{{"worker", args.name},
             {"lease_s", args.lease_s},
             {"wait_s", args.wait_s}};
  std::mt19937 rng{std::random_device{}()};
  milliseconds backoff{500};
  long done = 0;
  while (true) {
    signals.collect();
    if (signals.stops() > 0)
      break;
    auto asked = steady::now();
    auto a = claim_watching_signals(*api, claim, signals, args.wait_s);
    if (a.status == 200) {
      backoff = milliseconds{500};
      auto task = read_claim(a);
      if (!task) {
        say("the server's claim answer names no task and lease: "
            + dump(a.body).substr(0, 200));
        return exit_code::failure;
      }
      auto outcome = task_run{args, *api, signals, *task, steady::now()}
                       .run();
      if (!outcome.lease_lost)
        report(*api, signals, args, *task, outcome);
      ++done;
      if (args.once || (args.max_tasks > 0 && done >= args.max_tasks))
        return exit_code::ok;
      continue;
    }
    if (a.status == 204) {
      backoff = milliseconds{500};
      if (args.once)
        return signals.stops() > 0 ? exit_code::ok : exit_code::nothing;
      auto took = duration_cast<milliseconds>(steady::now() - asked);
      if (took < idle_claim_gap)
        signals.sleep(idle_claim_gap - took);
      continue;
    }
    if (a.transient()) {
      // Full jitter over the upper half, so restarts spread out.
      std::uniform_int_distribution<int64_t> pick(backoff.count() / 2,
                                                  backoff.count());
      milliseconds pause{pick(rng)};
      say((a.status == 0 ? "cannot reach " + args.server + " ("
                         : "the server answered the claim with ")
          + a.describe() + (a.status == 0 ? ")" : "") + "; retrying in "
          + seconds_text(pause));
      signals.sleep(pause);
      backoff = std::min(backoff * 2, max_backoff);
      continue;
    }
    say("the server refused the claim (" + a.describe() + ")"
        + (a.status == 401 ? "; give its token with --token or SPINDLE_TOKEN"
                           : ""));
    return a.status == 400 ? exit_code::usage : exit_code::failure;
  }
  say("stopped after " + std::to_string(done) + " task(s)");
  return exit_code::ok;
}

} // namespace

void add_worker(CLI::App& app, registry& commands) {
  auto args = std::make_shared<worker_args>();
  auto* sub = app.add_subcommand(
    "worker",
    "Run COMMAND as a leased HTTP worker: claim a task from the server "
    "(waiting up to --wait-s), run COMMAND with the task's payload (JSON) on "
    "stdin and SPINDLE_TASK_ID, SPINDLE_TASK_PAYLOAD, SPINDLE_LEASE in its "
    "environment, heartbeat the lease every third of it while COMMAND runs, "
    "then complete the task with COMMAND's stdout (JSON if it parses, else "
    "a string) when it exits 0, or fail it with its exit status or signal "
    "and the end of its stderr. A lost lease ends COMMAND and reports "
    "nothing. SIGINT/SIGTERM: stop claiming, let COMMAND finish, exit 0 (a "
    "second signal ends COMMAND). Exit codes: 0 stopped, or --once/"
    "--max-tasks done; 1 the server refused the worker; 2 bad arguments; 3 "
    "--once and no task came within --wait-s.");
  sub->add_option("--server", args->server,
                  "base URL of the server, e.g. http://127.0.0.1:8080")
    ->envname("SPINDLE_SERVER")
    ->required();
  sub->add_option("--token", args->token, "bearer token of the server")
    ->envname("SPINDLE_TOKEN");
  sub->add_option("--name", args->name,
                  "worker name the server records (1-128 printable ASCII, no "
                  "spaces)")
    ->required();
  sub->add_option("--lease-s", args->lease_s,
                  "lease length in seconds (default 30)")
    ->check(CLI::Range(1.0, 3600.0));
  sub->add_option("--wait-s", args->wait_s,
                  "seconds a claim waits for a task (default 30)")
    ->check(CLI::Range(0.0, 60.0));
  sub->add_flag("--once", args->once,
                "claim once: work on at most one task, exit 3 when none came");
  sub->add_option("--max-tasks", args->max_tasks,
                  "exit 0 after this many tasks (default 0: no limit)")
    ->check(CLI::Range(0L, 1000000000L));
  sub->add_option("--max-output", args->max_output,
                  "bytes of COMMAND's stdout kept as the result; more fails "
                  "the task (default 524288)")
    ->check(CLI::Range(size_t{1}, size_t{64} << 20));
  sub->add_option("command", args->command, "COMMAND [ARGS...] after --")
    ->required();
  commands.on(sub, [args] { return work(*args); });
}

} // namespace spindle::cli
