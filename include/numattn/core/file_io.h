/// @file file_io.h
/// Reading input files and writing output files without ever destroying data.
///
/// Inputs: `check_input_file` / `read_file` refuse, by name, a path that does not exist, is a
/// directory or another non-regular file, or cannot be read (with the system's reason).
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
#include <string>
#include <string_view>
#include <vector>

namespace numattn {

/// Throws `numattn::Error` naming `what` (e.g. "text file", "--q") and `path` unless `path` is
/// an existing regular file (after following symlinks) that this process can open for reading.
void check_input_file(const std::string& path, std::string_view what);

/// The whole content of a regular file; errors as `check_input_file`, plus read errors.
std::string read_file(const std::string& path, std::string_view what);

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
