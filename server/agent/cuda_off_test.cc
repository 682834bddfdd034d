// Stands in for copier/cuda/cuda_copier_test.cc in builds without CUDA
// (bazel --define=cairn_cuda=off): there is nothing to test.
#include "gtest/gtest.h"

TEST(CudaCopierTest, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
