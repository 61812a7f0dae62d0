// The MPI communicator (MPI_COMM_WORLD) and world() in builds with MPI. The only file that
// includes <mpi.h>.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "numattn/dist/comm.h"

namespace numattn::dist {

namespace {

int count_of(std::size_t bytes, const char* what) {
  NUMATTN_CHECK(bytes <= static_cast<std::size_t>(INT_MAX),
                "{}: {} bytes is beyond MPI's 2^31-1 per message; use more ranks or a smaller "
                "problem per rank",
                what, bytes);
  return static_cast<int>(bytes);
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("{} failed: {}", what, std::string(msg, static_cast<std::size_t>(len))));
}

std::vector<int> counts_of(const std::vector<std::size_t>& v, const char* what) {
  std::vector<int> c(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) c[i] = count_of(v[i], what);
  return c;
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes (turned into numattn::Error) instead of killing the job
    // before the message could say which rank and what.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }

  Request isend(const void* buf, std::size_t bytes, int dest, int tag) override {
    MPI_Request r;
    check_mpi(MPI_Isend(buf, count_of(bytes, "MPI_Isend"), MPI_BYTE, dest, tag, MPI_COMM_WORLD, &r),
              "MPI_Isend");
    return store(r);
  }
  Request irecv(void* buf, std::size_t bytes, int src, int tag) override {
    MPI_Request r;
    check_mpi(MPI_Irecv(buf, count_of(bytes, "MPI_Irecv"), MPI_BYTE, src, tag, MPI_COMM_WORLD, &r),
              "MPI_Irecv");
    return store(r);
  }
  double wait(Request id) override {
    auto it = pending_.find(id);
    NUMATTN_CHECK(it != pending_.end(), "wait on an unknown or completed request {}", id);
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pending_.erase(it);
    check_mpi(rc, "MPI_Wait");
    return s;
  }
  void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_displs, void* recv,
                 const std::vector<std::size_t>& recv_bytes,
                 const std::vector<std::size_t>& recv_displs) override {
    const auto sc = counts_of(send_bytes, "MPI_Alltoallv"), sd = counts_of(send_displs, "MPI_Alltoallv"),
               rc = counts_of(recv_bytes, "MPI_Alltoallv"), rd = counts_of(recv_displs, "MPI_Alltoallv");
    check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE,
                            MPI_COMM_WORLD),
              "MPI_Alltoallv");
  }
  void gatherv(const void* send, std::size_t bytes, void* recv, const std::vector<std::size_t>& recv_bytes,
               const std::vector<std::size_t>& displs, int root) override {
    std::vector<int> rc, rd;
    if (rank_ == root) rc = counts_of(recv_bytes, "MPI_Gatherv"), rd = counts_of(displs, "MPI_Gatherv");
    check_mpi(MPI_Gatherv(send, count_of(bytes, "MPI_Gatherv"), MPI_BYTE, recv, rc.data(), rd.data(),
                          MPI_BYTE, root, MPI_COMM_WORLD),
              "MPI_Gatherv");
  }
  void allreduce(double* x, int n, ReduceOp op) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, mpi_op(op), MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void allreduce(std::int64_t* x, int n, ReduceOp op) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_INT64_T, mpi_op(op), MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void broadcast(void* buf, std::size_t bytes, int root) override {
    check_mpi(MPI_Bcast(buf, count_of(bytes, "MPI_Bcast"), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this is for the compiler
  }

 private:
  static MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
      case ReduceOp::kSum: return MPI_SUM;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kMin: return MPI_MIN;
    }
    return MPI_SUM;
  }
  Request store(MPI_Request r) {
    pending_.emplace(next_, r);
    return next_++;
  }
  int rank_ = 0, size_ = 1;
  Request next_ = 1;
  std::unordered_map<Request, MPI_Request> pending_;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool mpi_built() { return true; }

Comm& world() {
  if (!launched_by_mpi()) return self_comm();
  static MpiComm* comm = [] {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit(finalize_at_exit);
    }
    return new MpiComm();  // lives until exit, after MPI_Finalize (it holds no MPI resource)
  }();
  return *comm;
}

}  // namespace numattn::dist
