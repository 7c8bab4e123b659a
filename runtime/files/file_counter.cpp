#include "files/file_counter.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/process.hpp"

namespace spindle {

namespace fs = std::filesystem;
using namespace std::chrono;

namespace {

caf::error io_error(const std::string& what, int err = errno) {
  return make_error(errc::io_failure, what + ": " + std::strerror(err));
}

// rename(2) that never replaces an existing target.
int rename_noreplace(const std::string& from, const std::string& to) {
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(),
                                    AT_FDCWD, to.c_str(), 1u /* NOREPLACE */));
}

// Reads the counter value from a file we hold. A seed-protocol writer
// (`echo next > file`) may still be between truncating and writing when we
// rename its file; it keeps writing through its open descriptor, so an empty
// read is retried briefly.
caf::expected<std::string> read_value(const std::string& path) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return io_error("cannot read counter '" + path + "'");
    char buf[64];
    auto got = ::read(fd, buf, sizeof(buf));
    ::close(fd);
    if (got < 0)
      return io_error("cannot read counter '" + path + "'");
    std::string text{buf, static_cast<size_t>(got)};
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r'
                             || text.back() == ' ' || text.back() == '\t'))
      text.pop_back();
    if (!text.empty())
      return text;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return make_error(errc::io_failure, "counter '" + path + "' stays empty");
}

// Overwrites the value of a file we hold, in place.
caf::error write_value(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return io_error("cannot write counter '" + path + "'");
  auto line = value + "\n";
  auto rc = ::pwrite(fd, line.data(), line.size(), 0);
  int err = errno;
  if (rc == static_cast<ssize_t>(line.size()))
    rc = ::ftruncate(fd, static_cast<off_t>(line.size()));
  ::close(fd);
  if (rc < 0)
    return io_error("cannot write counter '" + path + "'", err);
  return caf::none;
}

// Creates `path` holding `value` only if it does not exist (link(2) of a
// finished temporary file: the file never appears half-written).
// Returns true if created, false if it existed.
caf::expected<bool> create_exclusive(const fs::path& dir,
                                     const std::string& path,
                                     const std::string& value) {
  auto tmp = (dir / (".tmp." + std::to_string(::getpid()) + "."
                     + std::to_string(std::random_device{}())))
               .string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return io_error("cannot create '" + tmp + "'");
  auto line = value + "\n";
  auto rc = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (rc != static_cast<ssize_t>(line.size())) {
    ::unlink(tmp.c_str());
    return io_error("cannot write '" + tmp + "'");
  }
  auto linked = ::link(tmp.c_str(), path.c_str());
  int err = errno;
  ::unlink(tmp.c_str());
  if (linked == 0)
    return true;
  if (err == EEXIST)
    return false;
  return io_error("cannot create '" + path + "'", err);
}

struct claim_file {
  std::string path;
  process_identity owner; // start_time 0 when the name carries only a PID
};

// Lists `{base}.claimed.*` files: ours ({pid}.{start}) and the seed's ({pid}).
std::vector<claim_file> list_claims(const fs::path& dir,
                                    const std::string& base) {
  std::vector<claim_file> out;
  auto prefix = base + ".claimed.";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return out;
  while (auto* entry = ::readdir(d)) {
    std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0)
      continue;
    // {pid} (the seed's), or {pid}.{start}.{thread} (spindle's).
    auto rest = name.substr(prefix.size());
    auto dot = rest.find('.');
    auto owner_text = rest.substr(0, dot);
    if (dot != std::string::npos)
      owner_text += ":" + rest.substr(dot + 1, rest.find('.', dot + 1)
                                                 - dot - 1);
    auto owner = process_identity::parse(owner_text);
    if (owner)
      out.push_back({(dir / name).string(), *owner});
  }
  ::closedir(d);
  return out;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0;
}

// Age of a claim file: time since it was renamed into place (its ctime).
milliseconds age_of(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0)
    return milliseconds(0);
  auto changed = seconds(st.st_ctim.tv_sec) + nanoseconds(st.st_ctim.tv_nsec);
  auto now = system_clock::now().time_since_epoch();
  return duration_cast<milliseconds>(now - changed);
}

// True if a token for the counter is visible: the counter file or any claim
// file other than `except`. Looks twice, because a claim and a release that
// both happen during one directory scan can hide the token from that scan.
bool token_visible(const fs::path& dir, const std::string& base,
                   const std::string& counter, const std::string& except) {
  for (int pass = 0; pass < 3; ++pass) {
    if (exists(counter))
      return true;
    for (auto& c : list_claims(dir, base))
      if (c.path != except)
        return true;
    std::this_thread::sleep_for(microseconds(200));
  }
  return exists(counter);
}

// What a counter file holds once ZZZZ, the last value, was handed out. It
// is not hybrid base36 (hybrid36::parse refuses it), so no reader can take
// it for a value, and it is recognised in whatever whitespace surrounds it.
constexpr std::string_view end_marker = "exhausted";

// The text a counter file holds after `value` was handed out: its
// successor, or the end marker after ZZZZ.
std::string successor_text(uint64_t value) {
  return value >= hybrid36::max_ordinal
           ? std::string{end_marker}
           : *hybrid36::format(value + 1);
}

caf::error exhausted_error(const std::string& counter) {
  return make_error(errc::exhausted,
                    "counter '" + counter + "' is exhausted: ZZZZ, the last "
                    "4-character value, was handed out and nothing follows "
                    "it");
}

class backoff {
public:
  void wait() {
    std::uniform_int_distribution<long> pick(0, ceiling_.count());
    std::this_thread::sleep_for(microseconds(pick(rng_)));
    ceiling_ = std::min(ceiling_ * 2, microseconds(10000));
  }

private:
  std::mt19937 rng_{std::random_device{}()};
  microseconds ceiling_{50};
};

} // namespace

fs::path counters_dir(const fs::path& root) {
  return root / "ai_comms" / "counters";
}

fs::path default_root() {
  if (auto* env = std::getenv("AI_ROOT"); env != nullptr && *env != '\0')
    return env;
  return fs::current_path();
}

caf::expected<std::string> claim_next_id(const fs::path& root,
                                         std::string_view prefix,
                                         const claim_options& options) {
  auto kind = classify_counter_key(prefix);
  if (!kind || *kind == counter_kind::context)
    return make_error(errc::invalid_id,
                      "prefix '" + std::string{prefix.substr(0, 64)}
                        + "' must be 'global' or a task ID such as 0001 or "
                          "0001_t1");
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return make_error(errc::io_failure,
                      "root '" + root.string() + "' is not a directory");
  auto dir = counters_dir(root);
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_failure, "cannot create '" + dir.string()
                                          + "': " + ec.message());
  auto base = std::string{prefix} + ".NextId";
  auto counter = (dir / base).string();
  auto init_marker = counter + ".init";
  auto me = self_identity();
  // Unique per thread, so threads of one process never share a claim file.
  auto mine = counter + ".claimed." + std::to_string(me.pid) + "."
              + std::to_string(me.start_time) + "."
              + std::to_string(::syscall(SYS_gettid));
  auto deadline = steady_clock::now() + options.timeout;
  backoff pause;
  std::string busy_with;

  while (true) {
    if (::rename(counter.c_str(), mine.c_str()) == 0) {
      // We hold the counter. Hand out its value; put back the successor.
      auto text = read_value(mine);
      if (!text) {
        rename_noreplace(mine, counter);
        return text.error();
      }
      if (*text == end_marker) {
        rename_noreplace(mine, counter);
        return exhausted_error(counter);
      }
      auto value = hybrid36::parse(*text);
      if (!value) {
        rename_noreplace(mine, counter);
        return make_error(errc::io_failure,
                          "counter '" + counter + "' holds '"
                            + text->substr(0, 16)
                            + "', not a hybrid base36 value");
      }
      auto current = std::max<uint64_t>(*value, 1); // "0000" means 0001
      if (auto err = write_value(mine, successor_text(current))) {
        rename_noreplace(mine, counter);
        return err;
      }
      if (rename_noreplace(mine, counter) != 0)
        return io_error("cannot release counter '" + counter + "' (claim "
                        "left at '" + mine + "')");
      if (!exists(init_marker))
        create_exclusive(dir, init_marker, "done");
      return render_id(prefix, current);
    }
    if (errno != ENOENT)
      return io_error("cannot claim counter '" + counter + "'");

    // The counter is away: held by a claimer, lost by a dead one, or new.
    bool live_holder = false;
    for (auto& claim : list_claims(dir, base)) {
      if (claim.path == mine)
        continue;
      if (is_alive(claim.owner)) {
        live_holder = true;
        busy_with = claim.owner.to_string();
        continue;
      }
      if (age_of(claim.path) < options.stale_grace) {
        live_holder = true; // not stale yet; wait for the grace period
        continue;
      }
      // A dead claimer's file: take it over, then decide what it was.
      if (rename_noreplace(claim.path, mine) != 0)
        continue; // another recoverer was faster
      if (token_visible(dir, base, counter, mine)) {
        // The claimer had already put the counter back (the seed's release
        // writes the counter first and removes its claim second): leftover.
        ::unlink(mine.c_str());
        continue;
      }
      auto text = read_value(mine);
      bool ended = text && *text == end_marker;
      auto value = text && !ended ? hybrid36::parse(*text) : std::nullopt;
      if (!ended && !value) {
        rename_noreplace(mine, counter);
        return make_error(errc::io_failure,
                          "cannot recover counter '" + counter
                            + "' from a dead claimer's file");
      }
      // Skip the value the dead claimer may have handed out; after ZZZZ
      // (or once ended) the counter stays ended.
      auto restored = ended ? std::string{end_marker}
                            : successor_text(std::max<uint64_t>(*value, 1));
      if (auto err = write_value(mine, restored))
        return err;
      rename_noreplace(mine, counter);
      live_holder = true; // retry the claim at once
      break;
    }
    if (!live_holder && !exists(init_marker)) {
      // Never seen before: create it, once, and only with no claim around.
      auto marked = create_exclusive(dir, init_marker, me.to_string());
      if (!marked)
        return marked.error();
      if (*marked && !token_visible(dir, base, counter, mine)) {
        auto created = create_exclusive(dir, counter, "0001");
        if (!created)
          return created.error();
      }
      if (*marked)
        write_value(init_marker, "done");
      continue;
    }
    if (!live_holder) {
      // Initialised before, yet neither counter nor claim is there: either
      // an initialiser died between its marker and the counter, or the
      // counter was removed by hand.
      auto text = read_value(init_marker);
      auto owner = text ? process_identity::parse(*text) : std::nullopt;
      if (owner && !is_alive(*owner)
          && age_of(init_marker) >= options.stale_grace
          && !token_visible(dir, base, counter, mine)) {
        ::unlink(init_marker.c_str());
        continue;
      }
    }
    if (steady_clock::now() >= deadline)
      return make_error(
        errc::timeout,
        busy_with.empty()
          ? "counter '" + counter + "' is missing and no live process holds "
              "it (was it removed by hand?)"
          : "counter '" + counter + "' is held by process " + busy_with
              + " for longer than " + std::to_string(options.timeout.count())
              + " ms");
    pause.wait();
  }
}

} // namespace spindle
