#include "numattn/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "numattn/core/error.h"

namespace numattn {

namespace fs = std::filesystem;

namespace {

std::string sys_error(int err) { return std::system_category().message(err); }

// Symlink chains are followed by hand (and bounded) so that the temporary is created next to
// the real file: renaming over the link itself would turn it into a regular file.
fs::path follow_symlinks(const std::string& path, std::string_view what) {
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    NUMATTN_CHECK(hops < 40, "{} '{}': too many levels of symbolic links", what, path);
    const fs::path t = fs::read_symlink(p, ec);
    NUMATTN_CHECK(!ec, "{} '{}': cannot read symbolic link '{}': {}", what, path, p.string(),
                  ec.message());
    p = t.is_absolute() ? t : p.parent_path() / t;
  }
  return p;
}

void fsync_directory(const fs::path& dir, std::string_view what, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename is done; a directory we cannot open cannot be synced
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the data itself is already synced.
  NUMATTN_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP,
                "{} '{}' was renamed into place but syncing its directory failed: {}", what, path,
                sys_error(err));
}

std::atomic<unsigned> g_temp_counter{0};

}  // namespace

namespace {
// Opens an input for reading after naming what is wrong with it: an empty path, a missing file,
// a directory, or (when `regular_only`) a device, FIFO or socket. Returns the descriptor.
int open_input(const std::string& path, std::string_view what, bool regular_only) {
  NUMATTN_CHECK(!path.empty(), "{}: empty path", what);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  NUMATTN_CHECK(fs::exists(st), "{} '{}' does not exist{}", what, path,
                ec && ec != std::errc::no_such_file_or_directory ? ": " + ec.message() : "");
  NUMATTN_CHECK(!fs::is_directory(st), "{} '{}' is a directory, not a file", what, path);
  NUMATTN_CHECK(!regular_only || fs::is_regular_file(st),
                "{} '{}' is not a regular file (a device, FIFO or socket)", what, path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  NUMATTN_CHECK(fd >= 0, "cannot read {} '{}': {}", what, path, sys_error(errno));
  return fd;
}
}  // namespace

void check_input_file(const std::string& path, std::string_view what) {
  ::close(open_input(path, what, true));
}

std::string read_file(const std::string& path, std::string_view what) {
  // Pipes and devices are read to their end (e.g. a shell's <(...)); only directories refused.
  const int fd = open_input(path, what, false);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("error reading {} '{}': {}", what, path, sys_error(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) {
    std::error_code ec;
    const bool eq = fs::equivalent(a, b, ec);
    return !ec && eq;
  }
  // Absolute first: libstdc++ leaves a relative path with no existing prefix untouched.
  const fs::path aa = fs::absolute(a, ea), ab = fs::absolute(b, eb);
  if (ea || eb) return false;
  const fs::path ca = fs::weakly_canonical(aa, ea), cb = fs::weakly_canonical(ab, eb);
  if (ea || eb) return aa.lexically_normal() == ab.lexically_normal();
  return ca.lexically_normal() == cb.lexically_normal();
}

void check_outputs_distinct(const std::vector<NamedPath>& outputs,
                            const std::vector<NamedPath>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& o = outputs[i];
    if (o.path.empty()) continue;
    for (const NamedPath& in : inputs)
      NUMATTN_CHECK(in.path.empty() || !same_file(o.path, in.path),
                    "{} '{}' is the same file as the input {} '{}': numattn never overwrites its "
                    "inputs; choose another output path",
                    o.what, o.path, in.what, in.path);
    for (std::size_t j = 0; j < i; ++j)
      NUMATTN_CHECK(outputs[j].path.empty() || !same_file(o.path, outputs[j].path),
                    "{} '{}' and {} '{}' are the same file: give each output its own path",
                    outputs[j].what, outputs[j].path, o.what, o.path);
  }
}

AtomicFile::AtomicFile(const std::string& path, std::string_view what) : path_(path), what_(what) {
  NUMATTN_CHECK(!path.empty(), "{}: empty output path", what);
  const fs::path target = follow_symlinks(path, what);
  target_ = target.string();
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  const bool exists = fs::exists(st);
  NUMATTN_CHECK(!exists || !fs::is_directory(st), "cannot write {} '{}': it is a directory", what,
                path);
  // Renaming over a device or FIFO would replace it (e.g. /dev/null) instead of writing to it.
  NUMATTN_CHECK(!exists || fs::is_regular_file(st),
                "cannot write {} '{}': it exists and is not a regular file (a device, FIFO or "
                "socket)",
                what, path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  NUMATTN_CHECK(fs::is_directory(dir, ec), "cannot write {} '{}': directory '{}' does not exist",
                what, path, dir.string());
  // Long names are cut so that the temporary's name stays within NAME_MAX (255).
  const std::string base = target.filename().string().substr(0, 160);
  for (int attempt = 0;; ++attempt) {
    temp_ = (dir / fmt::format(".{}{}{}.{}", base, kTempFileInfix, ::getpid(),
                               g_temp_counter.fetch_add(1)))
                .string();
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) break;
    const int err = errno;
    if (err == EEXIST && attempt < 100) continue;
    temp_.clear();
    throw Error(fmt::format("cannot write {} '{}': cannot create a temporary file in '{}': {}",
                            what, path, dir.string(), sys_error(err)));
  }
  struct stat old {};
  if (exists && ::stat(target_.c_str(), &old) == 0) {
    // Best effort: a file owned by someone else may refuse the chmod; contents matter more.
    (void)::fchmod(fd_, old.st_mode & 07777);
  }
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

void AtomicFile::write(const void* data, std::size_t n) {
  NUMATTN_CHECK(fd_ >= 0, "internal error: {} '{}' written after commit", what_, path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      discard();
      throw Error(
          fmt::format("error writing {} '{}': {} (the previous file, if any, is "
                      "unchanged)",
                      what_, path_, sys_error(err)));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  NUMATTN_CHECK(fd_ >= 0, "internal error: {} '{}' committed twice", what_, path_);
  auto fail = [&](const char* step, int err) {
    discard();
    throw Error(
        fmt::format("error writing {} '{}' ({}): {} (the previous file, if any, is "
                    "unchanged)",
                    what_, path_, step, sys_error(err)));
  };
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("rename", errno);
  temp_.clear();
  const fs::path target(target_);
  fsync_directory(target.has_parent_path() ? target.parent_path() : fs::path("."), what_, path_);
}

void write_file_atomically(const std::string& path,
                           const void* data,
                           std::size_t n,
                           std::string_view what) {
  AtomicFile f(path, what);
  f.write(data, n);
  f.commit();
}

}  // namespace numattn
