/// @file file_io.h
/// Reading input files and writing output files without ever destroying data.
///
/// Inputs: `InputFile` (and `check_input_file` / `read_file` over it) refuse, by name, a path
/// that is empty, does not exist, is a directory or another non-regular file (device, FIFO,
/// socket), is larger than the bound of its kind (`InputLimit`), or cannot be read (with the
/// system's reason), all before a byte is read.
///
/// Outputs: every file numattn writes goes through `AtomicFile` (or `write_file_atomically`).
/// The bytes go to a temporary file in the target's own directory, named
///
///     .<target file name>.numattn-tmp.<pid>.<n>      (glob: `.*.numattn-tmp.*`)
///
/// which is flushed and fsync'ed, then renamed over the target, and the directory is fsync'ed.
/// Any reader therefore sees either the previous target or the complete new file: an error,
/// an exception, a full disk or a kill leaves the previous target byte-identical. On error or
/// exception the temporary is removed; only a process killed outright (SIGKILL, power loss)
/// can leave one behind, and such leftovers can be deleted whenever no numattn is writing.
/// - A target that is a symlink: the file it points to is replaced and the link is kept.
/// - Permissions: an existing target keeps its mode; a new file gets 0666 & ~umask, as with
///   `std::ofstream`.
/// - A target that is a directory or whose directory does not exist is refused by name.
///
/// `check_outputs_distinct` is the other half of "never destroy an input": each command
/// calls it with its output and input paths before doing any work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace numattn {

/// How large an input of one kind may be. The bound is checked against the file's size from
/// stat() before a byte is read, and again while reading (a file that grows, or one that
/// reports size 0 as /proc files do, cannot exceed it either).
struct InputLimit {
  std::string_view kind;    ///< for messages: "a JSON document"
  std::uint64_t max_bytes;  ///< the largest size accepted
};
/// JSON that numattn reads (capture manifests): small by construction.
inline constexpr InputLimit kJsonInput{"a JSON document", std::uint64_t{64} << 20};
/// Text a model reads (`--text`, `--calib`): the whole file is held in memory and tokenized.
inline constexpr InputLimit kTextInput{"a text file", std::uint64_t{4} << 30};
/// Formats whose header states their size and whose readers check it against the file's
/// (.npy, GGUF): no bound of the kind; the readers check memory or address space instead.
inline constexpr InputLimit kSizedByHeader{"a file", ~std::uint64_t{0}};

/// An input file, opened only after it is known to be one: every file numattn reads goes
/// through here (or through `read_file` / `check_input_file`, which use it).
///
/// The path is stat()ed first (following symlinks) and refused, by `what` and `path`, when it
/// is empty, does not exist, is a directory, or is not a regular file (a character or block
/// device such as /dev/zero, a FIFO, a socket): nothing but a regular file is ever opened, so a
/// FIFO cannot block the open and a device cannot be read without end. A size above
/// `limit.max_bytes` is refused with the size and the bound. The open itself is non-blocking
/// and the opened descriptor is checked to be the same regular file (a path swapped between
/// the stat and the open is refused). Errors are `numattn::Error`.
class InputFile {
 public:
  InputFile(const std::string& path, std::string_view what, InputLimit limit = kSizedByHeader);
  ~InputFile();
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&&) = delete;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  /// The size stat() gave when the file was opened.
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads exactly `n` bytes at `offset`; a short read (the file shrank) or an I/O error throws,
  /// naming the file.
  void read_at(void* dst, std::size_t n, std::uint64_t offset) const;
  /// The whole file, at most the limit's bytes even if it grew since the stat; the memory it
  /// needs is checked first (core/memory.h).
  std::string read_all() const;
  /// Refuses a file larger than this process can map (`RLIMIT_AS`, or the width of size_t),
  /// naming both numbers; for readers that mmap the whole file (GGUF).
  void check_mappable() const;

 private:
  std::string path_, what_;
  InputLimit limit_;
  std::uint64_t size_ = 0;
  int fd_ = -1;
};

/// Throws `numattn::Error` naming `what` (e.g. "text file", "--q") and `path` unless `path` is
/// an existing regular file (after following symlinks) within `limit` that this process can
/// open for reading (see InputFile).
void check_input_file(const std::string& path,
                      std::string_view what,
                      InputLimit limit = kSizedByHeader);

/// The whole content of a regular file within `limit`; errors as `InputFile`, plus read errors.
std::string read_file(const std::string& path,
                      std::string_view what,
                      InputLimit limit = kTextInput);

/// True when `a` and `b` name the same file: the same inode when both exist (so hard links,
/// symlinks and `./x`-style spellings match), else the same path once symlinks in the existing
/// part are resolved and `.`/`..` are removed.
bool same_file(const std::string& a, const std::string& b);

/// A path and the name it has for the user, e.g. {"--out", "o.npy"} or {"--model", "m.gguf"}.
struct NamedPath {
  std::string what;
  std::string path;
};

/// Throws `numattn::Error` when an output is the same file (`same_file`) as an input or as
/// another output, naming both flags and paths. Empty paths are ignored.
void check_outputs_distinct(const std::vector<NamedPath>& outputs,
                            const std::vector<NamedPath>& inputs);

/// What an output path is to name.
enum class OutputKind {
  kFile,       ///< a file, written atomically (its directory must exist)
  kDirectory,  ///< a directory, created with its parents when missing
};

/// Throws `numattn::Error` naming `what` (e.g. "--out") and `path` when `path` cannot be the
/// output asked for, before any work is done: an empty path (which would otherwise mean the
/// current directory); for a file, an existing directory, a path ending in '/', an existing
/// device, FIFO or socket, or a directory part that does not exist or is not a directory; for a
/// directory, an existing path that is not a directory (also through a symlink), or a part of
/// it that is a file. Whether it is also an input is `check_outputs_distinct`'s question.
void check_output_path(const std::string& path, std::string_view what, OutputKind kind);

/// The infix of every temporary file name (see the file comment).
inline constexpr std::string_view kTempFileInfix = ".numattn-tmp.";

/// A file written atomically: construct, `write` any number of times, `commit`. Destroying an
/// uncommitted AtomicFile (error, exception) removes the temporary and leaves the target as it
/// was. All errors throw `numattn::Error` naming `what` and the target path, with the system's
/// reason (e.g. "No space left on device").
class AtomicFile {
 public:
  /// Creates the temporary next to `path`. `what` describes the file in messages
  /// (e.g. "GGUF file", ".npy file").
  AtomicFile(const std::string& path, std::string_view what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// Flushes and fsyncs the temporary, renames it over the target, fsyncs the directory.
  /// After a successful commit further writes are errors.
  void commit();

  /// The file that is replaced (the target after following symlinks).
  const std::string& target() const { return target_; }
  /// The temporary being written (empty once committed or removed).
  const std::string& temp_path() const { return temp_; }

 private:
  void discard() noexcept;

  std::string path_, target_, temp_, what_;
  int fd_ = -1;
};

/// `AtomicFile` for one buffer.
void write_file_atomically(const std::string& path,
                           const void* data,
                           std::size_t n,
                           std::string_view what);

}  // namespace numattn
