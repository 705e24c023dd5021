// ds/range.h: NVTX ranges for kernels/ and models/ code (header only).
//
//   DS_RANGE_PUSH("attention");  ... launches ...  DS_RANGE_POP();
//
// The macros call NVTX3 (header-only, linked through CUDA::nvtx3). Without an NVTX injection
// library, which Nsight Systems or NVTX_INJECTION64_PATH=<libcupti.so> supplies at run time, the
// first call finds none and every later call is a jump to an empty function: nothing is recorded
// and nothing is allocated, so the macros can stay in hot code. Building with -DDS_NO_NVTX
// compiles them to nothing at all.
//
// Names must be string literals or strings that outlive the call (NVTX copies them only when a
// tool is attached). Pushes and pops must balance on each thread. The profiler's own phase ranges
// (prefill, draft_extend, draft_step_<k>, verify, accept, sample) come from ds/trace.h; ranges
// pushed here nest inside them in an nsys timeline.
#ifndef DS_RANGE_H
#define DS_RANGE_H

#ifdef DS_NO_NVTX

#define DS_RANGE_PUSH(name) ((void)0)
#define DS_RANGE_POP() ((void)0)

#else

#include <nvtx3/nvToolsExt.h>

#define DS_RANGE_PUSH(name) ((void)nvtxRangePushA(name))
#define DS_RANGE_POP() ((void)nvtxRangePop())

#endif // DS_NO_NVTX

#endif // DS_RANGE_H
