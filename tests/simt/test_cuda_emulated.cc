// The GPU test suite (tests/engine/backend/test_cuda.cc), unchanged, against the CUDA backend on the
// emulated device: CI runs it on every change, so the backend's host code (streams, events,
// copies, cuBLAS arguments, launches) is checked before any real GPU sees it.
#include "tests/simt/emulated_backend.h"

#define create_backend emulated_create_backend
#define cuda_available emulated_cuda_available
#include "tests/engine/backend/test_cuda.cc"
