/// @file comm.h
/// The dist layer's communicator: the few MPI operations that context-parallel attention and
/// distributed evaluation need, behind an interface that never exposes <mpi.h>.
///
/// Two implementations: the MPI one (src/dist/mpi/, compiled when CMake finds MPI,
/// `NUMATTN_MPI`), wrapping MPI_COMM_WORLD, and a one-rank communicator used everywhere else
/// (no MPI build, or a process not started by `mpirun`). Code written against `Comm` runs
/// unchanged on one rank, which is how the registry-wide tests exercise the dist methods.
///
/// Threading: MPI is initialised with MPI_THREAD_FUNNELED; only the thread that called `world()`
/// first may communicate (numattn's `parallel_for` workers never do).
///
/// Failure rule (docs/distributed.md): an error that every rank can see at the same point is
/// agreed on with `agree` (every rank throws `AgreedError`, exits with the message, and MPI
/// finalises normally); any other exception inside a collective section goes to `abort_job`,
/// which prints it and calls MPI_Abort, so that no rank is left waiting for a message that will
/// never come.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numattn/core/error.h"

namespace numattn::dist {

enum class ReduceOp { kSum, kMax, kMin };

/// A communicator of `size()` ranks. Sizes are in bytes; one message or one rank's share of a
/// collective is limited to 2^31 − 1 bytes (MPI's `int` counts): larger ones raise `Error`.
class Comm {
 public:
  using Request = std::int64_t;  ///< handle of a non-blocking operation, consumed by `wait`

  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi" or "self".
  virtual const char* kind() const = 0;

  /// Non-blocking point-to-point (MPI_Isend / MPI_Irecv). The buffer must stay valid and
  /// untouched (send: unmodified) until `wait` returns.
  virtual Request isend(const void* buf, std::size_t bytes, int dest, int tag) = 0;
  virtual Request irecv(void* buf, std::size_t bytes, int src, int tag) = 0;
  /// Completes a request; returns the seconds spent blocked in it.
  virtual double wait(Request r) = 0;

  /// MPI_Alltoallv on bytes: `send_bytes[r]` bytes from `send + send_displs[r]` go to rank r,
  /// rank r's `recv_bytes[r]` bytes land at `recv + recv_displs[r]`.
  virtual void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                         const std::vector<std::size_t>& send_displs, void* recv,
                         const std::vector<std::size_t>& recv_bytes,
                         const std::vector<std::size_t>& recv_displs) = 0;
  /// MPI_Gatherv to `root`: rank r's `bytes` land at `recv + displs[r]` on the root (`recv`,
  /// `recv_bytes` and `displs` are read on the root only).
  virtual void gatherv(const void* send, std::size_t bytes, void* recv,
                       const std::vector<std::size_t>& recv_bytes,
                       const std::vector<std::size_t>& displs, int root) = 0;
  /// In-place MPI_Allreduce of `n` doubles / int64s.
  virtual void allreduce(double* x, int n, ReduceOp op) = 0;
  virtual void allreduce(std::int64_t* x, int n, ReduceOp op) = 0;
  /// MPI_Bcast of `bytes` from `root`.
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Ends every rank of the job with `code` (MPI_Abort); returns only on the one-rank
  /// communicator, where it calls std::exit.
  [[noreturn]] virtual void abort(int code) = 0;
};

/// Whether this build has the MPI communicator.
bool mpi_built();
/// Whether this process was started by an MPI launcher (Open MPI's mpirun sets
/// OMPI_COMM_WORLD_SIZE; PMI/PMIx launchers set PMI_SIZE or PMIX_RANK).
bool launched_by_mpi();

/// The process-wide communicator: MPI_COMM_WORLD when MPI is built and the process was
/// launched by mpirun (initialised on the first call, finalised at exit), else the one-rank
/// communicator. Throws `Error` when launched by mpirun with a size > 1 in a build without MPI
/// (every rank would silently compute the whole problem alone).
Comm& world();
/// The one-rank communicator (for tests and explicit single-process runs).
Comm& self_comm();

/// Thrown on every rank by `agree` when some rank failed: `what()` names the lowest failing
/// rank and its message.
class AgreedError : public Error {
 public:
  using Error::Error;
};

/// Collective: every rank passes its local failure message ("" = no failure). When any rank
/// failed, every rank throws `AgreedError("rank R: <message of rank R>")` for the lowest such R.
/// Cost: one allreduce of an int64 and, on failure, one broadcast of the message.
void agree(Comm& comm, const std::string& local_error);

/// Runs `fn` on this rank and agrees on its outcome: an exception it throws (numattn::Error or
/// std::exception) becomes that rank's failure in `agree`, so every rank throws `AgreedError`.
/// For local work before a collective (reading a shard, checking inputs), never for work that
/// communicates.
template <class Fn>
void agree_on(Comm& comm, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  agree(comm, err);
}

/// Prints "error: rank R: <what>" on stderr and ends the whole job (`Comm::abort(1)`): for an
/// exception inside a communicating section, where the other ranks may be blocked.
[[noreturn]] void abort_job(Comm& comm, const std::string& what);

/// Runs `fn`, a section that communicates: `AgreedError` passes through (every rank has it);
/// any other exception ends the job through `abort_job` when `comm.size() > 1`, and passes
/// through on one rank.
template <class Fn>
void collective_section(Comm& comm, Fn&& fn) {
  try {
    fn();
  } catch (const AgreedError&) {
    throw;
  } catch (const std::exception& e) {
    if (comm.size() > 1) abort_job(comm, e.what());
    throw;
  }
}

}  // namespace numattn::dist
