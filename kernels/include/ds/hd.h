// ds/hd.h: DS_HD, the qualifier of small inline functions shared by host C and CUDA device code.
//
// Headers that describe a data format (bf16.h, mxfp4.h) define their decoders once with DS_HD so
// that the CPU reference, the CUDA kernels and the tests read the very same definitions.
#ifndef DS_HD_H
#define DS_HD_H

#if defined(__CUDACC__)
#define DS_HD static __host__ __device__ __forceinline__
#else
#define DS_HD static inline
#endif

#endif // DS_HD_H
