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

#include <stdint.h>
#include <string.h>

// The float whose IEEE binary32 bits are u, and the reverse (no aliasing tricks on the host).
DS_HD float ds_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

DS_HD uint32_t ds_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

#endif // DS_HD_H
