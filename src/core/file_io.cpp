#include "numattn/core/file_io.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include "numattn/core/error.h"
#include "numattn/core/memory.h"

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

// What a non-regular file is, for the message that refuses it.
std::string_view file_type_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// " (a symbolic link to '/dev/zero')" when `path` is a link, so that the refusal of a link to a
// device names what the link hides.
std::string link_note(const std::string& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return "";
  const fs::path t = fs::weakly_canonical(path, ec);
  return ec ? std::string(" (a symbolic link)")
            : fmt::format(" (a symbolic link to '{}')", t.string());
}

}  // namespace

InputFile::InputFile(const std::string& path, std::string_view what, InputLimit limit)
    : path_(path), what_(what), limit_(limit) {
  NUMATTN_CHECK(!path.empty(), "{}: empty path: give the path of a file", what);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    NUMATTN_CHECK(err != ENOENT, "{} '{}' does not exist{}: cannot open it; check the path", what,
                  path, link_note(path));
    throw Error(fmt::format("cannot read {} '{}': {}", what, path, sys_error(err)));
  }
  NUMATTN_CHECK(!S_ISDIR(st.st_mode), "{} '{}' is a directory, not a file", what, path);
  // Never opened: a FIFO would block the open, a device could be read without end.
  NUMATTN_CHECK(S_ISREG(st.st_mode),
                "{} '{}'{} is {}, not a regular file: numattn reads inputs only from regular "
                "files; copy the data into one",
                what, path, link_note(path), file_type_name(st.st_mode));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  NUMATTN_CHECK(size <= limit.max_bytes,
                "{} '{}' is {} bytes ({}), more than {} may have ({}): is it the intended file?",
                what, path, size, format_bytes(size), limit.kind, format_bytes(limit.max_bytes));
  // Non-blocking, so that a path swapped for a FIFO after the stat cannot hang the open.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  NUMATTN_CHECK(fd_ >= 0, "cannot read {} '{}': {}", what, path, sys_error(errno));
  struct stat fst {};
  if (::fstat(fd_, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_dev != st.st_dev ||
      fst.st_ino != st.st_ino) {
    ::close(fd_);
    fd_ = -1;
    throw Error(fmt::format("{} '{}' changed while it was being opened; run again", what, path));
  }
  size_ = size;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& o) noexcept
    : path_(std::move(o.path_)),
      what_(std::move(o.what_)),
      limit_(o.limit_),
      size_(o.size_),
      fd_(o.fd_) {
  o.fd_ = -1;
}

void InputFile::read_at(void* dst, std::size_t n, std::uint64_t offset) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    NUMATTN_CHECK(r >= 0, "error reading {} '{}': {}", what_, path_, sys_error(errno));
    NUMATTN_CHECK(
        r > 0,
        "error reading {} '{}': the file ended at byte {} (was it truncated while being read?)",
        what_, path_, offset);
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

std::string InputFile::read_all() const {
  check_memory(size_, fmt::format("reading {} '{}'", what_, path_));
  std::string out;
  out.reserve(static_cast<std::size_t>(size_));
  char buf[1 << 16];
  for (std::uint64_t at = 0;;) {
    const ssize_t n = ::pread(fd_, buf, sizeof buf, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    NUMATTN_CHECK(n >= 0, "error reading {} '{}': {}", what_, path_, sys_error(errno));
    if (n == 0) break;
    at += static_cast<std::uint64_t>(n);
    // The stat's size is checked; a file that grows while it is read is held to the same bound.
    NUMATTN_CHECK(at <= limit_.max_bytes,
                  "{} '{}' grew past {} bytes ({}) while being read, more than {} may have", what_,
                  path_, limit_.max_bytes, format_bytes(limit_.max_bytes), limit_.kind);
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

void InputFile::check_mappable() const {
  NUMATTN_CHECK(size_ <= static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()),
                "{} '{}' is {} bytes, more than this process can address", what_, path_, size_);
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    NUMATTN_CHECK(size_ <= static_cast<std::uint64_t>(rl.rlim_cur),
                  "{} '{}' is {} ({} bytes), more than this process may map: its address space is "
                  "limited to {} (RLIMIT_AS; raise it with `ulimit -v`)",
                  what_, path_, format_bytes(size_), size_,
                  format_bytes(static_cast<std::uint64_t>(rl.rlim_cur)));
}

void check_input_file(const std::string& path, std::string_view what, InputLimit limit) {
  (void)InputFile(path, what, limit);
}

std::string read_file(const std::string& path, std::string_view what, InputLimit limit) {
  return InputFile(path, what, limit).read_all();
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

void check_output_path(const std::string& path, std::string_view what, OutputKind kind) {
  NUMATTN_CHECK(!path.empty(),
                "{}: empty path: give a {} (an empty one would write into the current directory)",
                what, kind == OutputKind::kFile ? "file name" : "directory");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  const bool exists = fs::exists(st);
  if (kind == OutputKind::kDirectory) {
    NUMATTN_CHECK(!exists || fs::is_directory(st),
                  "{}: '{}'{} exists and is not a directory; give a directory", what, path,
                  link_note(path));
    // The nearest existing ancestor must be a directory, or the parents cannot be created.
    for (fs::path p = fs::absolute(path, ec).parent_path(); !exists && !p.empty();
         p = p.parent_path()) {
      const fs::file_status ps = fs::status(p, ec);
      if (!fs::exists(ps)) {
        if (p == p.parent_path()) break;
        continue;
      }
      NUMATTN_CHECK(fs::is_directory(ps),
                    "{}: '{}' cannot be created: '{}' is a file, not a directory", what, path,
                    p.string());
      break;
    }
    return;
  }
  NUMATTN_CHECK(!exists || !fs::is_directory(st), "{}: '{}'{} is a directory; give a file name",
                what, path, link_note(path));
  NUMATTN_CHECK(path.back() != '/', "{}: '{}' names a directory (it ends in '/'); give a file name",
                what, path);
  NUMATTN_CHECK(!exists || fs::is_regular_file(st),
                "{}: '{}'{} exists and is {}: numattn writes regular files only", what, path,
                link_note(path), [&] {
                  struct stat s {};
                  return ::stat(path.c_str(), &s) == 0 ? file_type_name(s.st_mode)
                                                       : "not a regular file";
                }());
  const fs::path target = follow_symlinks(path, what);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::file_status ds = fs::status(dir, ec);
  NUMATTN_CHECK(fs::exists(ds), "{}: '{}': the directory '{}' does not exist; create it first",
                what, path, dir.string());
  NUMATTN_CHECK(fs::is_directory(ds), "{}: '{}': '{}' is a file, not a directory", what, path,
                dir.string());
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
