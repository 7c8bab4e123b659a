#include "files/session_lock.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace fs = std::filesystem;

namespace {

caf::error io_error(const std::string& what, int err = errno) {
  return make_error(errc::io_failure, what + ": " + std::strerror(err));
}

std::string iso_now() {
  char buf[64];
  auto now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

std::optional<session_holder> parse_holder(const std::string& text) {
  std::istringstream in{text};
  std::string pid, since, session, start;
  if (!std::getline(in, pid))
    return std::nullopt;
  std::getline(in, since);
  std::getline(in, session);
  std::getline(in, start);
  auto who = process_identity::parse(start.empty() ? pid : pid + ":" + start);
  if (!who)
    return std::nullopt;
  return session_holder{*who, since, session};
}

std::string read_fd(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  ::lseek(fd, 0, SEEK_SET);
  while ((n = ::read(fd, buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  return out;
}

// An unreadable lock (a seed script between `>` and its write) is treated
// as held until it is this old.
constexpr auto garbled_grace = std::chrono::seconds(5);

} // namespace

std::string session_holder::describe() const {
  std::string out = "pid " + std::to_string(who.pid);
  std::string details;
  if (!session.empty())
    details += "session " + session;
  if (!since.empty())
    details += (details.empty() ? "" : ", ") + std::string{"since "} + since;
  if (!details.empty())
    out += " (" + details + ")";
  return out;
}

caf::error validate_session_name(std::string_view name) {
  if (auto err = validate_agent_name(name))
    return make_error(errc::invalid_id,
                      "session name '" + std::string{name.substr(0, 64)}
                        + "' is invalid: 1 to 64 characters of A-Z a-z 0-9 "
                          ". _ -, not starting with '.' or '-'");
  return caf::none;
}

fs::path locks_dir(const fs::path& root) {
  return root / "locks";
}

session_lock::session_lock(fs::path path, std::string session,
                           process_identity me)
  : path_(std::move(path)), session_(std::move(session)), me_(me),
    held_(true) {
}

session_lock::session_lock(session_lock&& other) noexcept
  : path_(std::move(other.path_)), session_(std::move(other.session_)),
    me_(other.me_), held_(other.held_) {
  other.held_ = false;
}

session_lock& session_lock::operator=(session_lock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    session_ = std::move(other.session_);
    me_ = other.me_;
    held_ = other.held_;
    other.held_ = false;
  }
  return *this;
}

session_lock::~session_lock() {
  release();
}

std::optional<session_holder> session_lock::read(const fs::path& lock_file) {
  int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return std::nullopt;
  auto text = read_fd(fd);
  ::close(fd);
  return parse_holder(text);
}

void session_lock::release() {
  if (!held_)
    return;
  held_ = false;
  // Remove the file only while it is still ours: a holder is never taken
  // over while alive, so this is a safety net, not a race.
  auto holder = read(path_);
  if (holder && holder->who.pid == me_.pid
      && holder->who.start_time == me_.start_time)
    ::unlink(path_.c_str());
}

caf::expected<session_lock>
session_lock::acquire(const fs::path& root, const std::string& session,
                      session_holder* busy, const process_identity& me) {
  if (auto err = validate_session_name(session))
    return err;
  auto dir = locks_dir(root);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_failure, "cannot create '" + dir.string()
                                          + "': " + ec.message());
  auto path = dir / (session + ".lock");
  auto content = std::to_string(me.pid) + "\n" + iso_now() + "\n" + session
                 + "\n" + std::to_string(me.start_time) + "\n";
  auto tmp = dir / ("." + session + ".lock." + std::to_string(::getpid())
                    + "." + std::to_string(std::random_device{}()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return io_error("cannot create '" + tmp.string() + "'");
  auto written = ::write(fd, content.data(), content.size());
  ::close(fd);
  struct tmp_guard {
    fs::path p;
    ~tmp_guard() {
      ::unlink(p.c_str());
    }
  } guard{tmp};
  if (written != static_cast<ssize_t>(content.size()))
    return io_error("cannot write '" + tmp.string() + "'");
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (::link(tmp.c_str(), path.c_str()) == 0)
      return session_lock{path, session, me};
    if (errno != EEXIST)
      return io_error("cannot create '" + path.string() + "'");
    // Held. Judge the holder under flock, so that of several processes
    // finding the same stale lock only one removes it.
    int lfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (lfd < 0) {
      if (errno == ENOENT)
        continue; // released meanwhile
      return io_error("cannot read '" + path.string() + "'");
    }
    ::flock(lfd, LOCK_EX);
    struct stat held{}, now{};
    if (::fstat(lfd, &held) != 0 || ::stat(path.c_str(), &now) != 0
        || held.st_ino != now.st_ino || held.st_dev != now.st_dev) {
      ::close(lfd); // replaced or removed while we waited: look again
      continue;
    }
    auto holder = parse_holder(read_fd(lfd));
    bool stale;
    if (holder) {
      stale = !is_alive(holder->who);
    } else {
      auto age = std::chrono::seconds(std::time(nullptr) - held.st_mtime);
      stale = age >= garbled_grace;
    }
    if (!stale) {
      ::close(lfd);
      if (busy != nullptr)
        *busy = holder ? *holder : session_holder{{}, {}, session};
      return make_error(errc::conflict,
                        "session '" + session + "' is held by "
                          + (holder ? holder->describe()
                                    : std::string{"a process whose lock "
                                                  "file is being written"}));
    }
    ::unlink(path.c_str());
    ::close(lfd);
  }
  return make_error(errc::conflict,
                    "session '" + session + "' kept changing hands");
}

} // namespace spindle
