// The one-rank communicator, the agreement helpers, and world() in builds without MPI.
#include "numattn/dist/comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace numattn::dist {

namespace {

/// One rank: collectives are copies, and there is no peer to send to.
class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "self"; }
  Request isend(const void*, std::size_t, int dest, int) override {
    throw Error(fmt::format("the one-rank communicator has no rank {} to send to", dest));
  }
  Request irecv(void*, std::size_t, int src, int) override {
    throw Error(fmt::format("the one-rank communicator has no rank {} to receive from", src));
  }
  double wait(Request) override { return 0; }
  void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_displs, void* recv,
                 const std::vector<std::size_t>& recv_bytes,
                 const std::vector<std::size_t>& recv_displs) override {
    NUMATTN_CHECK(send_bytes.size() == 1 && recv_bytes.size() == 1 && send_bytes[0] == recv_bytes[0],
                  "alltoallv on one rank: send and receive sizes differ");
    if (send_bytes[0] > 0)
      std::memmove(static_cast<char*>(recv) + recv_displs[0],
                   static_cast<const char*>(send) + send_displs[0], send_bytes[0]);
  }
  void gatherv(const void* send, std::size_t bytes, void* recv, const std::vector<std::size_t>& recv_bytes,
               const std::vector<std::size_t>& displs, int) override {
    NUMATTN_CHECK(recv_bytes.size() == 1 && recv_bytes[0] == bytes, "gatherv on one rank: sizes differ");
    if (bytes > 0) std::memmove(static_cast<char*>(recv) + displs[0], send, bytes);
  }
  void allreduce(double*, int, ReduceOp) override {}
  void allreduce(std::int64_t*, int, ReduceOp) override {}
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

Comm& self_comm() {
  static SelfComm c;
  return c;
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

#ifndef NUMATTN_HAS_MPI
bool mpi_built() { return false; }

Comm& world() {
  // A job of several ranks in a build without MPI would have every rank compute the whole
  // problem alone and print it R times: refuse instead.
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!n) n = std::getenv("PMI_SIZE");
  NUMATTN_CHECK(!n || std::atoi(n) <= 1,
                "started by mpirun with {} ranks, but this numattn was built without MPI "
                "(reconfigure with -DNUMATTN_MPI=ON after scripts/setup.sh installs Open MPI)",
                n ? n : "?");
  return self_comm();
}
#endif

void agree(Comm& comm, const std::string& local_error) {
  // The lowest failing rank wins, so every rank reports the same message.
  std::int64_t first = local_error.empty() ? comm.size() : comm.rank();
  comm.allreduce(&first, 1, ReduceOp::kMin);
  if (first >= comm.size()) return;
  const int root = static_cast<int>(first);
  std::int64_t len = comm.rank() == root ? static_cast<std::int64_t>(local_error.size()) : 0;
  comm.broadcast(&len, sizeof len, root);
  std::string msg = comm.rank() == root ? local_error : std::string(static_cast<std::size_t>(len), ' ');
  if (len > 0) comm.broadcast(msg.data(), static_cast<std::size_t>(len), root);
  throw AgreedError(comm.size() > 1 ? fmt::format("rank {}: {}", root, msg) : msg);
}

void abort_job(Comm& comm, const std::string& what) {
  std::fprintf(stderr, "error: rank %d: %s\n", comm.rank(), what.c_str());
  std::fflush(stderr);
  comm.abort(1);
}

}  // namespace numattn::dist
