// main() of the MPI tests: every rank runs every test (the tests are collective), rank 0
// prints, and the program fails when any rank failed. Tests use EXPECT_* only, so that a
// failure on one rank never makes it skip a collective the others are in (that would hang
// until ctest's timeout).
#include <gtest/gtest.h>

#include <cstdio>

#include "numattn/dist/comm.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  numattn::dist::Comm& comm = numattn::dist::world();  // MPI_Init under mpirun
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (comm.rank() != 0) delete listeners.Release(listeners.default_result_printer());
  std::int64_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  comm.allreduce(&failed, 1, numattn::dist::ReduceOp::kMax);
  if (comm.rank() == 0) std::printf("%s on %d ranks\n", failed ? "FAILED" : "PASSED", comm.size());
  return static_cast<int>(failed);
}
